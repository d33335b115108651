"""Run logging: metrics.jsonl (always), TensorBoard (when installed), wandb (opt-in), sample previews, and what a
person reads: a progress bar on a terminal, plain step lines through Python logging anywhere else (a log file, a
cluster job), a closing summary."""

from __future__ import annotations

import datetime
import json
import re
import sys
from collections import Counter
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
import torch
from accelerate import Accelerator
from torch import Tensor
from tqdm.auto import tqdm

from genforge.core.config import ConfigError, LogConfig
from genforge.core.status import console
from genforge.core.task import Batch, Task
from genforge.data.previews import preview_suffix, write_preview


def duration(seconds: float) -> str:
    """h:mm:ss."""
    return str(datetime.timedelta(seconds=round(seconds)))


class StepLines:
    """One plain line per logged step when no progress bar is shown: step/total, loss, lr, samples/s and the
    time left at the pace since this run started."""

    def __init__(self, total: int, start_step: int) -> None:
        self.total, self.start_step, self.start = total, start_step, time.perf_counter()

    def line(self, step: int, values: dict[str, float]) -> str:
        done = step - self.start_step
        left = (time.perf_counter() - self.start) / max(done, 1) * (self.total - step)
        losses = " ".join(f"{k} {v:.4g}" for k, v in values.items() if k == "loss" or k.endswith("/loss"))
        return (f"step {step}/{self.total} {losses} lr {values.get('lr', 0.0):.3g} "
                f"{values.get('samples_per_s', 0.0):.1f} samples/s ETA {duration(left)}")


@dataclass
class StepLogs:
    """Per-step scalars kept on device between log steps (one host sync per log interval)."""

    values: dict[str, list[Tensor]] = field(default_factory=dict)

    def add(self, name: str, value: Tensor) -> None:
        self.values.setdefault(name, []).append(value.detach().float().reshape(()))

    def reduce(self, accelerator: Accelerator) -> dict[str, float]:
        if not self.values:
            return {}
        names = sorted(self.values)
        means = torch.stack([torch.stack(self.values[n]).mean() for n in names])
        means = accelerator.reduce(means, reduction="mean")
        self.values.clear()
        return dict(zip(names, means.tolist()))


@dataclass
class RunOutcome:
    """What a run's closing line reports: the last logged scalars, checkpoint and preview."""

    logged: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None
    samples: Path | None = None
    notes: list[str] = field(default_factory=list)  # about the data (images its metadata leaves out)

    def summary(self, run_dir: Path, total: int, first_step: int, step: int, seconds: float,
                last_eval: dict[str, Any]) -> str:
        """The closing line of a run: the steps trained and their wall time, the last losses, checkpoint, samples,
        evaluation and the notes about its data."""
        if step == first_step:
            return f"nothing to train: {run_dir} is at step {step} of {total}"
        parts = [f"trained steps {first_step + 1}-{step} of {total} in {duration(seconds)}"]
        losses = {k: v for k, v in self.logged.items() if k == "loss" or k.endswith("/loss")}
        if losses:
            parts.append("last " + ", ".join(f"{k} {v:.4g}" for k, v in losses.items()))
        if self.checkpoint is not None:
            parts.append(f"checkpoint {self.checkpoint}")
        if self.samples is not None:
            parts.append(f"samples {self.samples}")
        scores = {k: v for k, v in last_eval.items() if isinstance(v, float)}
        if scores:
            parts.append(f"evaluation at step {last_eval['step']}: "
                         + ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))
        return "; ".join(parts + self.notes)


