"""Checkpoints: atomic directories of safetensors + JSON; nothing is unpickled on load.

checkpoints/step-000500/
    model.safetensors        the task's weights
    ema.safetensors          EMA shadow weights
    optim/<phase>.*          optimizer + scheduler (+ grad scaler) state: tensors in .safetensors, the rest .json
    rng/rank-<r>.*           python / numpy / torch RNG states of each rank
    trainer_state.json       step, family state, ...

A sharded run (train.sharding=fsdp, genforge.engine.sharding) writes instead of the two weight files and the
optimizer tensors one folder, `shards/`: safetensors files written by every rank in parallel (DCP), each tensor
named `model.<name>`, `ema.<name>` or `optim.<phase>...` and each file's header saying where its pieces lie in
the whole tensors; `optim/<phase>.json` then names its tensors there.
checkpoints/latest           name of the newest complete checkpoint, written last
checkpoints/best             {"name", "value"} of the best checkpoint by train.keep_best (optional)
checkpoints/damaged-step-000600[-N]   a checkpoint that failed `verify_checkpoint` on resume, moved aside (kept)

A checkpoint is written into `.tmp-step-...`, fsynced, renamed into place, and only then named by
`latest`; a kill at any moment leaves the previous `latest` loadable, and start-up removes the debris.
Before loading, `verify_checkpoint` (genforge.engine.verify) checks a folder without reading its tensors, and
`newest_usable` picks the newest one that passes, so a damaged newest checkpoint falls back to the one before.

This module is the format: the names above, writing and reading each file, and the format's version. Every
trainer_state.json since version 2 says `format_version`; `read_trainer_state` brings an older one up to today's
by explicit steps (`UPGRADES`, as genforge.app.migrations does for configs), so readers find every key today's
writer writes and never guess a default.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from genforge.core.files import TMP_PREFIX, fsync_dir, fsync_tree, write_atomically

STEP_DIR = re.compile(r"^step-(\d{6,})$")
SHARDS = "shards"  # the folder of a sharded checkpoint's tensors (genforge.engine.sharding)
TRAINER_STATE = "trainer_state.json"
OPTIM = "optim"  # optim/<phase>.json + .safetensors, optim/grad_scaler.*
GRAD_SCALER = "grad_scaler"
RNG = "rng"  # rng/rank-<r>.json + .safetensors
MODEL_PART, EMA_PART, POWER_EMA = "model", "ema", "power_ema"  # the weight parts: <part>.safetensors (POWER_EMA: the
# power-function EMAs after the first, train.ema.kind=power)
FORMAT_VERSION = 2  # 1: trainer_state.json without `format_version` (genforge before 2026-12-02)
DAMAGED_PREFIX = "damaged-"  # checkpoints moved aside on resume; nothing lists them again


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the path and the cause."""


class CheckpointReadError(CheckpointError):
    """A checkpoint that cannot be loaded: missing, torn, or not safetensors/JSON (e.g. a pickle)."""


