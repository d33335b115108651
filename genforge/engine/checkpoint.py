"""Checkpoints: atomic directories of safetensors + JSON; nothing is unpickled on load.

checkpoints/step-000500/
    model.safetensors        the task's weights
    ema.safetensors          EMA shadow weights
    optim/<phase>.*          optimizer + scheduler (+ grad scaler) state: tensors in .safetensors, the rest .json
    rng/rank-<r>.*           python / numpy / torch RNG states of each rank
    trainer_state.json       step, family state, ...
checkpoints/latest           name of the newest complete checkpoint, written last
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

STEP_DIR = re.compile(r"^step-(\d{6,})$")
TMP_PREFIX = ".tmp-"


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def _flatten(obj: Any, tensors: dict[str, Tensor], prefix: str) -> Any:
    """JSON-able skeleton of `obj` with every tensor moved into `tensors` under a path key."""
    if isinstance(obj, Tensor):
        tensors[prefix] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        if not all(isinstance(k, (str, int)) for k in obj):
            raise TypeError(f"state at {prefix!r} has non-string keys")
        return {"__dict__": [[k, _flatten(v, tensors, f"{prefix}.{k}")] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        items = [_flatten(v, tensors, f"{prefix}.{i}") for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} at {prefix!r} in a checkpoint")


def _unflatten(obj: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(_unflatten(v, tensors) for v in obj["__tuple__"])
        return {k: _unflatten(v, tensors) for k, v in obj["__dict__"]}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    return obj


def save_state(stem: Path, state: Any) -> None:
    """Write nested state (dicts, lists, numbers, tensors) as `stem.json` + `stem.safetensors`."""
    tensors: dict[str, Tensor] = {}
    skeleton = _flatten(state, tensors, "s")
    stem.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(stem.with_suffix(".safetensors")))
    stem.with_suffix(".json").write_text(json.dumps(skeleton))


def load_state(stem: Path) -> Any:
    """Inverse of save_state: JSON + safetensors only."""
    tensors = load_file(str(stem.with_suffix(".safetensors")))
    return _unflatten(json.loads(stem.with_suffix(".json").read_text()), tensors)


def save_tensors(path: Path, tensors: dict[str, Tensor]) -> None:
    """A flat name -> tensor dict as safetensors (copies, so shared storage is not an error)."""
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(path))


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for path in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class CheckpointDir:
    """The `checkpoints/` folder of a run: atomic commits, `latest`, retention."""

    def __init__(self, root: Path, keep_last: int = 2) -> None:
        self.root = Path(root)
        self.keep_last = keep_last

    def staging(self, step: int) -> Path:
        """An empty temporary folder to write a checkpoint of `step` into."""
        tmp = self.root / f"{TMP_PREFIX}{step_dir_name(step)}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, step: int) -> Path:
        """fsync, rename into place, write `latest` (atomically), then apply retention."""
        _fsync_tree(tmp)
        final = self.root / step_dir_name(step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        marker = self.root / f"{TMP_PREFIX}latest"
        marker.write_text(final.name + "\n")
        with open(marker, "rb") as f:
            os.fsync(f.fileno())
        os.replace(marker, self.root / "latest")
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.prune()
        return final

    def complete(self) -> list[Path]:
        """Committed checkpoint folders, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
        return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))

    def latest(self) -> Path | None:
        """The folder `latest` names, or None when there is no checkpoint yet."""
        marker = self.root / "latest"
        if not marker.is_file():
            return None
        path = self.root / marker.read_text().strip()
        if not STEP_DIR.match(path.name) or not (path / "trainer_state.json").is_file():
            raise RuntimeError(f"{marker} names {path.name!r}, which is not a complete checkpoint")
        return path

    def clean_incomplete(self) -> list[Path]:
        """Remove temporary folders left by an interrupted write; returns what was removed."""
        if not self.root.is_dir():
            return []
        stale = [p for p in self.root.iterdir() if p.name.startswith(TMP_PREFIX)]
        for p in stale:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return stale

    def prune(self) -> None:
        """Keep the newest `keep_last` committed checkpoints (never the one `latest` names)."""
        latest = self.latest()
        for old in self.complete()[: -self.keep_last]:
            if old != latest:
                shutil.rmtree(old)
