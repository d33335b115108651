"""Preview writers: sample grids written into a run (`samples/step-*.png`) and by `genforge sample --out`. A writer
registers under the file suffix it writes and says which tensors it can show; `write_preview` picks one by the
path's suffix, `preview_suffix` the default for a tensor (image batches [B, C, H, W]: .png; clips [B, C, T, H, W]:
an animated grid, .gif, or .mp4 when asked)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image
from torch import Tensor

from genforge.core.config import ConfigError
from genforge.core.files import TMP_PREFIX, write_atomically
from genforge.core.registry import PREVIEW_WRITERS
from genforge.data.images import to_uint8
from genforge.data.video import write_video


@dataclass(frozen=True)
class PreviewWriter:
    """Writes a batch of outputs in [-1, 1] as one file: (outputs, path, images per row or None) -> None."""

    suffix: str
    accepts: Callable[[Tensor], bool]
    write: Callable[[Tensor, Path, int | None], None]


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


def _write_png(images: Tensor, path: Path, nrow: int | None) -> None:
    Image.fromarray(image_grid(images, nrow)).save(path)


def video_grid(videos: Tensor, nrow: int | None = None) -> np.ndarray:
    """Clips [B, C, T, H, W] in [-1, 1] -> uint8 frames [T, grid H, grid W, 3]: frame t is the grid of every clip's
    frame t."""
    return np.stack([image_grid(videos[:, :, t], nrow) for t in range(videos.shape[2])])


def _video_writer(fmt: str) -> Callable[[Tensor, Path, int | None], None]:
    def write(videos: Tensor, path: Path, nrow: int | None) -> None:
        write_video(video_grid(videos, nrow), path, VIDEO_PREVIEW_FPS, fmt)
    return write


VIDEO_PREVIEW_FPS = 8.0
PREVIEW_WRITERS.register(".png", PreviewWriter(".png", lambda x: x.ndim == 4, _write_png))
PREVIEW_WRITERS.register(".gif", PreviewWriter(".gif", lambda x: x.ndim == 5, _video_writer("gif")))
PREVIEW_WRITERS.register(".mp4", PreviewWriter(".mp4", lambda x: x.ndim == 5, _video_writer("mp4")))


def preview_suffix(outputs: Tensor) -> str:
    """The suffix of the first registered writer that can show `outputs`."""
    for suffix, writer in PREVIEW_WRITERS.items():
        if writer.accepts(outputs):
            return suffix
    raise ValueError(f"no preview writer shows outputs of shape {tuple(outputs.shape)}")


def write_preview(outputs: Tensor, path: Path, nrow: int | None = None, captions: list[str] | None = None) -> Path:
    """Write `outputs` (in [-1, 1]) with the writer of `path`'s suffix; with `captions` (the prompts), also
    `<path>.txt`, one per cell in reading order."""
    writer = PREVIEW_WRITERS.get(path.suffix.lower(), "--out suffix")
    if not writer.accepts(outputs):
        raise ConfigError(f"{path.name}: a {writer.suffix} file cannot show outputs of shape {tuple(outputs.shape)}; "
                          f"use {preview_suffix(outputs)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")  # a full disk leaves no torn or empty file behind
    try:
        writer.write(outputs, tmp, nrow)
        os.replace(tmp, path)
        if captions is not None:
            write_atomically(path.with_suffix(".txt"), "".join(f"{c}\n" for c in captions))
    finally:
        tmp.unlink(missing_ok=True)
    return path