WRITE_ERRORS = (OSError, SafetensorError)  # safetensors reports disk-full / too-large as SafetensorError


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def flatten_state(obj: Any, tensors: dict[str, Tensor], prefix: str, copy: bool = True) -> Any:
    """JSON-able skeleton of `obj` with every tensor moved into `tensors` under a path key (`copy`: a CPU copy;
    else the tensor itself, e.g. a shard that DCP writes)."""
    if isinstance(obj, Tensor):
        tensors[prefix] = obj.detach().cpu().contiguous().clone() if copy else obj
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        if not all(isinstance(k, (str, int)) for k in obj):
            raise TypeError(f"state at {prefix!r} has non-string keys")
        return {"__dict__": [[k, flatten_state(v, tensors, f"{prefix}.{k}", copy)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        items = [flatten_state(v, tensors, f"{prefix}.{i}", copy) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} at {prefix!r} in a checkpoint")


def unflatten_state(obj: Any, tensors: Mapping[str, Tensor]) -> Any:
    """Inverse of flatten_state."""
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(unflatten_state(v, tensors) for v in obj["__tuple__"])
        return {k: unflatten_state(v, tensors) for k, v in obj["__dict__"]}
    if isinstance(obj, list):
        return [unflatten_state(v, tensors) for v in obj]
    return obj


def tensor_refs(skeleton: Any) -> list[str]:
    """The tensor keys a flatten_state skeleton names."""
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return [skeleton["__tensor__"]]
        return [key for value in skeleton.values() for key in tensor_refs(value)]
    if isinstance(skeleton, list):
        return [key for value in skeleton for key in tensor_refs(value)]
    return []


def save_state(stem: Path, state: Any) -> None:
    """Write nested state (dicts, lists, numbers, tensors) as `stem.json` + `stem.safetensors`."""
    tensors: dict[str, Tensor] = {}
    skeleton = flatten_state(state, tensors, "s")
    stem.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(stem.with_suffix(".safetensors")))
    stem.with_suffix(".json").write_text(json.dumps(skeleton))


def load_tensors(path: Path, device: str = "cpu") -> dict[str, Tensor]:
    """A safetensors file; anything else (a pickle, a torn file) is a CheckpointError, never executed."""
    if torch.device(device).type == "cpu":
        device = "cpu"  # safetensors refuses "cpu:0", the device of a multi-process CPU run
    try:
        return load_file(str(path), device=device)
    except (SafetensorError, OSError) as err:
        raise CheckpointReadError(f"{path} is not a readable safetensors file ({err}); genforge never unpickles "
                              "checkpoints") from err


def load_state(stem: Path) -> Any:
    """Inverse of save_state: JSON + safetensors only."""
    return unflatten_state(read_json(stem.with_suffix(".json")), load_tensors(stem.with_suffix(".safetensors")))


def nonfinite_tensors(tensors: dict[str, Tensor]) -> list[str]:
    """Names of floating-point tensors holding NaN or Inf."""
    return [k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def save_tensors(path: Path, tensors: dict[str, Tensor]) -> None:
    """A flat name -> tensor dict as safetensors (copies, so shared storage is not an error)."""
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(path))


class CheckpointDir:
    """The `checkpoints/` folder of a run: atomic commits, `latest`, retention of the last K (+ the best)."""

    def __init__(self, root: Path, keep_last: int = 2, best_mode: str = "max") -> None:
        if keep_last < 2:
            raise ValueError(f"train.keep_last={keep_last} must be at least 2")
        self.root = Path(root)
        self.keep_last = keep_last
        self.best_mode = best_mode

    def staging(self, step: int) -> Path:
        """An empty temporary folder to write a checkpoint of `step` into."""
        tmp = self.root / f"{TMP_PREFIX}{step_dir_name(step)}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, step: int, score: float | None = None) -> Path:
        """fsync, rename into place, write `latest` (atomically), update `best`, then apply retention.
        On a write error nothing of this checkpoint is left and `latest` still names the previous one."""
        final = self.root / step_dir_name(step)
        try:
            fsync_tree(tmp)
            if final.exists():
                self._remove(final)
            os.replace(tmp, final)
            fsync_dir(self.root)
            write_atomically(self.root / "latest", final.name + "\n")
            fsync_dir(self.root)
        except WRITE_ERRORS:
            self.discard(tmp)
            latest = self._read_latest_name()
            if final.exists() and latest != final.name:
                self._remove(final)
            (self.root / f"{TMP_PREFIX}latest").unlink(missing_ok=True)
            raise
        if score is not None and self._better(score):
            write_atomically(self.root / "best", json.dumps({"name": final.name, "value": score}) + "\n")
        self.prune()
        return final

    def discard(self, tmp: Path) -> None:
        """Remove a staging folder after a failed write."""
        shutil.rmtree(tmp, ignore_errors=True)

    def _better(self, score: float) -> bool:
        best = self.best()
        if best is None:
            return True
        return score > best[1] if self.best_mode == "max" else score < best[1]

    def best(self) -> tuple[Path, float] | None:
        """The best checkpoint by train.keep_best and its value, if any is recorded and still present."""
        marker = self.root / "best"
        if not marker.is_file():
            return None
        try:
            record = json.loads(marker.read_text())
            path = self.root / str(record["name"])
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointReadError(f"{marker} is not a best-checkpoint record ({err})") from err
        return (path, float(record["value"])) if path.is_dir() else None

    def complete(self) -> list[Path]:
        """Committed checkpoint folders, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
        return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))

    def _read_latest_name(self) -> str | None:
        marker = self.root / "latest"
        return marker.read_text().strip() if marker.is_file() else None

    def latest(self) -> Path | None:
        """The folder `latest` names, or None when there is no checkpoint yet."""
        name = self._read_latest_name()
        if name is None:
            return None
        path = self.root / name
        if not STEP_DIR.match(path.name) or not (path / TRAINER_STATE).is_file():
            raise CheckpointReadError(f"{self.root / 'latest'} names {name!r}, which is not a complete checkpoint")
        return path

    def clean_incomplete(self) -> list[Path]:
        """Remove temporary folders left by an interrupted write; returns what was removed."""
        if not self.root.is_dir():
            return []
        stale = [p for p in self.root.iterdir() if p.name.startswith(TMP_PREFIX)]
        for p in stale:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return stale

    def move_aside(self, path: Path) -> Path:
        """Rename a damaged checkpoint to `damaged-<name>[-N]` (kept for inspection, ignored from then on)."""
        target = self.root / f"{DAMAGED_PREFIX}{path.name}"
        n = 1
        while target.exists():
            target = self.root / f"{DAMAGED_PREFIX}{path.name}-{n}"
            n += 1
        os.replace(path, target)
        fsync_dir(self.root)
        return target

    def set_latest(self, path: Path) -> None:
        """Point `latest` at the committed checkpoint `path` (after a fallback)."""
        write_atomically(self.root / "latest", path.name + "\n")
        fsync_dir(self.root)

    def _remove(self, path: Path) -> None:
        """Rename out of the listing first, so a kill mid-delete leaves only debris that start-up cleans."""
        doomed = path.with_name(f"{TMP_PREFIX}old-{path.name}")
        os.replace(path, doomed)
        shutil.rmtree(doomed)

    def prune(self) -> None:
        """Keep the newest `keep_last` committed checkpoints, plus the best; never the one `latest` names."""
        keep = {self.latest()}
        best = self.best()
        if best is not None:
            keep.add(best[0])
        for old in self.complete()[: -self.keep_last]:
            if old not in keep:
                self._remove(old)


def read_json(path: Path) -> Any:
    """A JSON file of a checkpoint; anything unreadable is a CheckpointReadError."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise CheckpointReadError(f"{path} is not readable JSON ({err})") from err


# ------------------------------------------------------------------------------------------ the format's files
def weights_file(folder: Path, part: str) -> Path:
    """The safetensors file of a weight part (MODEL_PART, EMA_PART, POWER_EMA) in the plain layout."""
    return Path(folder) / f"{part}.safetensors"


def optimizer_stem(folder: Path, phase: str) -> Path:
    """optim/<phase> (a save_state stem): a phase's optimizer and scheduler state, or GRAD_SCALER's."""
    return Path(folder) / OPTIM / phase


def rng_stem(folder: Path, rank: int) -> Path:
    """rng/rank-<rank> (a save_state stem): that rank's python / numpy / torch RNG states."""
    return Path(folder) / RNG / f"rank-{rank}"


def saved_optimizer_states(folder: Path) -> list[str]:
    """The optimizer states a checkpoint folder holds (optim/*.json stems: phases and GRAD_SCALER), sorted."""
    return sorted(p.stem for p in (Path(folder) / OPTIM).glob("*.json"))


def write_weights(folder: Path, parts: Mapping[str, dict[str, Tensor]]) -> None:
    """Each weight part as `<part>.safetensors` (the plain layout)."""
    for part, tensors in parts.items():
        save_tensors(weights_file(folder, part), tensors)


def read_part(folder: Path, part: str, device: str = "cpu") -> dict[str, Tensor]:
    """One weight part of a plain-layout checkpoint."""
    return load_tensors(weights_file(folder, part), device)


def write_trainer_state(folder: Path, state: Mapping[str, Any]) -> None:
    """trainer_state.json, stamped with this format's version."""
    (Path(folder) / TRAINER_STATE).write_text(json.dumps({"format_version": FORMAT_VERSION, **state}, indent=1))


def _from_version_1(state: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Version 1 (no `format_version`) to 2: the keys added to trainer_state.json one by one before the format had
    a version, with what a checkpoint written without them meant: data consumed up to its step, no rollback, no
    evaluation, no referred inputs, the stream's slots unknown; its optimizer files whatever optim/ holds, and each
    phase trained in it having counted one EMA update a step (what the EMA warm-up counted then)."""
    step, optim_files = int(state["step"]), saved_optimizer_states(folder)
    return {"sharding": "fsdp" if (folder / SHARDS).is_dir() else "none", "data_position": step, "rollbacks": 0,
            "data_slots": None, "eval": None, "inputs": {}, "optim_files": optim_files,
            "ema_updates": {phase: step for phase in optim_files if phase != GRAD_SCALER}, **state}


# version v -> v + 1; each step adds what version v + 1 writes, given the state and the checkpoint folder
UPGRADES: dict[int, Callable[[dict[str, Any], Path], dict[str, Any]]] = {1: _from_version_1}


def read_trainer_state(folder: Path) -> dict[str, Any]:
    """A checkpoint's trainer_state.json in today's format: an older one brought up by `UPGRADES`, one step a
    version. CheckpointReadError when it is not a JSON object, or was written by a newer genforge."""
    path = Path(folder) / TRAINER_STATE
    state = read_json(path)
    if not isinstance(state, dict):
        raise CheckpointReadError(f"{path} holds a JSON {type(state).__name__}, not an object")
    version = state.get("format_version", 1)  # version 1 is the one without the key
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise CheckpointReadError(f"{path}: format_version {version!r} is not one this genforge reads (1 to "
                                  f"{FORMAT_VERSION}): written by a newer genforge?")
    if "step" not in state:
        raise CheckpointReadError(f"{path} lacks the key 'step'")
    for old in range(version, FORMAT_VERSION):
        state = UPGRADES[old](state, Path(folder))
    return {**state, "format_version": FORMAT_VERSION}
