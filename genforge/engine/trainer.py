"""The one training loop. It knows nothing about diffusion or tokens: a family is a `Task`.

Per optimizer step: for each phase of the task, `grad_accum` micro-batches forward + backward (gradient
sync only on the last), clip, a non-finite guard, optimizer and scheduler step; then EMA, and the
cadences (log, sample, eval, checkpoint). Built on Hugging Face accelerate for devices, mixed precision
and DDP; launch several processes with `accelerate launch` or `torchrun`.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs, broadcast_object_list
from torch.distributed.checkpoint.api import CheckpointException
from torch import Tensor, nn
from tqdm.auto import tqdm

from genforge.core.codec import check_references
from genforge.core.config import ConfigChange, ConfigError, DataConfig, EvalConfig, LogConfig, TrainConfig
from genforge.core.files import write_atomically
from genforge.core.precision import check_precision
from genforge.core.random import BatchRandom, global_rng_state, set_global_rng_state
from genforge.core.task import Batch, Task
from genforge.data.base import BadDataError, DataInfo, collate, missing_field_error
from genforge.data.loader import (SkipLog, build_dataset, build_train_batches, check_enough_samples, data_info,
                                  dataset_size, heldout_samples, unreadable_start)
from genforge.engine.checkpoint import (SAFETENSORS_TO_TORCH, SHARDS, WRITE_ERRORS, CheckpointDir, CheckpointError,
                                        CheckpointReadError, expected_tensors, flatten_state, load_state,
                                        load_tensors, newest_usable, nonfinite_tensors, read_json, read_weights,
                                        save_state, save_tensors, sharded_tensors, source_checkpoint, step_dir_name,
                                        tensor_refs, unflatten_state, verify_checkpoint, weights_mismatch)
from genforge.engine.consistency import first_difference
from genforge.engine.ema import EMA
from genforge.engine.lock import RunDirectoryLocked, RunLock, is_locked
from genforge.engine.logging import RunLogger, StepLines, console, duration, write_samples
from genforge.engine.optim import apply_optimizer_settings, build_optimizer, build_scheduler, materialize_state
from genforge.engine.preemption import Preempted, StopRequests
from genforge.engine.sharding import (full_weights, gradient_sync, laid_out_like, load_shards, local, save_shards,
                                      shard_task, whole)
from genforge.eval.run import evaluate_task, write_eval_results

# What a checkpoint restores, by name (`load_checkpoint(skip=...)` lets tests prove each one matters).
STATE_PIECES = ("model", "ema", "optimizer", "scheduler", "grad_scaler", "rng", "step", "data_position",
                "family")
MIN_READS_FOR_BAD_FRACTION = 100  # do not judge data.max_bad_fraction on a handful of samples


def _collective_failure(err: BaseException) -> bool:
    """An error raised because a peer process died or hung (gloo/NCCL timeouts and closed connections)."""
    if isinstance(err, torch.distributed.DistError):
        return True
    text = str(err)
    return any(sign in text for sign in ("gloo", "NCCL", "Timed out", "timed out", "Connection closed"))


def _missing_field(err: KeyError, batch: dict[str, Any], missing: dict[str, str]) -> Exception:
    """A task's KeyError for a Batch field the data does not have, as a BadDataError naming the field and a sample
    that lacks it (`missing`: collate's record of fields some samples lacked); any other KeyError unchanged."""
    field = err.args[0] if err.args else None
    if not isinstance(field, str) or field not in Batch.__annotations__ or field in batch:
        return err
    keys = batch.get("key") or [None]
    return missing_field_error(field, missing.get(field, keys[0]))


class TrainingError(RuntimeError):
    """The run cannot go on (too many non-finite steps, too much bad data, a dead peer); the message says why."""


def resolve_run_dir(base: Path, fresh: bool) -> Path:
    """`base`, or with --fresh and an existing run there (or one training into it now), the first free `base-1`,
    `base-2`, ..."""
    if not fresh or not ((base / "checkpoints").exists() or is_locked(base)):
        return base
    n = 1
    while (base.parent / f"{base.name}-{n}").exists():
        n += 1
    return base.parent / f"{base.name}-{n}"


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
    """Trains the task of `run` on `run.data` into `run_dir`, resuming from its latest checkpoint."""

    def __init__(self, run: TrainingRun, run_dir: Path, fresh: bool = False) -> None:
        self.run = run
        tc = run.train
        check_precision(tc.precision, "cuda" if torch.cuda.is_available() else "cpu", f"train.precision={tc.precision}")
        ddp = DistributedDataParallelKwargs(find_unused_parameters=False)
        timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=tc.dist_timeout_s))
        # torchrun/accelerate launch without CUDA: accelerate joins the (gloo) process group only when told cpu=True
        multi_cpu = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()
        self.accelerator = Accelerator(mixed_precision=tc.precision, cpu=multi_cpu, kwargs_handlers=[ddp, timeout])
        acc = self.accelerator
        if acc.num_processes != int(os.environ.get("WORLD_SIZE", "1")):
            raise RuntimeError(f"launched with WORLD_SIZE={os.environ['WORLD_SIZE']} but accelerate joined "
                               f"{acc.num_processes} process(es); check the launcher's backend settings")
        chosen = [str(resolve_run_dir(Path(run_dir), fresh)) if acc.is_main_process else None]
        broadcast_object_list(chosen)
        self.run_dir = Path(chosen[0])
        self.checkpoints = CheckpointDir(self.run_dir / "checkpoints", tc.keep_last, tc.keep_best_mode)
        if acc.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        # Same initial weights on every rank; per-rank streams only where a task uses global RNG.
        random.seed(tc.seed)
        np.random.seed(tc.seed)
        torch.manual_seed(tc.seed)
        self.dataset = build_dataset(run.data, split="train", world_size=acc.num_processes)
        check_enough_samples(self.dataset, run.data, tc.batch_size)
        self.data_info = data_info(self.dataset, run.data)
        self.task: Task = run.build_task(self.data_info)
        if len(self.task.phases) > 1 or run.data.images is not None:  # a phase / a 1-frame clip leaves weights unused
            ddp.find_unused_parameters = True
        self.task.to(acc.device)
        tc.check_phases(self.task.phase_names())
        if tc.sample_frames is not None:  # the clip length against the tokenizer's layout, before any step
            try:
                self.task.sampler_settings(self.task.preview_options(tc))
            except ValueError as err:
                raise ConfigError(f"train.sample_frames={tc.sample_frames}: {err}") from None
        # fsdp: sharded over the processes (one process: whole, with sharded-format checkpoints all the same)
        self.sharded = tc.sharding == "fsdp" and acc.num_processes > 1
        self.sharded_checkpoints = tc.sharding == "fsdp"
        if self.sharded:
            shard_task(self.task, acc.device, tc.precision)
        if tc.compile:  # after sharding: FSDP2's hooks stay around the compiled forwards
            self.task.compile_blocks()
        self.phase_train = {p: tc.for_phase(p) for p in self.task.phases}  # train.phases.<p> applied
        self.optimizers = {p: build_optimizer(self.task.parameters_for(p), self.phase_train[p], acc.device)
                           for p in self.task.phases}
        self.schedulers = {p: build_scheduler(o, self.phase_train[p]) for p, o in self.optimizers.items()}
        self.carried_optimizer_state: dict[str, Any] = {}  # of phases this run does not train, kept as loaded
        if self.sharded:  # FSDP2 reduces the gradients itself: no DDP wrapper
            self.model: nn.Module = self.task
        else:
            prepared = acc.prepare(self.task, *self.optimizers.values())
            self.model, prepared_optimizers = prepared[0], prepared[1:]
            self.optimizers = dict(zip(self.task.phases, prepared_optimizers))
        self.ema = EMA(self.task.ema_module(), tc.ema_decay, tc.ema_warmup, tc.ema_start, self._ema_phases())
        self.step = 0
        self.data_position = 0  # global batches consumed; ahead of `step` after a rollback skipped data
        self.rollbacks = 0
        self.nonfinite_in_a_row = 0
        self.last_eval: dict[str, Any] = {}
        self.last_logged: dict[str, float] = {}  # for the closing summary
        self.last_samples: Path | None = None
        self.last_checkpoint: Path | None = None
        self.skips = SkipLog(self.run_dir / "skipped.jsonl")
        self._check_readable()

    def _check_readable(self) -> None:
        """BadDataError (exit 2) before training when the data set's first samples are all unreadable (an image
        folder of broken files); they are listed in skipped.jsonl."""
        bad = unreadable_start(self.dataset)
        if not bad:
            return
        if self.accelerator.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.skips.record(0, bad, 0)
        size = dataset_size(self.dataset) or len(bad)
        which = f"all {size}" if len(bad) == size else f"the first {len(bad)} of {size}"
        reasons = "; ".join(f"{key}: {reason}" for key, reason in bad[:3])
        raise BadDataError(f"data.path={self.run.data.path!r}: {which} samples are unreadable ({reasons}"
                           f"{'; ...' if len(bad) > 3 else ''}); all are listed in {self.skips.path}")

    def _ema_phases(self) -> dict[str, tuple[float, list[str]]]:
        """Each phase of this run with its EMA decay (`train.phases.<phase>.ema_decay`) and the names of the
        averaged parameters it trains (the last phase that lists a parameter owns it); parameters no phase of this
        run trains keep their EMA as it is. The EMA counts each phase's updates for its warm-up."""
        phase_of = {id(p): phase for phase in self.task.phases for p in self.task.parameters_for(phase)}
        names: dict[str, list[str]] = {phase: [] for phase in self.task.phases}
        for name, p in self.task.ema_module().named_parameters():
            if id(p) in phase_of:
                names[phase_of[id(p)]].append(name)
        return {phase: (self.phase_train[phase].ema_decay, names[phase]) for phase in self.task.phases}

    # ------------------------------------------------------------------------------------ collectives
    def _any_rank(self, flag: bool | int) -> int:
        """Max of an integer flag over ranks: every rank takes the same decision."""
        if self.accelerator.num_processes == 1:
            return int(flag)
        value = torch.tensor([int(flag)], device=self.accelerator.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return int(value.item())

    # ----------------------------------------------------------------------------------------- state
    def _state_tensors(self) -> dict[str, dict[str, Tensor]]:
        return {"model": self.task.state_dict(), "ema": self.ema.state_dict()}

    def _optimizer_state(self, phase: str) -> dict[str, Any]:
        return {"optimizer": self.optimizers[phase].state_dict(), "scheduler": self.schedulers[phase].state_dict()}

    def _sharded_state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """A sharded checkpoint's tensors (`model.`, `ema.`, `optim.<phase>.` names; each rank's shards, not
        copies) and the JSON skeleton of each phase's optimizer state naming its tensors among them."""
        tensors = {f"{part}.{name}": t for part, state in self._state_tensors().items() for name, t in state.items()}
        states = {**{phase: self._optimizer_state(phase) for phase in self.optimizers}, **self.carried_optimizer_state}
        skeletons = {phase: flatten_state(state, tensors, f"optim.{phase}", copy=False) for phase, state in states.items()}
        return tensors, skeletons

    def _nonfinite_state(self) -> list[str]:
        """Weights or EMA values that are NaN or infinite (a checkpoint must not hold them): checked by the main
        process, or under sharding by every rank on its shards, every rank then learning whether any found one."""
        if not (self.accelerator.is_main_process or self.sharded):
            return []
        bad = sorted(f"{part}.{name}" for part, tensors in self._state_tensors().items()
                     for name in nonfinite_tensors({k: local(t) for k, t in tensors.items()}))
        if self.sharded and self._any_rank(bool(bad)) and not bad:
            bad = ["(the shards of another rank)"]
        return bad

    def save_checkpoint(self) -> Path:
        """Every rank writes its RNG state (and under train.sharding=fsdp its shards of the weights, EMA and
        optimizer state, in parallel), the main process the rest; committed atomically. A write error removes this
        checkpoint's files, keeps the previous `latest`, and raises CheckpointError."""
        acc = self.accelerator
        error: BaseException | None = None
        tmp: Path | None = None
        bad = self._nonfinite_state()
        if bad:
            raise TrainingError(f"refusing to write a checkpoint at step {self.step} holding non-finite "
                                f"values in {', '.join(bad[:5])}")
        shards, skeletons = self._sharded_state() if self.sharded_checkpoints else ({}, {})
        if acc.is_main_process:
            try:
                tmp = self.checkpoints.staging(self.step)
                self._write_main_state(tmp, skeletons)
            except WRITE_ERRORS as err:
                error = err
        shared = broadcast_object_list([str(tmp) if tmp is not None and error is None else ""])[0]
        if shared:
            try:
                if self.sharded_checkpoints:  # a collective: every rank writes its pieces
                    save_shards(Path(shared) / SHARDS, shards)
                save_state(Path(shared) / "rng" / f"rank-{acc.process_index}", global_rng_state())
            except (*WRITE_ERRORS, CheckpointException) as err:
                error = error or err
        failed = self._any_rank(error is not None) or not shared
        final = None
        if not failed and acc.is_main_process:
            try:
                final = self.checkpoints.commit(tmp, self.step, self._best_score())
            except WRITE_ERRORS as err:
                error = err
        failed = self._any_rank(error is not None)
        if failed:
            if acc.is_main_process and tmp is not None:
                self.checkpoints.discard(tmp)
            latest = self.checkpoints.latest()
            cause = f"{type(error).__name__}: {error}" if error is not None else "another rank failed to write"
            raise CheckpointError(f"rank {acc.process_index}: could not write the checkpoint of step {self.step} "
                                  f"into {self.checkpoints.root} ({cause}); the latest checkpoint is still "
                                  f"{latest.name if latest else 'none'}")
        self.check_consistency()
        return final or self.checkpoints.root / step_dir_name(self.step)

    def check_consistency(self) -> None:
        """With several processes (and train.check_consistency): every rank must hold the same weights, buffers and
        EMA; a TrainingError names the first tensor that differs (a buffer updated from one rank's data, a rank
        that skipped an update)."""
        acc = self.accelerator
        if acc.num_processes == 1 or not self.run.train.check_consistency:
            return

        def gather(local: Tensor) -> list[Tensor]:
            every = [torch.empty_like(local) for _ in range(acc.num_processes)]
            torch.distributed.all_gather(every, local)
            return every

        tensors = {f"{part}.{name}": t.to(acc.device) for part, state in self._state_tensors().items()
                   for name, t in state.items() if local(t) is t}  # each rank's shards differ by design
        found = first_difference(tensors, gather)
        if found is not None:
            name, rank = found
            raise TrainingError(f"after step {self.step}, rank {rank} holds another {name} than rank 0 (checked by "
                                "train.check_consistency after each checkpoint): a buffer updated from one rank's "
                                "data, or an update one rank skipped; the checkpoint was written from rank 0")

    def _best_score(self) -> float | None:
        name = self.run.train.keep_best
        if name is None or self.last_eval.get("step") != self.step:
            return None
        return float(self.last_eval[name])

    def _write_main_state(self, tmp: Path, skeletons: dict[str, Any]) -> None:
        """What the main process writes: the weights, EMA and optimizer state (sharded: only the optimizer
        states' skeletons, `optim/<phase>.json`), the grad scaler, and trainer_state.json."""
        acc = self.accelerator
        if self.sharded_checkpoints:
            (tmp / "optim").mkdir()
            for phase, skeleton in skeletons.items():
                (tmp / "optim" / f"{phase}.json").write_text(json.dumps(skeleton))
        else:
            save_tensors(tmp / "model.safetensors", self.task.state_dict())
            save_tensors(tmp / "ema.safetensors", self.ema.state_dict())
            for phase in self.optimizers:
                save_state(tmp / "optim" / phase, self._optimizer_state(phase))
            for phase, saved in self.carried_optimizer_state.items():
                save_state(tmp / "optim" / phase, saved)
        if acc.scaler is not None:
            save_state(tmp / "optim" / "grad_scaler", acc.scaler.state_dict())
        optim_files = sorted(p.stem for p in (tmp / "optim").glob("*.json"))
        state = {
            "sharding": self.run.train.sharding,
            "step": self.step,
            "data_position": self.data_position,
            "rollbacks": self.rollbacks,
            "world_size": acc.num_processes,
            "global_batch": self.run.train.batch_size,
            "num_samples": dataset_size(self.dataset),  # None for a stream (webdataset shards)
            "data_slots": getattr(self.dataset, "slots", None),  # a stream's processes x workers
            "family_state": self.task.state_for_checkpoint(),
            "ema_updates": dict(self.ema.updates),  # per phase: its EMA warm-up counts its own updates
            "data_info": asdict(self.data_info),
            "inputs": {field: dict(ref) for field, ref in self.task.input_references.items()},  # referred to
            "eval": self.last_eval if self.last_eval.get("step") == self.step else None,
            "optim_files": optim_files,  # what verify_checkpoint requires in optim/
        }
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1))

    def _load_weights(self, module: nn.Module, tensors: dict[str, Tensor], fresh: set[int], name: str) -> None:
        """Load `tensors` into `module`; only parameters in `fresh` (of phases the checkpoint never trained) may be
        absent from it, and keep their initial values."""
        missing, unexpected = module.load_state_dict(tensors, strict=False)
        params = dict(module.named_parameters())
        lacking = [k for k in missing if k not in params or id(params[k]) not in fresh]
        if lacking or unexpected:
            raise CheckpointError(f"{name} does not match this model: missing {lacking[:5]}, unexpected "
                                  f"{unexpected[:5]}")
        if missing and self.accelerator.is_main_process:
            print(f"genforge: {name} has no weights for {len(missing)} tensors of a phase added since (e.g. "
                  f"{missing[0]}): they start from their initial values", file=sys.stderr)

    def verify_for_resume(self, path: Path) -> None:
        """`verify_checkpoint` with everything resuming needs, against this run's model and EMA (weights of a phase
        the checkpoint never trained may be absent); raises CheckpointReadError naming the file."""
        new_phases = [p for p in self.task.phase_names() if not (path / "optim" / f"{p}.json").exists()]
        fresh = {id(p) for phase in new_phases for p in self.task.parameters_for(phase)}
        params = dict(self.task.named_parameters())
        verify_checkpoint(path, expected_tensors(self.task.state_dict()),
                          expected_ema=expected_tensors(self.ema.state_dict()),
                          may_lack={n for n, p in params.items() if id(p) in fresh},
                          ema_may_lack={n for n, p in self.task.ema_module().named_parameters() if id(p) in fresh},
                          resume=True)

    def choose_checkpoint(self) -> tuple[Path | None, list[str]]:
        """The checkpoint to resume from: the newest that verifies. The main process moves each damaged newer one
        aside (`damaged-step-...`) and points `latest` at the one used; every rank gets the same decision. Returns
        it (None: start from step 0) and a line per checkpoint moved aside. CheckpointReadError when none is
        usable (nothing is moved then)."""
        acc = self.accelerator
        decision: list[Any] = [None]
        if acc.is_main_process:
            try:
                chosen, rejected = newest_usable(self.checkpoints, self.verify_for_resume)
                notes = []
                for path, why in rejected:
                    if path.is_dir():
                        moved = self.checkpoints.move_aside(path)
                        notes.append(f"checkpoint {path.name} is damaged ({why}); moved aside to {moved}")
                    else:
                        notes.append(why)
                if chosen is not None and rejected:
                    notes.append(f"resuming from the previous checkpoint {chosen.name}")
                marker = self.checkpoints.root / "latest"
                named = marker.read_text().strip() if marker.is_file() else None  # missing: killed before its write
                if chosen is not None and named != chosen.name:
                    self.checkpoints.set_latest(chosen)  # after a fallback, or a kill between rename and `latest`
                decision = [{"chosen": str(chosen) if chosen else None, "notes": notes}]
            except (CheckpointReadError, OSError) as err:
                decision = [{"error": str(err)}]
        broadcast_object_list(decision)
        if "error" in decision[0]:
            raise CheckpointReadError(decision[0]["error"])
        chosen = decision[0]["chosen"]
        return (Path(chosen) if chosen else None), decision[0]["notes"]

    def resume_changes(self) -> list[ConfigChange]:
        """What this run's config changes from the run directory's config.yaml (the run being resumed), by
        `TrainingRun.changes_from`; its ConfigError (a change a resume may not make) on every rank. Decided by the
        main process."""
        acc = self.accelerator
        decision: list[Any] = [None]
        if acc.is_main_process:
            try:
                decision = [{"changes": self.run.changes_from(self.run_dir)}]
            except ConfigError as err:
                decision = [{"error": str(err)}]
        if acc.num_processes > 1:
            decision = broadcast_object_list(decision)
        if "error" in decision[0]:
            raise ConfigError(decision[0]["error"])
        changes = decision[0]["changes"]
        if changes is None:
            if acc.is_main_process:
                print(f"genforge: warning: {self.run_dir} has no config.yaml to compare this config with; resuming "
                      "as configured", file=sys.stderr)
            return []
        return changes

    def record_config_changes(self, changes: list[ConfigChange]) -> None:
        """Say and record (config-history.jsonl: step, time, field, old, new) the changes a resume applies."""
        if not changes:
            return
        print("genforge: resuming with a changed config: " + "; ".join(map(str, changes)), file=sys.stderr)
        entry = {"step": self.step, "time": round(time.time(), 3),
                 "changes": [{"field": c.field, "old": c.old, "new": c.new} for c in changes]}
        with open(self.run_dir / "config-history.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")

    def initialise_from(self, source: str) -> str:
        """Start this fresh run from the model and EMA weights of the checkpoint `source` names (train.init_from: a
        run directory, its newest usable checkpoint; or one checkpoint folder), either layout, into this run's
        weights as they are laid out (every rank the same whole weights; under train.sharding=fsdp each rank its
        shards of them). The optimizers, schedulers, step, data position, RNG and family state stay fresh. Returns
        the line it logs. ConfigError (exit 2) starting `train.init_from=<source>:` when there is no usable checkpoint
        there, or when its weights do not fit this model exactly (a missing or unexpected tensor, another shape)."""
        acc = self.accelerator
        decision: list[Any] = [None]
        if acc.is_main_process:  # one choice for every rank, even if the source run writes a checkpoint meanwhile
            try:
                chosen, passed_over = source_checkpoint(Path(source))
                decision = [{"chosen": str(chosen), "notes": [why for _, why in passed_over]}]
            except (CheckpointReadError, OSError) as err:
                decision = [{"error": str(err)}]
        if acc.num_processes > 1:
            decision = broadcast_object_list(decision)
        if "error" in decision[0]:
            raise ConfigError(f"train.init_from={source}: {decision[0]['error']}")
        path, error = Path(decision[0]["chosen"]), None
        try:
            weights = {"model": read_weights(path, "model", str(acc.device)),
                       "ema": read_weights(path, "ema", str(acc.device))}
            step = int(read_json(path / "trainer_state.json")["step"])
            for part, current in self._state_tensors().items():
                mismatch = weights_mismatch(weights[part], current)
                if mismatch:
                    error = (f"train.init_from={source}: the {part} weights of {path} do not fit this model ("
                             f"{mismatch}); it takes a checkpoint of the same model")
                    break
        except CheckpointReadError as err:
            error = f"train.init_from={source}: {err}"
        if self._any_rank(error is not None):
            raise ConfigError(error or f"train.init_from={source}: another process could not read {path}")
        with torch.no_grad():  # the whole weights, laid out as this run's (a sharded run: each rank its shards)
            current = self.task.state_dict()
            self.task.load_state_dict({k: laid_out_like(t, current[k]) for k, t in weights["model"].items()})
            shadow = self.ema.state_dict()
            self.ema.load_state_dict({k: laid_out_like(t, shadow[k]) for k, t in weights["ema"].items()})
        line = f"initialised from {path} (step {step})"
        if acc.is_main_process:
            for note in decision[0]["notes"]:
                print(f"genforge: warning: train.init_from={source}: passed over a checkpoint: {note}", file=sys.stderr)
            print(f"genforge: {line}", file=sys.stderr)
        return line

    def load_checkpoint(self, path: Path, skip: Iterable[str] = ()) -> None:
        """Restore everything `save_checkpoint` wrote (safetensors/JSON only; nothing is unpickled). `skip`
        names STATE_PIECES to leave as they are (fault-injection tests)."""
        acc, skip = self.accelerator, set(skip)
        unknown = skip - set(STATE_PIECES)
        if unknown:
            raise ValueError(f"unknown state pieces {sorted(unknown)}; known: {', '.join(STATE_PIECES)}")
        state = read_json(path / "trainer_state.json")
        check_references(state.get("inputs", {}), self.task.input_references, path)
        # weights of a phase added since the checkpoint (e.g. a token critic after its generator) start fresh
        new_phases = [p for p in self.task.phase_names() if not (path / "optim" / f"{p}.json").exists()]
        fresh = {id(p) for phase in new_phases for p in self.task.parameters_for(phase)}
        saved_phases = [p for p in self.task.phase_names() if p not in new_phases]
        if (path / SHARDS).is_dir():
            weights, ema_weights, optimizer_states = self._read_sharded(path, saved_phases, skip)
        else:
            device = str(acc.device)
            weights = load_tensors(path / "model.safetensors", device) if "model" not in skip else None
            ema_weights = load_tensors(path / "ema.safetensors", device) if "ema" not in skip else None
            optimizer_states = {phase: load_state(path / "optim" / phase) for phase in saved_phases}
        if weights is not None:
            self._load_weights(self.task, weights, fresh, path.name)
        if ema_weights is not None:
            new_averaged = {n for n, p in self.task.ema_module().named_parameters() if id(p) in fresh}
            self.ema.load_state_dict(ema_weights, may_lack=new_averaged)
        if "ema" not in skip:
            self.ema.load_updates(self._ema_updates(state, saved_phases))
        for phase in self.task.phase_names():
            if phase not in optimizer_states:
                if phase in self.optimizers and acc.is_main_process:
                    print(f"genforge: {path.name} has no optimizer state of phase {phase!r} (not trained before): "
                          "it starts with a fresh optimizer", file=sys.stderr)
                continue
            saved = optimizer_states[phase]
            if phase not in self.optimizers:  # not trained in this run: written back unchanged
                self.carried_optimizer_state[phase] = saved
                continue
            if "optimizer" not in skip:
                self.optimizers[phase].load_state_dict(saved["optimizer"])
            if "scheduler" not in skip:
                self.schedulers[phase].load_state_dict(saved["scheduler"])
        if acc.scaler is not None and (path / "optim" / "grad_scaler.json").exists() and "grad_scaler" not in skip:
            acc.scaler.load_state_dict(load_state(path / "optim" / "grad_scaler"))
        rng = path / "rng" / f"rank-{acc.process_index}.json"
        if rng.exists() and "rng" not in skip:
            set_global_rng_state(load_state(rng.with_suffix("")))
        if "family" not in skip:
            self.task.load_state_from_checkpoint(state["family_state"])
        if "step" not in skip:
            self.step = int(state["step"])
        if "data_position" not in skip:
            self.data_position = int(state.get("data_position", state["step"]))
        self.rollbacks = int(state.get("rollbacks", 0))
        self.last_eval = state.get("eval") or {}
        same_order = ((state["global_batch"], state["num_samples"], state.get("data_slots")) ==
                      (self.run.train.batch_size, dataset_size(self.dataset), getattr(self.dataset, "slots", None)))
        if not same_order and acc.is_main_process:
            print(f"genforge: batch size, data set size or (shards) processes x data.num_workers changed since "
                  f"{path.name}; the data order "
                  "from here on differs from an uninterrupted run", file=sys.stderr)

    def _ema_updates(self, state: dict[str, Any], saved_phases: list[str]) -> dict[str, int]:
        """Each phase's EMA update count in the checkpoint's trainer_state.json; a checkpoint written before the
        counts were kept: the global step for the phases it had trained (what their warm-up counted then), 0 for
        the others (they start fresh)."""
        saved = state.get("ema_updates")
        if saved is None:
            saved = {phase: int(state["step"]) for phase in saved_phases}
        return {**{phase: 0 for phase in self.task.phase_names()}, **saved}

    def _read_sharded(self, path: Path, phases: list[str], skip: set[str]) -> tuple[
            dict[str, Tensor] | None, dict[str, Tensor] | None, dict[str, Any]]:
        """The weights, EMA and optimizer states of `phases` from a sharded checkpoint, read (a collective) into
        tensors laid out as this run's: each rank its own shards at this world size, whatever the checkpoint's."""
        shards = sharded_tensors(path / SHARDS, read_json(path / "trainer_state.json").get("world_size"))
        template: dict[str, Tensor] = {}
        for part, tensors in self._state_tensors().items():
            if part not in skip:  # weights of a phase new since the checkpoint are not in it
                template.update({f"{part}.{k}": t for k, t in tensors.items() if f"{part}.{k}" in shards})
        skeletons = {phase: read_json(path / "optim" / f"{phase}.json") for phase in phases}
        for phase, skeleton in skeletons.items():
            if phase not in self.optimizers:  # a phase this run does not train: kept whole, as loaded
                template.update({k: torch.empty(shards[k][1], dtype=SAFETENSORS_TO_TORCH[shards[k][0]])
                                 for k in tensor_refs(skeleton)})
                continue
            materialize_state(self.optimizers[phase])  # DCP loads into existing tensors
            current: dict[str, Tensor] = {}
            flatten_state(self._optimizer_state(phase), current, f"optim.{phase}", copy=False)
            if set(tensor_refs(skeleton)) != set(current):
                raise CheckpointReadError(f"{path / 'optim' / f'{phase}.json'} holds the optimizer state of other "
                                          f"parameters than this model's phase {phase!r}")
            template.update(current)
        load_shards(path / SHARDS, template)
        parts = {part: None if part in skip else {k[len(part) + 1:]: t for k, t in template.items()
                                                  if k.startswith(f"{part}.")} for part in ("model", "ema")}
        return parts["model"], parts["ema"], {p: unflatten_state(s, template) for p, s in skeletons.items()}

    # ------------------------------------------------------------------------------------- one step
    def _batches(self) -> Iterator[dict[str, Any]]:
        """This rank's micro-batches from global batch `data_position` on, on the device."""
        acc = self.accelerator
        loader = build_train_batches(self.dataset, self.run.data, self.run.train, acc.num_processes,
                                     acc.process_index, self.data_position, pin_memory=acc.device.type == "cuda")
        for batch in loader:
            skipped = batch.pop("skipped")
            self.skips.record(len(batch.get("key", ())), skipped, self.step)
            yield {k: v.to(self.accelerator.device, non_blocking=True) if isinstance(v, Tensor) else v
                   for k, v in batch.items()}

    def train_step(self, batches: list[dict[str, Any]], logs: StepLogs) -> Tensor:
        """One optimizer step of every phase; returns whether each phase's loss and gradient norm were finite (a
        bool tensor [phases], left on the device: a non-finite phase's update is skipped on the device by a fused
        AdamW, see `_optimizer_step`). The schedulers step once the caller has read it (`_finish_step`)."""
        acc, tc = self.accelerator, self.run.train
        flags: list[Tensor] = []
        micro = tc.batch_size // (tc.grad_accum * acc.num_processes)
        global_batch = self._global_fields(batches, micro)
        for phase_index, phase in enumerate(self.task.phases):
            opt = self.optimizers[phase]
            self.model.zero_grad(set_to_none=True)
            total = torch.zeros((), device=acc.device)
            for m, batch in enumerate(batches):
                size = next(len(v) for v in batch.values() if isinstance(v, (Tensor, list)))
                offset = (m * acc.num_processes + acc.process_index) * micro  # rows of the global batch
                batch["rng"] = BatchRandom(tc.seed, self.step, phase_index, tc.batch_size, offset, size, acc.device)
                if global_batch:
                    batch["global_batch"] = global_batch
                last = m == len(batches) - 1
                missing = batch.pop("missing", {})
                with self._gradient_sync(last), acc.autocast():
                    try:
                        loss, extra = self.model(batch, phase, self.step)
                    except KeyError as err:
                        raise _missing_field(err, batch, missing) from None
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

    def _global_fields(self, batches: list[dict[str, Any]], micro: int) -> dict[str, Tensor]:
        """The task's `global_fields` that this step's batches have, for every sample of the global batch [G, ...]
        in BatchRandom's row order (micro-batch m of rank p holds rows (m·P + p)·micro onwards): this rank's
        micro-batches, each padded to `micro` rows with zeros (a stream's micro-batch short of its unreadable
        records), gathered over the processes. Every rank's batches have the same fields (data config)."""
        acc, gathered = self.accelerator, {}
        for name in self.task.global_fields:
            if name not in batches[0]:
                continue
            rows = [b[name] for b in batches]
            local = torch.stack([torch.cat([v, v.new_zeros(micro - len(v), *v.shape[1:])]) for v in rows])
            if acc.num_processes > 1:  # [A, micro, ...] from each rank, as integers (gloo gathers no bool)
                local = acc.gather(local[None].long()).to(local.dtype)  # [P, A, micro, ...]
                local = local.transpose(0, 1)  # [A, P, micro, ...]
            gathered[name] = local.reshape(-1, *rows[0].shape[1:])  # [G, ...]
        return gathered

    def _optimizer_step(self, phase: str, finite: Tensor) -> Tensor:
        """Step the phase's optimizer unless `finite` is false; returns whether the step counts. A fused AdamW skips
        on the device (its `found_inf`: no weight, moment or step count changes), so no host sync is needed here;
        any other optimizer needs the host to know. fp16: the grad scaler skips and rescales by itself, the step
        counts, and the scheduler steps here when the scaler did not skip."""
        opt = self.optimizers[phase]
        inner = getattr(opt, "optimizer", opt)  # accelerate's wrapper
        if self.run.train.precision == "fp16":
            opt.step()
            if not self.accelerator.optimizer_step_was_skipped:
                self.schedulers[phase].step()
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
                self.schedulers[phase].step()
        return not any(skipped), signum

    def _gradient_sync(self, sync: bool) -> Any:
        """A context in which backward reduces the gradients over processes only when `sync` (the last
        micro-batch of a step)."""
        if self.sharded:
            gradient_sync(self.task, sync)
            return nullcontext()
        return nullcontext() if sync else self.accelerator.no_sync(self.model)

    @contextmanager
    def _full_weights(self) -> Iterator[None]:
        """The whole weights on every rank of a sharded task (sampling, evaluation); gathered in the training
        precision (bf16 under train.precision=bf16), so the networks then run under autocast as in training."""
        if not self.sharded:
            yield
            return
        with full_weights(self.task), self.accelerator.autocast():
            yield

    # -------------------------------------------------------------------------------------- cadences
    def _due(self, every: int) -> bool:
        return (every > 0 and self.step % every == 0) or self.step == self.run.train.steps

    @torch.no_grad()
    def sample_grid(self) -> Path | None:
        """Preview grid from the EMA weights, written by the main process (a sharded task samples on every rank,
        with the weights gathered). A task with `preview_online` is also handed the same samples (same conditions
        and seed) from the online weights as cond["online"] for its preview, e.g. a tokenizer's reconstructions by
        both beside each other (muse-maskgit-pytorch's trainer)."""
        main = self.accelerator.is_main_process
        if not (main or self.sharded) or not self.task.makes_samples:
            return None
        seed, n, device = self.run.train.seed, self.run.train.num_samples, self.accelerator.device
        options = self.task.preview_options(self.run.train)
        self.task.eval()
        online = None
        if self.task.preview_online:
            gen = torch.Generator(device=device).manual_seed(seed)
            with self._full_weights():
                online = self.task.sample(self.task.sample_conditions(n, gen, options), gen, n, options)
        gen = torch.Generator(device=device).manual_seed(seed)
        path = None
        with self.ema.swapped_in(), self._full_weights():
            cond = self.task.sample_conditions(n, gen, options)
            images = self.task.sample(cond, gen, n, options)
            if online is not None:
                cond["online"] = online
            if main:  # a task's preview may run its networks (a dvae's soft reconstructions)
                path = write_samples(self.task, cond, images, self.run_dir / "samples" / step_dir_name(self.step))
        self.task.train()
        if path is None:
            return None
        self.logger.image(self.step, "samples", path)
        return path

    @torch.no_grad()
    def validation_loss(self) -> dict[str, float]:
        """The loss of every phase on the first `eval.val_loss_batches` held-out batches (the val split where the
        data has one), each with the same noise at every evaluation, so values are comparable across steps."""
        tc, batches = self.run.train, self.run.eval.val_loss_batches
        samples = list(heldout_samples(self.run.data, batches * tc.batch_size))
        if not samples:
            raise TrainingError(f"eval.val_loss_batches={batches}: no readable held-out samples")
        totals = {phase: 0.0 for phase in self.task.phases}
        chunks = [samples[i : i + tc.batch_size] for i in range(0, len(samples), tc.batch_size)]
        for index, chunk in enumerate(chunks):
            batch = collate(chunk)
            batch.pop("skipped")
            batch.pop("missing", None)
            batch = {k: v.to(self.accelerator.device) if isinstance(v, Tensor) else v for k, v in batch.items()}
            for phase_index, phase in enumerate(self.task.phases):
                batch["rng"] = BatchRandom(tc.seed, index, phase_index, len(chunk), 0, len(chunk), self.accelerator.device)
                with self.accelerator.autocast():
                    totals[phase] += float(self.task.loss(batch, phase, self.step)[0]) / len(chunks)
        results = {f"val/{phase}/loss": value for phase, value in totals.items()}
        results["val_loss"] = sum(totals.values())
        return results

    def evaluate(self) -> dict[str, Any]:
        """Evaluation metrics of the EMA weights (and the validation loss, with eval.val_loss_batches). Every rank
        takes part (generators: each samples its share, see genforge.eval.run); the main process writes and logs the
        results, the others get an empty dict."""
        self.task.eval()
        results: dict[str, Any] = {}
        with self.ema.swapped_in(), self._full_weights():
            if self.run.eval.metrics != []:
                results = evaluate_task(self.task, self.run.data, self.run.eval, self.run.eval.metrics,
                                        self.run.eval.n, seed=self.run.train.seed, device=self.accelerator.device)
            if self.run.eval.val_loss_batches:
                results.update(self.validation_loss())
        self.task.train()
        if not self.accelerator.is_main_process:
            return {}
        write_eval_results(self.run_dir, self.step, results)
        self.logger.scalars(self.step, {f"eval/{k}": v for k, v in results.items() if isinstance(v, float)})
        for k, v in results.items():
            if k.endswith("_histogram"):
                self.logger.histogram(self.step, f"eval/{k}", v)
        self.last_eval = {"step": self.step, **results}
        return results

    def _check_bad_data(self) -> None:
        """Stop when the share of unreadable samples (all ranks) passes data.max_bad_fraction."""
        counts = torch.tensor([self.skips.reads, self.skips.bad], dtype=torch.float64, device=self.accelerator.device)
        reads, bad = (self.accelerator.reduce(counts, reduction="sum") if self.accelerator.num_processes > 1
                      else counts).tolist()
        limit = self.run.data.max_bad_fraction
        if reads >= MIN_READS_FOR_BAD_FRACTION and bad > limit * reads:
            raise TrainingError(f"{bad:.0f} of {reads:.0f} samples read were unreadable ({bad / reads:.1%} > "
                                f"data.max_bad_fraction={limit}); see {self.run_dir / 'skipped.jsonl'}")

    def _after_nonfinite(self) -> bool:
        """Count a skipped step; past train.max_nonfinite_skips stop or roll back. True after a rollback."""
        tc = self.run.train
        self.nonfinite_in_a_row += 1
        if self.accelerator.is_main_process:
            print(f"genforge: step {self.step}: non-finite loss or gradient, step skipped "
                  f"({self.nonfinite_in_a_row} in a row)", file=sys.stderr)
        if self.nonfinite_in_a_row < tc.max_nonfinite_skips:
            return False
        latest = self.checkpoints.latest()
        if tc.on_nonfinite == "stop" or latest is None or self.rollbacks >= tc.max_rollbacks:
            why = "" if tc.on_nonfinite == "stop" else (
                " and no checkpoint to roll back to" if latest is None else
                f" after {self.rollbacks} rollbacks (train.max_rollbacks={tc.max_rollbacks})")
            raise TrainingError(f"{self.nonfinite_in_a_row} non-finite steps in a row (train.max_nonfinite_skips="
                                f"{tc.max_nonfinite_skips}){why}; lower train.lr or check the data. The last "
                                f"checkpoint is {latest}")
        failed_at = self.data_position  # the batch after the last one that failed
        self.load_checkpoint(latest)
        self.data_position = failed_at  # skip every batch from the checkpoint to the failure
        self.rollbacks += 1
        self.nonfinite_in_a_row = 0
        if self.accelerator.is_main_process:
            print(f"genforge: rolled back to {latest.name} (step {self.step}); skipping the data up to the "
                  f"failure (rollback {self.rollbacks} of {tc.max_rollbacks})", file=sys.stderr)
        return True

    # ------------------------------------------------------------------------------------------- fit
    def fit(self, stop_at: int | None = None) -> Path:
        """Train to `train.steps` (or stop after step `stop_at`, as if interrupted); returns the run dir. Holds the
        run directory's lock throughout (RunDirectoryLocked when another trainer has it).
        SIGTERM/SIGINT/SIGUSR1 end the run after a checkpoint by raising Preempted."""
        self._take_lock()
        try:
            return self._fit(stop_at)
        finally:
            if self.lock is not None:
                self.lock.release()
                self.lock = None

    def _take_lock(self) -> None:
        """The main process takes the run directory's lock (genforge.engine.lock); every rank raises
        RunDirectoryLocked, naming the holder, when another process has it."""
        refused = [""]
        self.lock = None
        if self.accelerator.is_main_process:
            try:
                self.lock = RunLock.acquire(self.run_dir)
            except RunDirectoryLocked as err:
                refused = [str(err)]
        if self.accelerator.num_processes > 1:
            refused = broadcast_object_list(refused)
        if refused[0]:
            raise RunDirectoryLocked(refused[0])

    def _fit(self, stop_at: int | None) -> Path:
        acc, cfg = self.accelerator, self.run
        if acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.checkpoints.clean_incomplete()
        acc.wait_for_everyone()
        # a run to resume (a `latest` marker): its config first, so a changed model is named, not a mismatch
        changes = self.resume_changes() if (self.checkpoints.root / "latest").is_file() else []
        latest, notes = self.choose_checkpoint()
        if acc.is_main_process:
            for note in notes:
                print(f"genforge: warning: {note}", file=sys.stderr)
        changes = changes if latest is not None else []
        initialised = None
        if latest is not None:
            self.load_checkpoint(latest)
            for phase, optimizer in self.optimizers.items():  # a changed lr, schedule, ... takes effect
                apply_optimizer_settings(optimizer, self.schedulers[phase], self.phase_train[phase])
            if acc.is_main_process:
                print(f"genforge: resumed from {latest} (step {self.step})", file=sys.stderr)
        elif cfg.train.init_from is not None:  # a fresh run only: a resume loads its own checkpoint instead
            initialised = self.initialise_from(cfg.train.init_from)
        if acc.is_main_process:  # only once the checkpoint fits: a refused resume leaves config.yaml as it was
            self.record_config_changes(changes)
            write_atomically(self.run_dir / "config.yaml", cfg.config_yaml)
        self.logger = RunLogger(self.run_dir, cfg.log, cfg.config_dict, resume_step=self.step) \
            if acc.is_main_process else None
        for note in notes if self.logger else ():
            self.logger.event(self.step, "checkpoint_fallback", note)
        if changes and self.logger:
            self.logger.event(self.step, "config_change", "; ".join(map(str, changes)))
        if initialised and self.logger:
            self.logger.event(self.step, "init_from", initialised)
        first_step, start = self.step, time.perf_counter()
        try:
            with StopRequests() as stop:
                self._loop(stop, stop_at)
        except RuntimeError as err:
            if isinstance(err, (TrainingError, CheckpointError)) or not _collective_failure(err):
                raise
            raise TrainingError(f"rank {acc.process_index}: a collective operation failed, so another process "
                                f"died or hung (train.dist_timeout_s={cfg.train.dist_timeout_s}): {err}") from err
        finally:
            if self.logger:
                self.logger.close()
        if acc.is_main_process:
            console().info(self._summary(first_step, time.perf_counter() - start))
        acc.wait_for_everyone()
        return self.run_dir

    def _summary(self, first_step: int, seconds: float) -> str:
        """The closing line of a run: the steps trained and their wall time, the last losses, checkpoint, samples
        and evaluation."""
        total = self.run.train.steps
        if self.step == first_step:
            return f"nothing to train: {self.run_dir} is at step {self.step} of {total}"
        parts = [f"trained steps {first_step + 1}-{self.step} of {total} in {duration(seconds)}"]
        losses = {k: v for k, v in self.last_logged.items() if k == "loss" or k.endswith("/loss")}
        if losses:
            parts.append("last " + ", ".join(f"{k} {v:.4g}" for k, v in losses.items()))
        if self.last_checkpoint is not None:
            parts.append(f"checkpoint {self.last_checkpoint}")
        if self.last_samples is not None:
            parts.append(f"samples {self.last_samples}")
        scores = {k: v for k, v in self.last_eval.items() if isinstance(v, float)}
        if scores:
            parts.append(f"evaluation at step {self.last_eval['step']}: "
                         + ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))
        return "; ".join(parts)

    def _loop(self, stop: StopRequests, stop_at: int | None) -> None:
        acc, cfg, tc = self.accelerator, self.run, self.run.train
        # a bar on a terminal (log.progress); a plain line per logged step anywhere else (a log file, a cluster job)
        show_bar = acc.is_main_process and cfg.log.progress and sys.stderr.isatty()
        bar = tqdm(total=tc.steps, initial=self.step, disable=not show_bar, dynamic_ncols=True,
                   desc=self.run_dir.name, file=sys.stderr)
        lines = StepLines(tc.steps, self.step) if acc.is_main_process and not show_bar else None
        logs, last_time, last_step = StepLogs(), time.perf_counter(), self.step
        self.task.train()
        batches = self._batches()
        while self.step < tc.steps:
            flags = self.train_step([next(batches) for _ in range(tc.grad_accum)], logs)
            finite, signum = self._finish_step(flags, stop.signum or 0)
            self.task.end_step(self.step)
            self.data_position += 1
            if not finite:
                if self._after_nonfinite():
                    batches = self._batches()  # restart the data stream past the skipped batches
                    bar.reset(total=tc.steps)
                    bar.update(self.step)
                    continue
            else:
                self.ema.update()
                self.nonfinite_in_a_row = 0
            self.step += 1
            bar.update(1)
            if self._due(tc.log_every):
                values = logs.reduce(acc)
                now = time.perf_counter()
                values["samples_per_s"] = (self.step - last_step) * tc.batch_size / max(now - last_time, 1e-9)
                values["lr"] = self.schedulers[self.task.phases[0]].get_last_lr()[0]
                values["skipped_samples"] = float(self.skips.bad)
                last_time, last_step = now, self.step
                self.last_logged = values
                if self.logger:
                    self.logger.scalars(self.step, values)
                    bar.set_postfix({k: f"{v:.4g}" for k, v in values.items()
                                     if k in ("loss", "lr", "samples_per_s") or k.endswith("/loss")})
                if lines:
                    console().info(lines.line(self.step, values))
                self._check_bad_data()
            if self._due(tc.sample_every):
                self.last_samples = self.sample_grid() or self.last_samples
            if cfg.eval.every and self._due(cfg.eval.every):
                self.evaluate()
            if self._due(tc.checkpoint_every) or signum:
                checkpoint = self.last_checkpoint = self.save_checkpoint()
                if signum:
                    bar.close()
                    raise Preempted(signum, self.step, checkpoint)
            if stop_at is not None and self.step >= stop_at:
                break
        bar.close()
