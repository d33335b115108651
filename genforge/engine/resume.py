"""Where a run starts: the resume subsystem. `plan_start` decides once, on the main process, for every rank: the
checkpoint to resume from (the newest that verifies; damaged newer ones moved aside), what the config changes from
the run being resumed (and whether a resume may change it), or for a fresh run the checkpoint `train.init_from`
names. `restore` loads a checkpoint into a TrainState; `initialise_from` loads only another run's weights."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import Tensor, nn

from genforge.core.codec import check_references
from genforge.core.config import ConfigChange, ConfigError
from genforge.core.random import set_global_rng_state
from genforge.engine.checkpoint import (GRAD_SCALER, POWER_EMA, SHARDS, CheckpointError, CheckpointReadError,
                                        flatten_state, load_state, optimizer_stem, read_json, read_part,
                                        read_trainer_state, rng_stem, tensor_refs, unflatten_state)
from genforge.engine.verify import (SAFETENSORS_TO_TORCH, expected_tensors, newest_usable, read_weights,
                                    sharded_tensors, source_checkpoint, verify_checkpoint, weights_mismatch)
from genforge.core.collectives import any_rank, main_decides
from genforge.engine.logging import console
from genforge.engine.optim import materialize_state
from genforge.engine.sharding import laid_out_like, load_shards
from genforge.engine.state import TrainState

# What a checkpoint restores, by name (`restore(skip=...)` lets tests prove each one matters).
STATE_PIECES = ("model", "ema", "optimizer", "scheduler", "grad_scaler", "rng", "step", "data_position",
                "family")


@dataclass
class StartPlan:
    """How a run starts, the same on every rank: from `checkpoint` (a resume; `changes` the config changes it
    applies, `notes` a line per damaged checkpoint passed over), else fresh, from the weights of `init_from` when
    set."""

    checkpoint: Path | None = None
    changes: list[ConfigChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    init_from: str | None = None


def plan_start(state: TrainState, run_dir: Path, changes_from: Callable[[Path], list[ConfigChange] | None],
               init_from: str | None) -> StartPlan:
    """The StartPlan of `run_dir`: a run to resume (a `latest` marker) has its config compared first
    (`changes_from`; a ConfigError for a change a resume may not make, so a changed model is named, not reported as
    a weights mismatch), then its newest usable checkpoint chosen (`choose_checkpoint`)."""
    marked = (state.checkpoints.root / "latest").is_file()
    changes = resume_changes(state, run_dir, changes_from) if marked else []
    checkpoint, notes = choose_checkpoint(state)
    if checkpoint is None:
        return StartPlan(notes=notes, init_from=init_from)
    return StartPlan(checkpoint, changes, notes)


def resume_changes(state: TrainState, run_dir: Path, changes_from: Callable[[Path], list[ConfigChange] | None]
                   ) -> list[ConfigChange]:
    """What this run's config changes from the run directory's config.yaml; its ConfigError (a change a resume may
    not make) on every rank. Decided by the main process."""
    changes = main_decides(lambda: changes_from(run_dir), (ConfigError,))
    if changes is None:
        if state.accelerator.is_main_process:
            console().warning(f"{run_dir} has no config.yaml to compare this config with; resuming as configured")
        return []
    return changes


def record_config_changes(run_dir: Path, step: int, changes: list[ConfigChange]) -> None:
    """Say and record (config-history.jsonl: step, time, field, old, new) the changes a resume applies."""
    if not changes:
        return
    console().info("resuming with a changed config: " + "; ".join(map(str, changes)))
    entry = {"step": step, "time": round(time.time(), 3),
             "changes": [{"field": c.field, "old": c.old, "new": c.new} for c in changes]}
    with open(run_dir / "config-history.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def _fresh_parameters(state: TrainState, path: Path) -> tuple[list[str], set[int]]:
    """The phases checkpoint `path` never trained (no optimizer state: added since, e.g. a token critic after its
    generator) and the ids of their parameters, which may be absent from it and start fresh."""
    new_phases = [p for p in state.task.phase_names() if not optimizer_stem(path, p).with_suffix(".json").exists()]
    return new_phases, {id(p) for phase in new_phases for p in state.task.parameters_for(phase)}


def verify(state: TrainState, path: Path) -> None:
    """`verify_checkpoint` with everything resuming needs, against this run's model and EMA (weights of a phase
    the checkpoint never trained may be absent); raises CheckpointReadError naming the file."""
    _, fresh = _fresh_parameters(state, path)
    task = state.task
    power = state.ema.power_state_dict()
    verify_checkpoint(path, expected_tensors(task.state_dict()),
                      expected_ema=expected_tensors(state.ema.state_dict()),
                      may_lack={n for n, p in task.named_parameters() if id(p) in fresh},
                      ema_may_lack={n for n, p in task.ema_module().named_parameters() if id(p) in fresh},
                      resume=True, expected_power_ema=expected_tensors(power) if power else None)


def choose_checkpoint(state: TrainState) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume from: the newest that verifies. The main process moves each damaged newer one
    aside (`damaged-step-...`) and points `latest` at the one used; every rank gets the same decision. Returns it
    (None: start from step 0) and a line per checkpoint moved aside. CheckpointReadError when none is usable
    (nothing is moved then)."""
    checkpoints = state.checkpoints

    def decide() -> tuple[str | None, list[str]]:
        chosen, rejected = newest_usable(checkpoints, lambda path: verify(state, path))
        notes = []
        for path, why in rejected:
            if path.is_dir():
                moved = checkpoints.move_aside(path)
                notes.append(f"checkpoint {path.name} is damaged ({why}); moved aside to {moved}")
            else:
                notes.append(why)
        if chosen is not None and rejected:
            notes.append(f"resuming from the previous checkpoint {chosen.name}")
        marker = checkpoints.root / "latest"
        named = marker.read_text().strip() if marker.is_file() else None  # missing: killed before its write
        if chosen is not None and named != chosen.name:
            checkpoints.set_latest(chosen)  # after a fallback, or a kill between rename and `latest`
        return (str(chosen) if chosen else None), notes

    chosen, notes = main_decides(decide, (CheckpointReadError, OSError),
                                 raise_as=CheckpointReadError)
    return (Path(chosen) if chosen else None), notes


