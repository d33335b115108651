"""What a checkpoint holds, and writing it: the task's weights, the EMA, each phase's optimizer and scheduler, the
grad scaler, every rank's RNG, the counters and the family's own state (`TrainState`). Reading it back is
genforge.engine.resume's; the folder layout is genforge.engine.checkpoint's."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import Tensor
from torch.distributed.checkpoint.api import CheckpointException

from genforge.core.config import TrainConfig
from genforge.core.random import global_rng_state
from genforge.core.task import Task
from genforge.data.base import DataInfo
from genforge.data.loader import dataset_size
from genforge.engine.checkpoint import (EMA_PART, GRAD_SCALER, MODEL_PART, OPTIM, POWER_EMA, SHARDS, WRITE_ERRORS,
                                        CheckpointDir, CheckpointError, flatten_state, nonfinite_tensors,
                                        optimizer_stem, rng_stem, save_state, saved_optimizer_states, step_dir_name,
                                        write_trainer_state, write_weights)
from genforge.core.collectives import any_rank, main_decides
from genforge.engine.consistency import first_difference
from genforge.engine.ema import EMA
from genforge.engine.phema import SnapshotDir
from genforge.engine.sharding import local, save_shards, whole


class TrainingError(RuntimeError):
    """The run cannot go on (too many non-finite steps, too much bad data, a dead peer); the message says why."""


@dataclass
class TrainState:
    """Everything a run's checkpoint holds, and where it is written. `optimizers` and `schedulers` are those of the
    phases this run trains; `carried` the saved optimizer states of phases it does not train, written back as
    loaded. `data_position` counts the global batches consumed (ahead of `step` after a rollback skipped data)."""

    accelerator: Accelerator
    train: TrainConfig
    task: Task
    ema: EMA
    optimizers: dict[str, Any]
    schedulers: dict[str, Any]
    checkpoints: CheckpointDir
    snapshots: SnapshotDir  # train.ema.kind=power: RUN/ema_snapshots/
    dataset: Any
    data_info: DataInfo
    sharded: bool  # the weights are split over the processes (train.sharding=fsdp, several processes)
    step: int = 0
    data_position: int = 0
    rollbacks: int = 0
    last_eval: dict[str, Any] = field(default_factory=dict)
    carried: dict[str, Any] = field(default_factory=dict)

    @property
    def sharded_checkpoints(self) -> bool:
        """Checkpoints in the sharded layout (train.sharding=fsdp, whatever the number of processes)."""
        return self.train.sharding == "fsdp"

    def tensors(self) -> dict[str, dict[str, Tensor]]:
        """The weights and EMA by part ("model", "ema", and with train.ema.kind=power and more than one σ_rel
        "power_ema", the other averages); under sharding each rank's shards."""
        parts = {MODEL_PART: self.task.state_dict(), EMA_PART: self.ema.state_dict()}
        if self.ema.power_shadows:
            parts[POWER_EMA] = self.ema.power_state_dict()
        return parts

    def optimizer_state(self, phase: str) -> dict[str, Any]:
        return {"optimizer": self.optimizers[phase].state_dict(), "scheduler": self.schedulers[phase].state_dict()}

    def data_order(self) -> tuple[Any, ...]:
        """What fixes the order of the data from a position on: the global batch, the data set's size and (a
        stream) its processes x workers."""
        return self.train.batch_size, dataset_size(self.dataset), getattr(self.dataset, "slots", None)

    # ------------------------------------------------------------------------------------------ writing
    def save(self) -> Path:
        """Write a checkpoint of this step: every rank its RNG state (and in the sharded layout its shards of the
        weights, EMA and optimizer state, in parallel), the main process the rest; committed atomically. A write
        error removes this checkpoint's files, keeps the previous `latest`, and raises CheckpointError; non-finite
        weights raise TrainingError before anything is written."""
        acc = self.accelerator
        bad = self._nonfinite()
        if bad:
            raise TrainingError(f"refusing to write a checkpoint at step {self.step} holding non-finite "
                                f"values in {', '.join(bad[:5])}")
        shards, skeletons = self._sharded() if self.sharded_checkpoints else ({}, {})
        error: BaseException | None = None
        tmp: list[Path] = []  # the main process's staging folder, once created

        def stage() -> str:
            nonlocal error
            try:
                tmp.append(self.checkpoints.staging(self.step))
                self._write_main_state(tmp[0], skeletons)
                return str(tmp[0])
            except WRITE_ERRORS as err:
                error = err
                return ""

        staged = main_decides(stage)
        if staged:
            try:
                if self.sharded_checkpoints:  # a collective: every rank writes its pieces
                    save_shards(Path(staged) / SHARDS, shards)
                save_state(rng_stem(Path(staged), acc.process_index), global_rng_state())
            except (*WRITE_ERRORS, CheckpointException) as err:
                error = error or err
        final = None
        if not any_rank(error is not None) and staged and acc.is_main_process:
            try:
                final = self.checkpoints.commit(Path(staged), self.step, self._best_score())
            except WRITE_ERRORS as err:
                error = err
        if any_rank(error is not None) or not staged:
            for folder in tmp:
                self.checkpoints.discard(folder)
            latest = self.checkpoints.latest()
            cause = f"{type(error).__name__}: {error}" if error is not None else "another rank failed to write"
            raise CheckpointError(f"rank {acc.process_index}: could not write the checkpoint of step {self.step} "
                                  f"into {self.checkpoints.root} ({cause}); the latest checkpoint is still "
                                  f"{latest.name if latest else 'none'}")
        self.check_consistency()
        return final or self.checkpoints.root / step_dir_name(self.step)

    def snapshot_ema(self) -> Path:
        """Write the power-function EMAs' snapshot of this step into RUN/ema_snapshots/ (genforge.engine.phema),
        written by the main process; under sharding every rank takes part in gathering each average whole, one
        tensor at a time. CheckpointError when it cannot be written (every rank raises)."""
        acc = self.accelerator
        main = acc.is_main_process
        averages: dict[str, Tensor] = {}
        for name, tensor in self.ema.averages().items():
            full = whole(tensor)  # a collective for a shard
            if main:
                averages[name] = full.detach().cpu()

        def write() -> str:
            phases = {phase: (t, names) for (phase, (_, names)), t in zip(self.ema.phases.items(),
                                                                           self.ema.averaged().values())}
            try:
                return str(self.snapshots.write(self.step, averages, self.train.ema.widths, self.ema.gammas, phases))
            except WRITE_ERRORS as err:
                raise CheckpointError(f"could not write the EMA snapshot of step {self.step} into "
                                      f"{self.snapshots.root} ({type(err).__name__}: {err})") from err

        return Path(main_decides(write, (CheckpointError,)))

    def _nonfinite(self) -> list[str]:
        """Weights or EMA values that are NaN or infinite (a checkpoint must not hold them): checked by the main
        process, or under sharding by every rank on its shards, every rank then learning whether any found one."""
        if not (self.accelerator.is_main_process or self.sharded):
            return []
        bad = sorted(f"{part}.{name}" for part, tensors in self.tensors().items()
                     for name in nonfinite_tensors({k: local(t) for k, t in tensors.items()}))
        if self.sharded and any_rank(bool(bad)) and not bad:
            bad = ["(the shards of another rank)"]
        return bad

    def _sharded(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """A sharded checkpoint's tensors (`model.`, `ema.`, `optim.<phase>.` names; each rank's shards, not
        copies) and the JSON skeleton of each phase's optimizer state naming its tensors among them."""
        tensors = {f"{part}.{name}": t for part, state in self.tensors().items() for name, t in state.items()}
        states = {**{phase: self.optimizer_state(phase) for phase in self.optimizers}, **self.carried}
        skeletons = {phase: flatten_state(state, tensors, f"optim.{phase}", copy=False) for phase, state in states.items()}
        return tensors, skeletons

    def _best_score(self) -> float | None:
        name = self.train.keep_best
        if name is None or self.last_eval.get("step") != self.step:
            return None
        return float(self.last_eval[name])

    def _write_main_state(self, tmp: Path, skeletons: dict[str, Any]) -> None:
        """What the main process writes: the weights, EMA and optimizer state (sharded: only the optimizer
        states' skeletons, `optim/<phase>.json`), the grad scaler, and trainer_state.json."""
        acc = self.accelerator
        if self.sharded_checkpoints:
            (tmp / OPTIM).mkdir()
            for phase, skeleton in skeletons.items():
                optimizer_stem(tmp, phase).with_suffix(".json").write_text(json.dumps(skeleton))
        else:
            write_weights(tmp, self.tensors())
            for phase, saved in {**{p: self.optimizer_state(p) for p in self.optimizers}, **self.carried}.items():
                save_state(optimizer_stem(tmp, phase), saved)
        if acc.scaler is not None:
            save_state(optimizer_stem(tmp, GRAD_SCALER), acc.scaler.state_dict())
        optim_files = saved_optimizer_states(tmp)
        global_batch, num_samples, data_slots = self.data_order()
        state = {
            "sharding": self.train.sharding,
            "step": self.step,
            "data_position": self.data_position,
            "rollbacks": self.rollbacks,
            "world_size": acc.num_processes,
            "global_batch": global_batch,
            "num_samples": num_samples,  # None for a stream (webdataset shards)
            "data_slots": data_slots,  # a stream's processes x workers
            "family_state": self.task.state_for_checkpoint(),
            "ema_updates": dict(self.ema.updates),  # per phase: its EMA warm-up counts its own updates
            "ema_gammas": list(self.ema.gammas),  # train.ema.kind=power: γ of ema, then of each power_ema index
            "data_info": asdict(self.data_info),
            "inputs": {name: dict(ref) for name, ref in self.task.input_references.items()},  # referred to
            "eval": self.last_eval if self.last_eval.get("step") == self.step else None,
            "optim_files": optim_files,  # what verify_checkpoint requires in optim/
        }
        write_trainer_state(tmp, state)

    def check_consistency(self) -> None:
        """With several processes (and train.check_consistency): every rank must hold the same weights, buffers and
        EMA; a TrainingError names the first tensor that differs (a buffer updated from one rank's data, a rank
        that skipped an update)."""
        acc = self.accelerator
        if acc.num_processes == 1 or not self.train.check_consistency:
            return

        def gather(mine: Tensor) -> list[Tensor]:
            every = [torch.empty_like(mine) for _ in range(acc.num_processes)]
            torch.distributed.all_gather(every, mine)
            return every

        tensors = {f"{part}.{name}": t.to(acc.device) for part, state in self.tensors().items()
                   for name, t in state.items() if local(t) is t}  # each rank's shards differ by design
        found = first_difference(tensors, gather)
        if found is not None:
            name, rank = found
            raise TrainingError(f"after step {self.step}, rank {rank} holds another {name} than rank 0 (checked by "
                                "train.check_consistency after each checkpoint): a buffer updated from one rank's "
                                "data, or an update one rank skipped; the checkpoint was written from rank 0")