class Progress:
    """The one progress display of every job (training, sampling, evaluation, encoding): a tqdm bar when stderr is a
    terminal (and `bar`, e.g. log.progress, allows one), else plain lines through `console()`: its own line each time
    another `every` units are done (default: a tenth of the total; 1000 when the total is unknown; `lines=False`:
    none, as training writes a richer line per logged step, `StepLines`), and `finish` logs a closing summary with
    the wall time. On several processes only rank 0 reports (`enabled`), counting its own share of the work.
    `initial`: units done before this process started (a resumed run's step)."""

    def __init__(self, desc: str, unit: str, total: int | None = None, every: int | None = None,
                 enabled: bool = True, processes: int = 1, initial: int = 0, bar: bool = True,
                 lines: bool = True) -> None:
        self.desc, self.unit, self.total, self.enabled, self.given_every = desc, unit, total, enabled, every
        self.processes, self.lines = processes, lines
        if processes > 1:
            desc = f"{desc} (rank 0 of {processes})"
        self.every = self._every()
        self.on_terminal = enabled and bar and sys.stderr.isatty()
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr,
                        disable=not self.on_terminal)
        self.desc = desc
        self.initial = self.done = initial
        self.start = time.perf_counter()

    def _every(self) -> int:
        return self.given_every or (max(1, -(-self.total // 10)) if self.total else 1000)

    def report(self, done: int, total: int | None = None) -> None:
        """`done` units finished so far, of `total` (when it is only known now)."""
        if total is not None and total != self.total:
            self.total = self.bar.total = total
            self.every = self._every()
        if done < self.done:  # went back (a run rolled back to its last checkpoint)
            self.bar.reset(total=self.total)
            self.bar.update(done)
        else:
            self.bar.update(done - self.done)
        crossed = done // self.every > self.done // self.every or (done == self.total and done > self.done)
        self.done = done
        if self.enabled and self.lines and not self.on_terminal and crossed:
            console().info(self.line())

    def show_values(self, values: dict[str, float]) -> None:
        """Values shown beside the bar on a terminal (a training run's loss, lr, samples/s)."""
        self.bar.set_postfix({k: f"{v:.4g}" for k, v in values.items()})

    def close(self) -> None:
        """Close the bar without a summary (a job that reports its own outcome)."""
        self.bar.close()

    def line(self) -> str:
        """'sampling 64/256 samples, 12.3 samples/s, ETA 0:00:15' (no ETA without a total); on several processes
        'sampling (rank 0 of 2) 64/128 samples, ...'."""
        seconds = time.perf_counter() - self.start
        rate = (self.done - self.initial) / max(seconds, 1e-9)
        of = f"/{self.total}" if self.total else ""
        left = f", ETA {duration((self.total - self.done) / max(rate, 1e-9))}" if self.total else ""
        return f"{self.desc} {self.done}{of} {self.unit}, {rate:.3g} {self.unit}/s{left}"

    def finish(self, done: str, details: str = "") -> float:
        """Close the bar and log the closing summary '`done` [on N processes] in h:mm:ss[: `details`]' (e.g.
        "evaluated 256 samples in 0:01:02: fid 12.3"); returns the seconds since the start."""
        self.bar.close()
        seconds = time.perf_counter() - self.start
        where = f" on {self.processes} processes" if self.processes > 1 else ""
        if self.enabled:
            console().info(f"{done}{where} in {duration(seconds)}" + (f": {details}" if details else ""))
        return seconds


def write_samples(task: Task, cond: Batch, outputs: Tensor, path: Path) -> Path:
    """What `task.preview` makes of `sample(cond)` = `outputs`, written by the preview writer of `path`'s suffix
    (none: the default writer for those outputs, e.g. .png for images), with a text model's prompts beside it."""
    grid, nrow = task.preview(cond, outputs)
    if not path.suffix:
        path = path.with_name(path.name + preview_suffix(grid))
    return write_preview(grid, path, nrow, captions=cond.get("text"))


def caption_slug(caption: str, limit: int = 100) -> str:
    """A file name stem for a caption: its words joined by '_' (any other character dropped), at most `limit`
    characters; "caption" when nothing is left."""
    return re.sub(r"\W+", "_", caption).strip("_")[:limit].rstrip("_") or "caption"


def write_per_caption(task: Task, cond: Batch, outputs: Tensor, folder: Path, suffix: str | None = None) -> list[Path]:
    """Each sample of `sample(cond)` = `outputs` as its own file in `folder`, named by the slug of its caption
    (phenaki-pytorch's sampled videos; a caption repeated: `_2`, `_3`, ...), of type `suffix` (None: the default for
    the outputs, e.g. .gif for clips). ConfigError when the samples have no captions."""
    captions = cond.get("text")
    if not captions:
        raise ConfigError("--out DIR writes one file per caption, and these samples have none (a class-conditional "
                          "or unconditional run); give --out FILE.png (or .gif, .mp4) for a grid")
    written, seen = [], Counter()
    for i, caption in enumerate(captions):
        one = Batch(**{k: v[i : i + 1] for k, v in cond.items()})
        grid, nrow = task.preview(one, outputs[i : i + 1])
        stem = caption_slug(caption)
        seen[stem] += 1
        name = stem if seen[stem] == 1 else f"{stem}_{seen[stem]}"
        written.append(write_preview(grid, folder / f"{name}{suffix or preview_suffix(grid)}", nrow))
    return written


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
                console().warning("tensorboard not installed (pip install 'genforge[log]'); logging to "
                                  "metrics.jsonl only")
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
        self._append(json.dumps(record) + "\n")
        if self.tb:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log(values, step=step)

    def event(self, step: int, kind: str, message: str) -> None:
        """A line of text in metrics.jsonl (e.g. a damaged checkpoint moved aside on resume)."""
        self._append(json.dumps({"step": step, "time": round(time.time(), 3), "event": kind, "message": message}) + "\n")

    def _append(self, line: str) -> None:
        """Append to metrics.jsonl; an OSError (a full disk) names the file."""
        try:
            with open(self.path, "a") as f:
                f.write(line)
        except OSError as err:
            raise OSError(err.errno, err.strerror, str(self.path)) from err

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
        """A preview file to TensorBoard (RGB; a GIF preview as its first frame) and to W&B (the file itself)."""
        if self.tb:
            with Image.open(grid_path) as preview:  # PNG (RGB) or GIF (palette)
                pixels = np.asarray(preview.convert("RGB"))  # [H, W, 3]
            self.tb.add_image(tag, pixels, step, dataformats="HWC")
        if self.wandb:
            import wandb

            self.wandb.log({tag: wandb.Image(str(grid_path))}, step=step)

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()
