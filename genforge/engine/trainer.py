"""The one training loop. It knows nothing about diffusion or tokens: a family is a `Task`.

Per optimizer step (`advance`): for each phase of the task, `grad_accum` micro-batches forward + backward (gradient
sync only on the last), clip, a non-finite guard, optimizer and scheduler step; then EMA; then the cadences (log,
sample, eval, checkpoint). What a checkpoint holds is a `TrainState` (genforge.engine.state); where a run starts,
resumed or fresh, is decided by genforge.engine.resume. Built on Hugging Face accelerate for devices, mixed
precision and DDP; launch several processes with `accelerate launch` or `torchrun`.
"""

from __future__ import annotations

import os
import random
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs
from torch import Tensor, nn

from genforge.core.config import ConfigChange, ConfigError, DataConfig, EvalConfig, LogConfig, TrainConfig
from genforge.core.files import TMP_PREFIX, write_atomically
from genforge.core.precision import check_precision
from genforge.core.collectives import gather_step_rows, main_decides, peer_failed
from genforge.core.random import BatchRandom
from genforge.core.status import console
from genforge.core.task import Task
from genforge.data.base import DataInfo, missing_field
from genforge.data.loader import (SkipLog, build_dataset, build_train_batches, check_enough_samples, data_info,
                                  data_notes, refuse_unreadable_start)
from genforge.engine.checkpoint import CheckpointDir, CheckpointError, step_dir_name
from genforge.engine.ema import EMA, ema_phases
from genforge.engine.lock import RunDirectoryLocked, RunLock, is_locked
from genforge.engine.logging import Progress, RunLogger, RunOutcome, StepLines, StepLogs, write_samples
from genforge.engine.phema import SNAPSHOTS, SnapshotDir, sigma_rel_to_gamma
from genforge.engine.optim import apply_optimizer_settings, build_optimizer, build_scheduler
from genforge.engine.preemption import Preempted, StopRequests
from genforge.engine.resume import (STATE_PIECES, initialise_from, plan_start, record_config_changes, restore)
from genforge.engine.sharding import full_weights, gradient_sync, shard_task, whole
from genforge.engine.state import TrainingError, TrainState
from genforge.engine.validation import validation_loss
from genforge.eval.run import evaluate_task, write_eval_results

__all__ = ["STATE_PIECES", "Trainer", "TrainingError", "TrainingRun", "resolve_run_dir"]

MIN_READS_FOR_BAD_FRACTION = 100  # do not judge data.max_bad_fraction on a handful of samples


def resolve_run_dir(base: Path, fresh: bool) -> Path:
    """`base`, or with --fresh and an existing run there (or one training into it now), the first free `base-1`,
    `base-2`, ..."""
    if not fresh or not ((base / "checkpoints").exists() or is_locked(base)):
        return base
    n = 1
    while (base.parent / f"{base.name}-{n}").exists():
        n += 1
    return base.parent / f"{base.name}-{n}"


def _accelerator(tc: TrainConfig, ddp: DistributedDataParallelKwargs) -> Accelerator:
    """The run's accelerate Accelerator: its precision, the collective timeout, DDP's settings (`ddp`, which the
    trainer may still change before the task is wrapped), the processes torchrun or accelerate launch started."""
    check_precision(tc.precision, "cuda" if torch.cuda.is_available() else "cpu", f"train.precision={tc.precision}")
    timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=tc.dist_timeout_s))
    # torchrun/accelerate launch without CUDA: accelerate joins the (gloo) process group only when told cpu=True
    multi_cpu = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()
    if AcceleratorState._shared_state and AcceleratorState().mixed_precision != tc.precision:
        # accelerate keeps one state per process and refuses another precision in it: a second run in the same
        # Python process (genforge.train twice, e.g. the default preset's bf16 after a float32 run) starts a fresh
        # one; the process group (accelerate's PartialState) is kept
        AcceleratorState._reset_state()
    acc = Accelerator(mixed_precision=tc.precision, cpu=multi_cpu, kwargs_handlers=[ddp, timeout])
    if acc.num_processes != int(os.environ.get("WORLD_SIZE", "1")):
        raise RuntimeError(f"launched with WORLD_SIZE={os.environ['WORLD_SIZE']} but accelerate joined "
                           f"{acc.num_processes} process(es); check the launcher's backend settings")
    return acc


