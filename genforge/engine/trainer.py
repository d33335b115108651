"""The one training loop. It knows nothing about diffusion or tokens: a family is a `Task`.

Per optimizer step: for each phase of the task, `grad_accum` micro-batches forward + backward (gradient
sync only on the last), clip, a non-finite guard, optimizer and scheduler step; then EMA, and the
cadences (log, sample, eval, checkpoint). Built on Hugging Face accelerate for devices, mixed precision
and DDP; launch several processes with `accelerate launch` or `torchrun`.
"""

from __future__ import annotations

import json
import os
import math
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, broadcast_object_list
from safetensors.torch import load_file
from torch import Tensor
from tqdm.auto import tqdm

from genforge.config import RunConfig, to_yaml
from genforge.data.loader import SkipLog, StepBatchSampler, build_dataset, build_loader, data_info
from genforge.engine.checkpoint import CheckpointDir, load_state, save_state, save_tensors, step_dir_name
from genforge.engine.ema import EMA
from genforge.engine.logging import RunLogger, save_grid
from genforge.engine.optim import build_optimizer, build_scheduler
from genforge.engine.random import BatchRandom
from genforge.engine.task import Task


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many non-finite steps); the message says why."""


def resolve_run_dir(base: Path, fresh: bool) -> Path:
    """`base`, or with --fresh and an existing run there, the first free `base-1`, `base-2`, ..."""
    if not fresh or not (base / "checkpoints").exists():
        return base
    n = 1
    while (base.parent / f"{base.name}-{n}").exists():
        n += 1
    return base.parent / f"{base.name}-{n}"


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *[v for v in np_state[2:]]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


class Trainer:
    """Trains `cfg.model` on `cfg.data` into `run_dir`, resuming from its latest checkpoint."""

    def __init__(self, cfg: RunConfig, run_dir: Path, fresh: bool = False) -> None:
        self.cfg = cfg
        tc = cfg.train
        ddp = DistributedDataParallelKwargs(find_unused_parameters=False)
        # torchrun/accelerate launch without CUDA: accelerate joins the (gloo) process group only when told cpu=True
        multi_cpu = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()
        self.accelerator = Accelerator(mixed_precision=tc.precision, cpu=multi_cpu, kwargs_handlers=[ddp])
        acc = self.accelerator
        if acc.num_processes != int(os.environ.get("WORLD_SIZE", "1")):
            raise RuntimeError(f"launched with WORLD_SIZE={os.environ['WORLD_SIZE']} but accelerate joined "
                               f"{acc.num_processes} process(es); check the launcher's backend settings")
        chosen = [str(resolve_run_dir(Path(run_dir), fresh)) if acc.is_main_process else None]
        broadcast_object_list(chosen)
        self.run_dir = Path(chosen[0])
        self.checkpoints = CheckpointDir(self.run_dir / "checkpoints", keep_last=tc.keep_last)
        if acc.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        # Same initial weights on every rank; per-rank streams only where a task uses global RNG.
        random.seed(tc.seed)
        np.random.seed(tc.seed)
        torch.manual_seed(tc.seed)
        self.dataset = build_dataset(cfg.data, split="train")
        self.data_info = data_info(self.dataset, cfg.data)
        self.task: Task = cfg.model.build_task(cfg, self.data_info)
        if len(self.task.phases) > 1:
            ddp.find_unused_parameters = True
        self.task.to(acc.device)
        self.optimizers = {p: build_optimizer(self.task.parameters_for(p), tc, acc.device) for p in self.task.phases}
        self.schedulers = {p: build_scheduler(o, tc) for p, o in self.optimizers.items()}
        prepared = acc.prepare(self.task, *self.optimizers.values())
        self.model, prepared_optimizers = prepared[0], prepared[1:]
        self.optimizers = dict(zip(self.task.phases, prepared_optimizers))
        self.ema = EMA(self.task.ema_module(), tc.ema_decay, tc.ema_warmup, tc.ema_start)
        self.step = 0
        self.nonfinite_in_a_row = 0

    # ----------------------------------------------------------------------------------------- state
    def save_checkpoint(self) -> Path:
        """Every rank writes its RNG state; the main process writes the rest; committed atomically."""
        acc = self.accelerator
        tmp = self.checkpoints.staging(self.step) if acc.is_main_process else None
        tmp = Path(broadcast_object_list([str(tmp) if tmp else None])[0])
        if acc.is_main_process:
            save_tensors(tmp / "model.safetensors", self.task.state_dict())
            save_tensors(tmp / "ema.safetensors", self.ema.state_dict())
            for phase, opt in self.optimizers.items():
                save_state(tmp / "optim" / phase, {"optimizer": opt.state_dict(),
                                                    "scheduler": self.schedulers[phase].state_dict()})
            if acc.scaler is not None:
                save_state(tmp / "optim" / "grad_scaler", acc.scaler.state_dict())
            state = {
                "step": self.step,
                "world_size": acc.num_processes,
                "global_batch": self.cfg.train.batch_size,
                "num_samples": len(self.dataset),
                "family_state": self.task.state_for_checkpoint(),
                "data_info": asdict(self.data_info),
            }
            (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1))
        acc.wait_for_everyone()
        save_state(tmp / "rng" / f"rank-{acc.process_index}", _rng_state())
        acc.wait_for_everyone()
        final = self.checkpoints.commit(tmp, self.step) if acc.is_main_process else None
        acc.wait_for_everyone()
        return final or self.checkpoints.root / step_dir_name(self.step)

    def load_checkpoint(self, path: Path) -> None:
        """Restore everything `save_checkpoint` wrote (safetensors/JSON only)."""
        acc = self.accelerator
        state = json.loads((path / "trainer_state.json").read_text())
        self.task.load_state_dict(load_file(str(path / "model.safetensors"), device=str(acc.device)))
        self.ema.load_state_dict(load_file(str(path / "ema.safetensors"), device=str(acc.device)))
        for phase, opt in self.optimizers.items():
            saved = load_state(path / "optim" / phase)
            opt.load_state_dict(saved["optimizer"])
            self.schedulers[phase].load_state_dict(saved["scheduler"])
        if acc.scaler is not None and (path / "optim" / "grad_scaler.json").exists():
            acc.scaler.load_state_dict(load_state(path / "optim" / "grad_scaler"))
        rng = path / "rng" / f"rank-{acc.process_index}.json"
        if rng.exists():
            _set_rng_state(load_state(rng.with_suffix("")))
        self.task.load_state_from_checkpoint(state["family_state"])
        self.step = int(state["step"])
        same_order = (state["global_batch"], state["num_samples"]) == (self.cfg.train.batch_size, len(self.dataset))
        if not same_order and acc.is_main_process:
            print(f"genforge: batch size or data set size changed since {path.name}; the data order "
                  "from here on differs from an uninterrupted run", file=sys.stderr)

    # ------------------------------------------------------------------------------------- one step
    def _micro_batches(self, loader_iter, skips: SkipLog) -> list[dict[str, Any]]:
        acc, tc = self.accelerator, self.cfg.train
        batches = []
        for _ in range(tc.grad_accum):
            batch = next(loader_iter)
            skips.record(batch.pop("skipped"), self.step)
            for name, value in batch.items():
                if isinstance(value, Tensor):
                    batch[name] = value.to(acc.device, non_blocking=True)
            batches.append(batch)
        return batches

    def train_step(self, batches: list[dict[str, Any]], logs: StepLogs) -> bool:
        """One optimizer step of every phase; False when a phase was skipped as non-finite."""
        acc, tc = self.accelerator, self.cfg.train
        all_finite = True
        micro = tc.batch_size // (tc.grad_accum * acc.num_processes)
        for phase_index, phase in enumerate(self.task.phases):
            opt = self.optimizers[phase]
            self.model.zero_grad(set_to_none=True)
            total = torch.zeros((), device=acc.device)
            for m, batch in enumerate(batches):
                size = next(len(v) for v in batch.values() if isinstance(v, (Tensor, list)))
                offset = (m * acc.num_processes + acc.process_index) * micro  # rows of the global batch
                batch["rng"] = BatchRandom(tc.seed, self.step, phase_index, tc.batch_size, offset, size, acc.device)
                last = m == len(batches) - 1
                with acc.no_sync(self.model) if not last else nullcontext(), acc.autocast():
                    loss, extra = self.model(batch, phase, self.step)
                acc.backward(loss / len(batches))
                total += loss.detach().float() / len(batches)
                for name, value in extra.items():
                    logs.add(f"{phase}/{name}" if len(self.task.phases) > 1 else name, value)
            params = [p for g in opt.param_groups for p in g["params"]]
            norm = acc.clip_grad_norm_(params, tc.grad_clip if tc.grad_clip > 0 else float("inf"))
            finite = bool(torch.isfinite(total) and torch.isfinite(norm))
            if finite or tc.precision == "fp16":  # fp16: the grad scaler skips and rescales by itself
                opt.step()
                if not acc.optimizer_step_was_skipped:
                    self.schedulers[phase].step()
            else:
                all_finite = False
            opt.zero_grad(set_to_none=True)
            name = "loss" if len(self.task.phases) == 1 else f"{phase}/loss"
            logs.add(name, total)
            logs.add(name.replace("loss", "grad_norm"), norm if finite else torch.zeros_like(norm))
        return all_finite

    # -------------------------------------------------------------------------------------- cadences
    def _due(self, every: int) -> bool:
        return (every > 0 and self.step % every == 0) or self.step == self.cfg.train.steps

    @torch.no_grad()
    def sample_grid(self) -> Path | None:
        """Preview grid from the EMA weights, written by the main process."""
        if not self.accelerator.is_main_process:
            return None
        gen = torch.Generator(device=self.accelerator.device).manual_seed(self.cfg.train.seed)
        self.task.eval()
        with self.ema.swapped_in():
            cond = self.task.sample_conditions(self.cfg.train.num_samples, gen)
            images = self.task.sample(cond, gen)
        self.task.train()
        path = save_grid(images, self.run_dir / "samples" / f"{step_dir_name(self.step)}.png")
        self.logger.image(self.step, "samples", path)
        return path

    def evaluate(self) -> dict[str, float]:
        from genforge.eval.run import evaluate_task

        if not self.accelerator.is_main_process:
            return {}
        self.task.eval()
        with self.ema.swapped_in():
            results = evaluate_task(self.task, self.cfg, self.cfg.eval.metrics, self.cfg.eval.n,
                                    seed=self.cfg.train.seed, device=self.accelerator.device)
        self.task.train()
        out = self.run_dir / "eval" / f"{self.step}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"step": self.step, **results}, indent=1))
        self.logger.scalars(self.step, {f"eval/{k}": v for k, v in results.items() if isinstance(v, float)})
        return results

    # ------------------------------------------------------------------------------------------- fit
    def fit(self, stop_at: int | None = None) -> Path:
        """Train to `train.steps` (or stop after step `stop_at`, as if interrupted); returns the run dir."""
        acc, cfg, tc = self.accelerator, self.cfg, self.cfg.train
        if acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
            self.checkpoints.clean_incomplete()
        acc.wait_for_everyone()
        latest = self.checkpoints.latest()
        if latest is not None:
            self.load_checkpoint(latest)
            if acc.is_main_process:
                print(f"genforge: resumed from {latest} (step {self.step})", file=sys.stderr)
        self.logger = RunLogger(self.run_dir, cfg.log, cfg.model_dump(mode="json")) if acc.is_main_process \
            else None
        skips = SkipLog(self.run_dir / "skipped.jsonl")
        sampler = StepBatchSampler(len(self.dataset), tc.batch_size, tc.grad_accum, acc.num_processes,
                                   acc.process_index, seed=tc.seed, start_step=self.step)
        loader = build_loader(self.dataset, sampler, cfg.data.num_workers, pin_memory=acc.device.type == "cuda")
        loader_iter = iter(loader)
        bar = tqdm(total=tc.steps, initial=self.step, disable=not (acc.is_main_process and cfg.log.progress),
                   dynamic_ncols=True, desc=self.run_dir.name, file=sys.stderr)
        logs, last_time, last_step = StepLogs(), time.perf_counter(), self.step
        self.task.train()
        while self.step < tc.steps:
            batches = self._micro_batches(loader_iter, skips)
            finite = self.train_step(batches, logs)
            if finite:
                self.ema.update(self.step)
                self.nonfinite_in_a_row = 0
            else:
                self.nonfinite_in_a_row += 1
                if acc.is_main_process:
                    print(f"genforge: step {self.step}: non-finite loss or gradient, step skipped "
                          f"({self.nonfinite_in_a_row} in a row)", file=sys.stderr)
                if self.nonfinite_in_a_row >= tc.max_nonfinite_skips:
                    raise TrainingError(
                        f"{self.nonfinite_in_a_row} non-finite steps in a row (train.max_nonfinite_skips="
                        f"{tc.max_nonfinite_skips}); lower train.lr or check the data. The last "
                        f"checkpoint is {self.checkpoints.latest()}"
                    )
            self.step += 1
            bar.update(1)
            if self._due(tc.log_every):
                values = logs.reduce(acc)
                now = time.perf_counter()
                values["samples_per_s"] = (self.step - last_step) * tc.batch_size / max(now - last_time, 1e-9)
                values["lr"] = self.schedulers[self.task.phases[0]].get_last_lr()[0]
                values["skipped_samples"] = float(skips.count)
                last_time, last_step = now, self.step
                if self.logger:
                    self.logger.scalars(self.step, values)
                    bar.set_postfix({k: f"{v:.4g}" for k, v in values.items()
                                     if k in ("loss", "lr", "samples_per_s") or k.endswith("/loss")})
            if self._due(tc.sample_every):
                self.sample_grid()
            if cfg.eval.every and self._due(cfg.eval.every):
                self.evaluate()
            if self._due(tc.checkpoint_every):
                self.save_checkpoint()
            if stop_at is not None and self.step >= stop_at:
                break
        bar.close()
        if self.logger:
            self.logger.close()
        acc.wait_for_everyone()
        return self.run_dir
