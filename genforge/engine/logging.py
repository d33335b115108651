"""Run logging: metrics.jsonl (always), TensorBoard (when installed), wandb (opt-in), PNG sample grids."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from genforge.config.base import LogConfig
from genforge.data.images import to_uint8


def image_grid(images: Tensor, nrow: int | None = None, pad: int = 2) -> np.ndarray:
    """[B, C, H, W] in [-1, 1] -> one uint8 [rows·(H+pad)+pad, cols·(W+pad)+pad, 3] grid (vectorised)."""
    images = images.detach().cpu()
    b, c, h, w = images.shape
    if c == 1:
        images = images.expand(b, 3, h, w)
    pixels = to_uint8(images[:, :3]).permute(0, 2, 3, 1).numpy()
    cols = nrow or math.ceil(math.sqrt(b))
    rows = math.ceil(b / cols)
    grid = np.full((rows, cols, h + pad, w + pad, 3), 255, np.uint8)
    flat = grid.reshape(rows * cols, h + pad, w + pad, 3)
    flat[:b, pad:, pad:] = pixels
    out = grid.transpose(0, 2, 1, 3, 4).reshape(rows * (h + pad), cols * (w + pad), 3)
    return np.pad(out, ((0, pad), (0, pad), (0, 0)), constant_values=255)


def save_grid(images: Tensor, path: Path, nrow: int | None = None, captions: list[str] | None = None) -> Path:
    """Write a PNG grid of images in [-1, 1]; with `captions` (the prompts), also `<path>.txt`, one per cell in
    reading order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image_grid(images, nrow)).save(path)
    if captions is not None:
        path.with_suffix(".txt").write_text("".join(f"{c}\n" for c in captions), encoding="utf-8")
    return path


class RunLogger:
    """Writes one JSON object per logged step; mirrors scalars and images to TensorBoard / wandb."""

    def __init__(self, run_dir: Path, cfg: LogConfig, config_dict: dict[str, Any] | None = None,
                 resume_step: int = 0) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.tb = None
        self.wandb = None
        self._truncate_after(resume_step)  # a run killed before its first checkpoint resumes at 0
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step: TensorBoard drops what an interrupted run logged past the checkpoint
                self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=resume_step)
            except ImportError:
                print("genforge: tensorboard not installed (pip install 'genforge[log]'); logging to "
                      "metrics.jsonl only", file=sys.stderr)
        if cfg.wandb:
            import wandb  # opt-in; fails loudly when requested and missing

            self.wandb = wandb.init(project=cfg.wandb_project, dir=str(run_dir), config=config_dict,
                                    name=run_dir.name, resume="allow")

    def _truncate_after(self, step: int) -> None:
        """Drop records past `step` (logged by an interrupted run after its last checkpoint): a resumed run
        logs them again, so the file holds each step once. Torn last lines (kill -9) go too."""
        if not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("step", 0) <= step:
                kept.append(line + "\n")
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(kept))
        tmp.replace(self.path)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        record = {"step": step, "time": round(time.time(), 3), **values}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log(values, step=step)

    def histogram(self, step: int, tag: str, counts: list[int]) -> None:
        """A histogram of integer values given as the count of each value 0..len(counts)-1 (e.g. code ids)."""
        values = np.arange(len(counts), dtype=np.float64)
        weights = np.asarray(counts, dtype=np.float64)
        if self.tb and weights.sum() > 0:
            self.tb.add_histogram_raw(tag, min=0, max=len(counts) - 1, num=int(weights.sum()),
                                      sum=float(values @ weights), sum_squares=float(values**2 @ weights),
                                      bucket_limits=(values + 0.5).tolist(), bucket_counts=counts, global_step=step)
        if self.wandb:
            import wandb

            self.wandb.log({tag: wandb.Histogram(np_histogram=(weights, np.arange(len(counts) + 1) - 0.5))},
                           step=step)

    def image(self, step: int, tag: str, grid_path: Path) -> None:
        if self.tb:
            self.tb.add_image(tag, np.asarray(Image.open(grid_path)), step, dataformats="HWC")
        if self.wandb:
            import wandb

            self.wandb.log({tag: wandb.Image(str(grid_path))}, step=step)

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()