@dataclass
class TrainingRun:
    """What the trainer is given: the run's data, train, eval and log sections, how to build its task once the data
    set says what it holds, and the resolved config written into the run directory. The trainer never reads a
    model section: everything a family needs it gets from its builder."""

    data: DataConfig
    train: TrainConfig
    eval: EvalConfig
    log: LogConfig
    build_task: Callable[[DataInfo], Task]
    config_yaml: str = ""  # written to run_dir/config.yaml before step 0
    config_dict: dict[str, Any] = field(default_factory=dict)  # for wandb
    # what this config changes from the one in a run directory (None: it has none); ConfigError: not allowed
    changes_from: Callable[[Path], list[ConfigChange] | None] = lambda run_dir: []


class Trainer:
    """Trains the task of `run` on `run.data` into `run_dir`, resuming from its latest checkpoint. `state` is what
    a checkpoint holds (the task, EMA, optimizers, schedulers, step and data position)."""

    def __init__(self, run: TrainingRun, run_dir: Path, fresh: bool = False) -> None:
        self.run, tc = run, run.train
        ddp = DistributedDataParallelKwargs(find_unused_parameters=False)
        self.accelerator = acc = _accelerator(tc, ddp)
        self.run_dir = Path(main_decides(lambda: str(resolve_run_dir(Path(run_dir), fresh))))
        if acc.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        # Same initial weights on every rank; per-rank streams only where a task uses global RNG.
        random.seed(tc.seed)
        np.random.seed(tc.seed)
        torch.manual_seed(tc.seed)
        dataset = build_dataset(run.data, split="train", world_size=acc.num_processes)
        check_enough_samples(dataset, run.data, tc.batch_size)
        info = data_info(dataset, run.data)
        self.task = task = run.build_task(info)
        if len(task.phases) > 1 or run.data.images is not None:  # a phase / a 1-frame clip leaves weights unused
            ddp.find_unused_parameters = True
        task.to(acc.device)
        tc.check_phases(task.phase_names())
        if tc.sample_frames is not None:  # the clip length against the tokenizer's layout, before any step
            try:
                task.sampler_settings(task.preview_options(tc))
            except ValueError as err:
                raise ConfigError(f"train.sample_frames={tc.sample_frames}: {err}") from None
        # fsdp: sharded over the processes (one process: whole, with sharded-format checkpoints all the same)
        self.sharded = tc.sharding == "fsdp" and acc.num_processes > 1
        if self.sharded:
            shard_task(task, acc.device, tc.precision)
        if tc.compile:  # after sharding: FSDP2's hooks stay around the compiled forwards
            task.compile_blocks()
        # train.phases.<p> applied; a train section built by hand without grad_clip clips as the task's family does
        self.phase_train = {p: tc.for_phase(p, task.traits.grad_clip) for p in task.phases}
        optimizers = {p: build_optimizer(task.parameters_for(p), self.phase_train[p], acc.device) for p in task.phases}
        schedulers = {p: build_scheduler(o, self.phase_train[p]) for p, o in optimizers.items()}
        self.parallel_task: nn.Module = task  # what the step calls: the task, DDP-wrapped on several processes
        if not self.sharded:  # FSDP2 reduces the gradients itself: no DDP wrapper
            self.parallel_task, *prepared = acc.prepare(task, *optimizers.values())
            optimizers = dict(zip(task.phases, prepared))
        gammas = tuple(map(sigma_rel_to_gamma, tc.ema.widths)) if tc.ema.kind == "power" else ()
        ema = EMA(task.ema_module(), tc.ema_decay, tc.ema_warmup, tc.ema_start,
                  ema_phases(task, self.phase_train), gammas)
        self.state = TrainState(acc, tc, task, ema, optimizers, schedulers,
                                CheckpointDir(self.run_dir / "checkpoints", tc.keep_last, tc.keep_best_mode),
                                SnapshotDir(self.run_dir / SNAPSHOTS), dataset, info, self.sharded)
        self.nonfinite_in_a_row = 0
        self.outcome = RunOutcome(notes=data_notes(dataset, run.data))  # for the closing summary
        self.logger: RunLogger | None = None
        self.skips = SkipLog(self.run_dir / "skipped.jsonl")
        refuse_unreadable_start(dataset, run.data, self.skips, record=acc.is_main_process)

    # ------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Write a checkpoint of this step (TrainState.save) and return its folder."""
        return self.state.save()

    def load_checkpoint(self, path: Path, skip: Iterable[str] = ()) -> None:
        """Restore everything a checkpoint holds (genforge.engine.resume.restore; `skip`: STATE_PIECES to leave), and
        drop the EMA snapshots of later steps (a continuation this run abandons and writes anew)."""
        restore(self.state, path, skip)
        self._drop_later_snapshots()

    def _drop_later_snapshots(self) -> None:
        """Remove the EMA snapshots of steps after the state's (the main process; every rank waits for it)."""
        if self.accelerator.is_main_process:
            dropped = [p.name for p in self.state.snapshots.drop_after(self.state.step)
                       if not p.name.startswith(TMP_PREFIX)]
            if dropped:
                line = f"removed the EMA snapshots past step {self.state.step} ({', '.join(dropped)}): written anew"
                console().info(line)
                if self.logger:
                    self.logger.event(self.state.step, "ema_snapshots_dropped", line)
        self.accelerator.wait_for_everyone()

    # ------------------------------------------------------------------------------------------- fit
    def fit(self, stop_at: int | None = None) -> Path:
        """Train to `train.steps` (or stop after step `stop_at`, as if interrupted); returns the run dir. Holds the
        run directory's lock throughout (RunDirectoryLocked when another trainer has it).
        SIGTERM/SIGINT/SIGUSR1 end the run after a checkpoint by raising Preempted."""
        held: list[RunLock] = []  # the main process's; every rank raises when another process has it
        main_decides(lambda: held.append(RunLock.acquire(self.run_dir)), (RunDirectoryLocked,))
        try:
            return self._fit(stop_at)
        finally:
            for lock in held:
                lock.release()

    def _start(self) -> None:
        """Resume from the run's newest usable checkpoint, or start fresh (from train.init_from's weights when
        set); write config.yaml once the start is accepted, and open the run's logs with what happened."""
        acc, cfg, state = self.accelerator, self.run, self.state
        if acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            state.checkpoints.clean_incomplete()
        acc.wait_for_everyone()
        plan = plan_start(state, self.run_dir, cfg.changes_from, cfg.train.init_from)
        if acc.is_main_process:
            for note in plan.notes:
                console().warning(note)
            for note in self.outcome.notes:  # the data's (said again in the closing summary)
                console().info(f"data: {note}")
        events = [("checkpoint_fallback", note) for note in plan.notes]
        if plan.changes:
            events.append(("config_change", "; ".join(map(str, plan.changes))))
        if plan.checkpoint is not None:
            self.load_checkpoint(plan.checkpoint)
            for phase, optimizer in state.optimizers.items():  # a changed lr, schedule, ... takes effect
                apply_optimizer_settings(optimizer, state.schedulers[phase], self.phase_train[phase])
            if acc.is_main_process:
                console().info(f"resumed from {plan.checkpoint} (step {state.step})")
        elif plan.init_from is not None:  # a fresh run only: a resume loads its own checkpoint instead
            events.append(("init_from", initialise_from(state, plan.init_from)))
        if plan.checkpoint is None:  # a fresh start: snapshots a run killed before its first checkpoint left
            self._drop_later_snapshots()
        if acc.is_main_process and cfg.train.ema.kind == "power":
            console().info(f"power-function EMAs of sigma_rel {', '.join(map(str, cfg.train.ema.widths))} (gamma "
                           f"{', '.join(f'{g:.3f}' for g in state.ema.gammas)}), snapshots every "
                           f"{cfg.train.snapshot_every} steps into {state.snapshots.root}; the EMA weights are "
                           f"sigma_rel {cfg.train.ema.widths[0]}'s (train.ema_decay does not apply)")
        if acc.is_main_process:  # only once the checkpoint fits: a refused resume leaves config.yaml as it was
            record_config_changes(self.run_dir, state.step, plan.changes)
            write_atomically(self.run_dir / "config.yaml", cfg.config_yaml)
            self.logger = RunLogger(self.run_dir, cfg.log, cfg.config_dict, resume_step=state.step)
            for kind, message in events:
                self.logger.event(state.step, kind, message)

    def _fit(self, stop_at: int | None) -> Path:
        acc = self.accelerator
        self._start()
        first_step, start = self.state.step, time.perf_counter()
        try:
            with StopRequests() as stop:
                self._loop(stop, stop_at)
        except RuntimeError as err:
            if isinstance(err, (TrainingError, CheckpointError)) or not peer_failed(err):
                raise
            raise TrainingError(f"rank {acc.process_index}: a collective operation failed, so another process "
                                f"died or hung (train.dist_timeout_s={self.run.train.dist_timeout_s}): {err}") from err
        finally:
            if self.logger:
                self.logger.close()
        if acc.is_main_process:
            console().info(self.outcome.summary(self.run_dir, self.run.train.steps, first_step, self.state.step,
                                                time.perf_counter() - start, self.state.last_eval))
        acc.wait_for_everyone()
        return self.run_dir

    def _loop(self, stop: StopRequests, stop_at: int | None) -> None:
        acc, tc, state = self.accelerator, self.run.train, self.state
        # a bar on a terminal (log.progress); a plain line per logged step anywhere else (a log file, a cluster job)
        bar = Progress(self.run_dir.name, "steps", tc.steps, enabled=acc.is_main_process, initial=state.step,
                       bar=self.run.log.progress, lines=False)
        lines = StepLines(tc.steps, state.step) if acc.is_main_process and not bar.on_terminal else None
        logs, last_time, last_step = StepLogs(), time.perf_counter(), state.step
        self.task.train()
        batches = self.batches()
        while state.step < tc.steps:
            stepped, signum = self.advance(batches, logs, stop.signum or 0)
            if not stepped:  # rolled back to the last checkpoint: restart the data stream past the failure
                batches = self.batches()
                bar.report(state.step)
                continue
            bar.report(state.step)
            if self._due(tc.log_every):
                values = logs.reduce(acc)
                now = time.perf_counter()
                values["samples_per_s"] = (state.step - last_step) * tc.batch_size / max(now - last_time, 1e-9)
                values["lr"] = state.schedulers[self.task.phases[0]].get_last_lr()[0]
                values["skipped_samples"] = float(self.skips.bad)
                last_time, last_step = now, state.step
                self.outcome.logged = values
                if self.logger:
                    self.logger.scalars(state.step, values)
                    bar.show_values({k: v for k, v in values.items()
                                     if k in ("loss", "lr", "samples_per_s") or k.endswith("/loss")})
                if lines:
                    console().info(lines.line(state.step, values))
                self._check_bad_data()
            if self._due(tc.sample_every):
                self.outcome.samples = self.sample_grid() or self.outcome.samples
            if self.run.eval.every and self._due(self.run.eval.every):
                self.evaluate()
            if tc.ema.kind == "power" and self._due(tc.snapshot_every):  # before a checkpoint of the same step
                state.snapshot_ema()
            if self._due(tc.checkpoint_every) or signum:
                self.outcome.checkpoint = self.save_checkpoint()
                if signum:
                    bar.close()
                    raise Preempted(signum, state.step, self.outcome.checkpoint)
            if stop_at is not None and state.step >= stop_at:
                break
        bar.close()

    # ------------------------------------------------------------------------------------- one step
    def batches(self) -> Iterator[dict[str, Any]]:
        """This rank's micro-batches from global batch `state.data_position` on, on the device."""
        acc, state = self.accelerator, self.state
        loader = build_train_batches(state.dataset, self.run.data, self.run.train, acc.num_processes,
                                     acc.process_index, state.data_position, pin_memory=acc.device.type == "cuda")
        for batch in loader:
            skipped = batch.pop("skipped")
            self.skips.record(len(batch.get("key", ())), skipped, state.step)
            yield {k: v.to(acc.device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}

    def advance(self, batches: Iterator[dict[str, Any]], logs: StepLogs, signum: int = 0) -> tuple[bool, int]:
        """One optimizer step on the next `grad_accum` micro-batches: the step of every phase, the family's end of
        step, the EMA, the counters. Returns whether the run advanced (False: it rolled back to the last checkpoint,
        and `batches` must restart) and the largest pending signal of any rank."""
        state = self.state
        flags = self.train_step([next(batches) for _ in range(self.run.train.grad_accum)], logs)
        finite, signum = self._finish_step(flags, signum)
        self.task.end_step(state.step)
        state.data_position += 1
        if not finite:
            if self._after_nonfinite():
                return False, signum
        else:
            state.ema.update()
            self.nonfinite_in_a_row = 0
        state.step += 1
        return True, signum

    def train_step(self, batches: list[dict[str, Any]], logs: StepLogs) -> Tensor:
        """One optimizer step of every phase; returns whether each phase's loss and gradient norm were finite (a
        bool tensor [phases], left on the device: a non-finite phase's update is skipped on the device by a fused
        AdamW, see `_optimizer_step`). The schedulers step once the caller has read it (`_finish_step`)."""
        acc, tc, step = self.accelerator, self.run.train, self.state.step
        flags: list[Tensor] = []
        micro = tc.batch_size // (tc.grad_accum * acc.num_processes)
        global_batch = gather_step_rows(self.task.traits.global_fields, batches, micro)
        for phase_index, phase in enumerate(self.task.phases):
            opt = self.state.optimizers[phase]
            self.parallel_task.zero_grad(set_to_none=True)
            total = torch.zeros((), device=acc.device)
            for m, batch in enumerate(batches):
                size = next(len(v) for v in batch.values() if isinstance(v, (Tensor, list)))
                offset = (m * acc.num_processes + acc.process_index) * micro  # rows of the global batch
                batch["rng"] = BatchRandom(tc.seed, step, phase_index, tc.batch_size, offset, size, acc.device)
                if global_batch:
                    batch["global_batch"] = global_batch
                missing = batch.pop("missing", {})
                with self._gradient_sync(m == len(batches) - 1), acc.autocast():
                    try:
                        loss, extra = self.parallel_task(batch, phase, step)
                    except KeyError as err:
                        raise missing_field(err, batch, missing) from None
                acc.backward(loss / len(batches))
                total += loss.detach().float() / len(batches)
                for name, value in extra.items():
                    logs.add(f"{phase}/{name}" if len(self.task.phases) > 1 else name, value)
            params = [p for g in opt.param_groups for p in g["params"]]
            clip = self.phase_train[phase].grad_clip
            norm = whole(acc.clip_grad_norm_(params, clip if clip > 0 else float("inf")))
            # the norm is of the all-reduced gradients: every rank takes the same decision
            finite = torch.isfinite(total) & torch.isfinite(norm)
            flags.append(self._optimizer_step(phase, finite))
            opt.zero_grad(set_to_none=True)
            name = "loss" if len(self.task.phases) == 1 else f"{phase}/loss"
            logs.add(name, total)
            logs.add(name.replace("loss", "grad_norm"), torch.where(finite, norm, torch.zeros_like(norm)))
        return torch.stack(flags)

    def _optimizer_step(self, phase: str, finite: Tensor) -> Tensor:
        """Step the phase's optimizer unless `finite` is false; returns whether the step counts. A fused AdamW skips
        on the device (its `found_inf`: no weight, moment or step count changes), so no host sync is needed here;
        any other optimizer needs the host to know. fp16: the grad scaler skips and rescales by itself, the step
        counts, and the scheduler steps here when the scaler did not skip."""
        opt = self.state.optimizers[phase]
        inner = getattr(opt, "optimizer", opt)  # accelerate's wrapper
        if self.run.train.precision == "fp16":
            opt.step()
            if not self.accelerator.optimizer_step_was_skipped:
                self.state.schedulers[phase].step()
            return torch.ones((), dtype=torch.bool, device=finite.device)
        if inner.defaults.get("fused") and not self.sharded:
            inner.found_inf = (~finite).float()
            try:
                opt.step()
            finally:
                inner.found_inf = None
            return finite
        if bool(finite):
            opt.step()
        return finite

    def _finish_step(self, flags: Tensor, signum: int) -> tuple[bool, int]:
        """The one host sync of a step: whether every phase was finite, and the largest pending signal of any rank
        (a single all_reduce with several processes). The schedulers of the phases that stepped step."""
        acc = self.accelerator
        status = torch.cat([(~flags).to(torch.int64), torch.tensor([signum], device=flags.device)])
        if acc.num_processes > 1:
            status = status.to(acc.device)
            torch.distributed.all_reduce(status, op=torch.distributed.ReduceOp.MAX)
        *skipped, signum = status.tolist()
        for phase, was_skipped in zip(self.task.phases, skipped):
            if not was_skipped and self.run.train.precision != "fp16":  # fp16: stepped by _optimizer_step
                self.state.schedulers[phase].step()
        return not any(skipped), signum

    def _after_nonfinite(self) -> bool:
        """Count a skipped step; past train.max_nonfinite_skips stop or roll back. True after a rollback."""
        tc, state = self.run.train, self.state
        self.nonfinite_in_a_row += 1
        if self.accelerator.is_main_process:
            console().info(f"step {state.step}: non-finite loss or gradient, step skipped "
                           f"({self.nonfinite_in_a_row} in a row)")
        if self.nonfinite_in_a_row < tc.max_nonfinite_skips:
            return False
        latest = state.checkpoints.latest()
        if tc.on_nonfinite == "stop" or latest is None or state.rollbacks >= tc.max_rollbacks:
            why = "" if tc.on_nonfinite == "stop" else (
                " and no checkpoint to roll back to" if latest is None else
                f" after {state.rollbacks} rollbacks (train.max_rollbacks={tc.max_rollbacks})")
            raise TrainingError(f"{self.nonfinite_in_a_row} non-finite steps in a row (train.max_nonfinite_skips="
                                f"{tc.max_nonfinite_skips}){why}; lower train.lr or check the data. The last "
                                f"checkpoint is {latest}")
        failed_at = state.data_position  # the batch after the last one that failed
        self.load_checkpoint(latest)
        state.data_position = failed_at  # skip every batch from the checkpoint to the failure
        state.rollbacks += 1
        self.nonfinite_in_a_row = 0
        if self.accelerator.is_main_process:
            console().info(f"rolled back to {latest.name} (step {state.step}); skipping the data up to the "
                           f"failure (rollback {state.rollbacks} of {tc.max_rollbacks})")
        return True

    def _gradient_sync(self, sync: bool) -> Any:
        """A context in which backward reduces the gradients over processes only when `sync` (the last
        micro-batch of a step)."""
        if self.sharded:
            gradient_sync(self.task, sync)
            return nullcontext()
        return nullcontext() if sync else self.accelerator.no_sync(self.parallel_task)

    # -------------------------------------------------------------------------------------- cadences
    def _due(self, every: int) -> bool:
        return (every > 0 and self.state.step % every == 0) or self.state.step == self.run.train.steps

    def _check_bad_data(self) -> None:
        """Stop when the share of unreadable samples (all ranks) passes data.max_bad_fraction."""
        counts = torch.tensor([self.skips.reads, self.skips.bad], dtype=torch.float64, device=self.accelerator.device)
        reads, bad = (self.accelerator.reduce(counts, reduction="sum") if self.accelerator.num_processes > 1
                      else counts).tolist()
        limit = self.run.data.max_bad_fraction
        if reads >= MIN_READS_FOR_BAD_FRACTION and bad > limit * reads:
            raise TrainingError(f"{bad:.0f} of {reads:.0f} samples read were unreadable ({bad / reads:.1%} > "
                                f"data.max_bad_fraction={limit}); see {self.run_dir / 'skipped.jsonl'}")

    @contextmanager
    def _full_weights(self) -> Iterator[None]:
        """The whole weights on every rank of a sharded task (sampling, evaluation); gathered in the training
        precision (bf16 under train.precision=bf16), so the networks then run under autocast as in training."""
        if not self.sharded:
            yield
            return
        with full_weights(self.task), self.accelerator.autocast():
            yield


    @torch.no_grad()
    def sample_grid(self) -> Path | None:
        """Preview grid from the EMA weights, written by the main process (a sharded task samples on every rank,
        with the weights gathered). A task whose traits say `preview_online` is also handed the same samples (same
        conditions and seed) from the online weights as cond["online"] for its preview, e.g. a tokenizer's
        reconstructions by both beside each other (muse-maskgit-pytorch's trainer)."""
        main, task, step = self.accelerator.is_main_process, self.task, self.state.step
        if not (main or self.sharded) or not task.traits.makes_samples:
            return None
        seed, n, device = self.run.train.seed, self.run.train.num_samples, self.accelerator.device
        options = task.preview_options(self.run.train)
        task.eval()
        online = None
        if task.traits.preview_online:
            gen = torch.Generator(device=device).manual_seed(seed)
            with self._full_weights():
                online = task.sample(task.sample_conditions(n, gen, options), gen, n, options)
        gen = torch.Generator(device=device).manual_seed(seed)
        path = None
        with self.state.ema.swapped_in(), self._full_weights():
            cond = task.sample_conditions(n, gen, options)
            images = task.sample(cond, gen, n, options)
            if online is not None:
                cond["online"] = online
            if main:  # a task's preview may run its networks (a dvae's soft reconstructions)
                path = write_samples(task, cond, images, self.run_dir / "samples" / step_dir_name(step))
        task.train()
        if path is None:
            return None
        self.logger.image(step, "samples", path)
        return path

    def evaluate(self) -> dict[str, Any]:
        """Evaluation metrics of the EMA weights (and the validation loss, with eval.val_loss_batches). Every rank
        takes part (generators: each samples its share, see genforge.eval.run); the main process writes and logs the
        results, the others get an empty dict."""
        cfg, step = self.run, self.state.step
        self.task.eval()
        results: dict[str, Any] = {}
        with self.state.ema.swapped_in(), self._full_weights():
            if cfg.eval.metrics != []:
                results = evaluate_task(self.task, cfg.data, cfg.eval, cfg.eval.metrics, cfg.eval.n,
                                        seed=cfg.train.seed, device=self.accelerator.device)
            if cfg.eval.val_loss_batches:
                results.update(validation_loss(self.task, cfg.data, cfg.train, cfg.eval.val_loss_batches, step,
                                               self.accelerator))
        self.task.train()
        if not self.accelerator.is_main_process:
            return {}
        write_eval_results(self.run_dir, step, results)
        self.logger.scalars(step, {f"eval/{k}": v for k, v in results.items() if isinstance(v, float)})
        for k, v in results.items():
            if k.endswith("_histogram"):
                self.logger.histogram(step, f"eval/{k}", v)
        self.state.last_eval = {"step": step, **results}
        return results