def initialise_from(state: TrainState, source: str) -> str:
    """Start a fresh run from the model and EMA weights of the checkpoint `source` names (train.init_from: a run
    directory, its newest usable checkpoint; or one checkpoint folder), either layout, into the state's weights as
    they are laid out (every rank the same whole weights; under train.sharding=fsdp each rank its shards of them).
    The optimizers, schedulers, step, data position, RNG and family state stay fresh. Returns the line it logs.
    ConfigError (exit 2) starting `train.init_from=<source>:` when there is no usable checkpoint there, or when its
    weights do not fit this model exactly (a missing or unexpected tensor, another shape)."""
    acc = state.accelerator

    def decide() -> tuple[str, list[str]]:  # one choice for every rank, even if the source writes a checkpoint
        chosen, passed_over = source_checkpoint(Path(source))
        return str(chosen), [why for _, why in passed_over]

    chosen, notes = main_decides(decide, (CheckpointReadError, OSError),
                                 raise_as=lambda why: ConfigError(f"train.init_from={source}: {why}"))
    path, error = Path(chosen), None
    try:
        weights = {part: read_weights(path, part, str(acc.device)) for part in ("model", "ema")}
        step = int(read_trainer_state(path)["step"])
        for part, current in state.tensors().items():
            if part == POWER_EMA:  # a power-function EMA's first update copies the weights: nothing to start from
                continue
            mismatch = weights_mismatch(weights[part], current)
            if mismatch:
                error = (f"train.init_from={source}: the {part} weights of {path} do not fit this model ("
                         f"{mismatch}); it takes a checkpoint of the same model")
                break
    except CheckpointReadError as err:
        error = f"train.init_from={source}: {err}"
    if any_rank(error is not None):
        raise ConfigError(error or f"train.init_from={source}: another process could not read {path}")
    with torch.no_grad():  # the whole weights, laid out as this run's (a sharded run: each rank its shards)
        current = state.task.state_dict()
        state.task.load_state_dict({k: laid_out_like(t, current[k]) for k, t in weights["model"].items()})
        shadow = state.ema.state_dict()
        state.ema.load_state_dict({k: laid_out_like(t, shadow[k]) for k, t in weights["ema"].items()})
    line = f"initialised from {path} (step {step})"
    if acc.is_main_process:
        for note in notes:
            console().warning(f"train.init_from={source}: passed over a checkpoint: {note}")
        console().info(line)
    return line


def restore(state: TrainState, path: Path, skip: Iterable[str] = ()) -> None:
    """Load into `state` everything `TrainState.save` wrote (safetensors/JSON only; nothing is unpickled). `skip`
    names STATE_PIECES to leave as they are (fault-injection tests)."""
    acc, skip, task = state.accelerator, set(skip), state.task
    unknown = skip - set(STATE_PIECES)
    if unknown:
        raise ValueError(f"unknown state pieces {sorted(unknown)}; known: {', '.join(STATE_PIECES)}")
    saved = read_trainer_state(path)
    check_references(saved["inputs"], task.input_references, path)
    new_phases, fresh = _fresh_parameters(state, path)
    saved_phases = [p for p in task.phase_names() if p not in new_phases]
    power = bool(state.ema.power_shadows) and "ema" not in skip
    if (path / SHARDS).is_dir():
        weights, ema_weights, power_weights, optimizer_states = _read_sharded(state, path, saved["world_size"],
                                                                              saved_phases, skip)
    else:
        device = str(acc.device)
        weights = read_part(path, "model", device) if "model" not in skip else None
        ema_weights = read_part(path, "ema", device) if "ema" not in skip else None
        power_weights = read_part(path, POWER_EMA, device) if power else None
        optimizer_states = {phase: load_state(optimizer_stem(path, phase)) for phase in saved_phases}
    if weights is not None:
        _load_weights(task, weights, fresh, path.name, acc.is_main_process)
    new_averaged = {n for n, p in task.ema_module().named_parameters() if id(p) in fresh}
    if ema_weights is not None:
        state.ema.load_state_dict(ema_weights, may_lack=new_averaged)
    if power_weights is not None:
        state.ema.load_power_state_dict(power_weights, may_lack=new_averaged)
    if "ema" not in skip:
        state.ema.load_updates({**{phase: 0 for phase in task.phase_names()}, **saved["ema_updates"]})
    for phase in task.phase_names():
        if phase not in optimizer_states:
            if phase in state.optimizers and acc.is_main_process:
                console().info(f"{path.name} has no optimizer state of phase {phase!r} (not trained before): it "
                               "starts with a fresh optimizer")
            continue
        if phase not in state.optimizers:  # not trained in this run: written back unchanged
            state.carried[phase] = optimizer_states[phase]
            continue
        if "optimizer" not in skip:
            state.optimizers[phase].load_state_dict(optimizer_states[phase]["optimizer"])
        if "scheduler" not in skip:
            state.schedulers[phase].load_state_dict(optimizer_states[phase]["scheduler"])
    if acc.scaler is not None and GRAD_SCALER in saved["optim_files"] and "grad_scaler" not in skip:
        acc.scaler.load_state_dict(load_state(optimizer_stem(path, GRAD_SCALER)))
    rng = rng_stem(path, acc.process_index)
    if rng.with_suffix(".json").exists() and "rng" not in skip:  # a rank the writing run did not have: fresh
        set_global_rng_state(load_state(rng))
    if "family" not in skip:
        task.load_state_from_checkpoint(saved["family_state"])
    if "step" not in skip:
        state.step = int(saved["step"])
    if "data_position" not in skip:
        state.data_position = int(saved["data_position"])
    state.rollbacks = int(saved["rollbacks"])
    state.last_eval = saved["eval"] or {}
    if (saved["global_batch"], saved["num_samples"], saved["data_slots"]) != state.data_order() \
            and acc.is_main_process:
        console().info(f"batch size, data set size or (shards) processes x data.num_workers changed since "
                       f"{path.name}; the data order from here on differs from an uninterrupted run")


def _load_weights(module: nn.Module, tensors: dict[str, Tensor], fresh: set[int], name: str, say: bool) -> None:
    """Load `tensors` into `module`; only parameters in `fresh` (of phases the checkpoint never trained) may be
    absent from it, and keep their initial values."""
    missing, unexpected = module.load_state_dict(tensors, strict=False)
    params = dict(module.named_parameters())
    lacking = [k for k in missing if k not in params or id(params[k]) not in fresh]
    if lacking or unexpected:
        raise CheckpointError(f"{name} does not match this model: missing {lacking[:5]}, unexpected "
                              f"{unexpected[:5]}")
    if missing and say:
        console().info(f"{name} has no weights for {len(missing)} tensors of a phase added since (e.g. "
                       f"{missing[0]}): they start from their initial values")


def _read_sharded(state: TrainState, path: Path, world_size: int, phases: list[str], skip: set[str]) -> tuple[
        dict[str, Tensor] | None, dict[str, Tensor] | None, dict[str, Tensor] | None, dict[str, Any]]:
    """The weights, EMA, other power-function EMAs (None without) and optimizer states of `phases` from a sharded
    checkpoint written by `world_size` processes, read (a collective) into tensors laid out as this run's: each
    rank its own shards at this world size, whatever the checkpoint's."""
    shards = sharded_tensors(path / SHARDS, world_size)
    template: dict[str, Tensor] = {}
    for part, tensors in state.tensors().items():
        if part not in skip and not (part == POWER_EMA and "ema" in skip):  # weights of a phase new since the
            # checkpoint are not in it
            template.update({f"{part}.{k}": t for k, t in tensors.items() if f"{part}.{k}" in shards})
    skeletons = {phase: read_json(optimizer_stem(path, phase).with_suffix(".json")) for phase in phases}
    for phase, skeleton in skeletons.items():
        if phase not in state.optimizers:  # a phase this run does not train: kept whole, as loaded
            template.update({k: torch.empty(shards[k][1], dtype=SAFETENSORS_TO_TORCH[shards[k][0]])
                             for k in tensor_refs(skeleton)})
            continue
        materialize_state(state.optimizers[phase])  # DCP loads into existing tensors
        current: dict[str, Tensor] = {}
        flatten_state(state.optimizer_state(phase), current, f"optim.{phase}", copy=False)
        if set(tensor_refs(skeleton)) != set(current):
            raise CheckpointReadError(f"{optimizer_stem(path, phase)}.json holds the optimizer state of other "
                                      f"parameters than this model's phase {phase!r}")
        template.update(current)
    load_shards(path / SHARDS, template)
    parts = {part: None if part in skip else {k[len(part) + 1:]: t for k, t in template.items()
                                              if k.startswith(f"{part}.")} for part in ("model", "ema")}
    power = {k[len(POWER_EMA) + 1:]: t for k, t in template.items() if k.startswith(f"{POWER_EMA}.")}
    return (parts["model"], parts["ema"], power if state.ema.power_shadows and "ema" not in skip else None,
            {p: unflatten_state(s, template) for p, s in skeletons.items()})
