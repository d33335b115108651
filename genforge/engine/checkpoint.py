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
Before loading, `verify_checkpoint` checks a folder without reading its tensors, and `newest_usable` picks the
newest one that passes, so a damaged newest checkpoint falls back to the one before.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from genforge.core.files import TMP_PREFIX, file_sha256, files_sha256, fsync_dir, fsync_tree, write_atomically
from genforge.engine.sharding import load_shards

STEP_DIR = re.compile(r"^step-(\d{6,})$")
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
        if not STEP_DIR.match(path.name) or not (path / "trainer_state.json").is_file():
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


# ------------------------------------------------------------------------------------------ verification
SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
TORCH_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                torch.bool: "BOOL"}
SAFETENSORS_TO_TORCH = {name: dtype for dtype, name in TORCH_DTYPES.items()}
# trainer_state.json keys and their JSON types: what sampling needs, and what resuming needs besides
STATE_KEYS: dict[str, type | tuple[type, ...]] = {"step": int, "family_state": dict, "data_info": dict}
RESUME_KEYS: dict[str, type | tuple[type, ...]] = {"global_batch": int, "num_samples": (int, type(None)),
                                                   "world_size": int}
Expected = Mapping[str, tuple[tuple[int, ...], torch.dtype]]


def expected_tensors(tensors: Mapping[str, Tensor]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """name -> (shape, dtype) of a state dict, for `verify_checkpoint(expected=...)`."""
    return {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of a safetensors file, from its header only (8-byte length + JSON; no data is read,
    nothing is unpickled). A CheckpointReadError names the file when the header or the offsets do not add up."""
    return _read_header(path)[0]


def _read_header(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict[str, str]]:
    """`safetensors_header` and the file's `__metadata__` (string -> string)."""

    def unreadable(why: str) -> CheckpointReadError:
        return CheckpointReadError(f"{path} is not a readable safetensors file ({why}); genforge never unpickles "
                                   "checkpoints")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise unreadable(f"{size} bytes, no header")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                raise unreadable(f"its header claims {length} bytes, but the file has only {size}")
            header = json.loads(f.read(length))
    except OSError as err:
        raise unreadable(str(err)) from err
    except (ValueError, UnicodeDecodeError) as err:
        raise unreadable(f"its header is not JSON: {err}") from err
    if not isinstance(header, dict):
        raise unreadable("its header is not a JSON object")
    data_size, found = size - 8 - length, {}
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise unreadable("its __metadata__ is not a JSON object")
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
            count = math.prod(shape)
            width = SAFETENSORS_DTYPES[dtype]
        except (KeyError, TypeError, ValueError) as err:
            raise unreadable(f"tensor {name!r} has a malformed header entry: {err!r}") from None
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_size):
            raise unreadable(f"tensor {name!r} lies at bytes {begin}..{end}, past the end of its {data_size} data "
                             "bytes: a truncated file?")
        if end - begin != count * width:
            raise unreadable(f"tensor {name!r} {dtype}{list(shape)} needs {count * width} bytes, its offsets give "
                             f"{end - begin}")
        found[name] = (dtype, shape)
    return found, metadata


SHARDS = "shards"  # the folder of a sharded checkpoint's tensors (genforge.engine.sharding)
DCP_SHARDING_KEY, DCP_OFFSETS_KEY = "DCP_SHARDING_INFO", "saved_offsets"  # what DCP's safetensors writer records


def sharded_tensors(folder: Path, ranks: int | None = None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, whole shape) of the tensors in a `shards/` folder, from the files' headers (nothing else is
    read). CheckpointReadError naming the folder when a file is unreadable, the pieces of a tensor do not cover it
    exactly, or (`ranks`: the processes that wrote it, one file each) a rank's file is missing."""
    files = sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []
    if not files:
        raise CheckpointReadError(f"{folder} holds no shards: the checkpoint is not complete")
    if isinstance(ranks, int) and len(files) != ranks:
        raise CheckpointReadError(f"{folder} holds {len(files)} shard files, but {ranks} processes wrote it: a rank's "
                                  "shard file is missing, the checkpoint is not complete")
    pieces: dict[str, list[tuple[str, tuple[int, ...], tuple[int, ...]]]] = {}
    for path in files:
        found, metadata = _read_header(path)
        try:
            offsets = json.loads(metadata.get(DCP_SHARDING_KEY, "{}"))
            for name, (dtype, shape) in found.items():
                at = tuple(int(o) for o in offsets[name][DCP_OFFSETS_KEY]) if name in offsets else (0,) * len(shape)
                if len(at) != len(shape):
                    raise ValueError(f"{name}: offsets {list(at)} for shape {list(shape)}")
                pieces.setdefault(name, []).append((dtype, shape, at))
        except (ValueError, TypeError, KeyError) as err:
            raise CheckpointReadError(f"{path}: its sharding record is malformed ({err})") from None
    whole: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, parts in pieces.items():
        dtype = parts[0][0]
        shape = tuple(max(at[d] + size[d] for _, size, at in parts) for d in range(len(parts[0][1])))
        distinct = len({at for _, _, at in parts}) == len(parts)  # DCP writes each piece (a replicated tensor) once
        volume = sum(math.prod(size) for _, size, _ in parts)
        if any(p[0] != dtype for p in parts) or volume != math.prod(shape) or not distinct:
            raise CheckpointReadError(f"{folder}: the pieces of {name!r} do not make up a {dtype}{list(shape)} "
                                      "tensor: a rank's shard file is missing or torn")
        whole[name] = (dtype, shape)
    return whole


def _check_tensors(path: Path, found: dict[str, tuple[str, tuple[int, ...]]], expected: Expected,
                   may_lack: Iterable[str]) -> None:
    """The names, shapes and dtypes `found` in `path` are those of `expected` (names in `may_lack` may be
    absent)."""
    unexpected = sorted(set(found) - set(expected))
    missing = sorted(set(expected) - set(found) - set(may_lack))
    if unexpected or missing:
        raise CheckpointReadError(f"{path} does not match this model: missing {missing[:5]}, unexpected "
                                  f"{unexpected[:5]}")
    for name, (dtype, shape) in sorted(found.items()):
        want_shape, want_dtype = expected[name]
        want = TORCH_DTYPES.get(want_dtype, str(want_dtype))
        if tuple(want_shape) != shape or want != dtype:
            raise CheckpointReadError(f"{path}: tensor {name!r} is {dtype}{list(shape)}, this model's is "
                                      f"{want}{list(want_shape)}")


def weights_mismatch(found: Mapping[str, Tensor], expected: Mapping[str, Tensor], few: int = 3) -> str:
    """How the weights `found` (a checkpoint's) differ from `expected` (a model's state dict) in names and shapes,
    naming a `few` of each kind with their shapes; empty when they match (dtypes may differ: loading converts)."""

    def shape(t: Tensor) -> list[int]:
        return list(t.shape)

    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    reshaped = sorted(k for k in set(found) & set(expected) if tuple(found[k].shape) != tuple(expected[k].shape))
    parts = []
    for what, names, show in (
            ("missing", missing, lambda k: f"{k} {shape(expected[k])}"),
            ("unexpected", unexpected, lambda k: f"{k} {shape(found[k])}"),
            ("of another shape", reshaped, lambda k: f"{k} {shape(found[k])} (this model: {shape(expected[k])})")):
        if names:
            more = f", ... ({len(names)} in all)" if len(names) > few else ""
            parts.append(f"{what}: " + "; ".join(map(show, names[:few])) + more)
    return " | ".join(parts)


def _check_state_files(stem: Path, shards: dict[str, Any] | None = None) -> None:
    """A save_state pair: `stem.json` (readable JSON) and `stem.safetensors` (a sane header); with `shards` (the
    tensors of a sharded checkpoint), `stem.json` alone, whose tensors must be among them."""
    parts = (stem.with_suffix(".json"),) if shards is not None else (stem.with_suffix(".json"),
                                                                      stem.with_suffix(".safetensors"))
    for part in parts:
        if not part.is_file():
            raise CheckpointReadError(f"{part} is missing: the checkpoint is not complete")
    skeleton = read_json(stem.with_suffix(".json"))
    if shards is None:
        safetensors_header(stem.with_suffix(".safetensors"))
        return
    absent = [key for key in tensor_refs(skeleton) if key not in shards]
    if absent:
        raise CheckpointReadError(f"{stem.with_suffix('.json')} names tensors its checkpoint's {SHARDS}/ lacks "
                                  f"({absent[:3]}): the checkpoint is not complete")


def _stems(folder: Path) -> set[str]:
    return {p.stem for p in folder.iterdir() if p.suffix in (".json", ".safetensors")} if folder.is_dir() else set()


def verify_checkpoint(path: Path, expected: Expected | None = None, *, expected_ema: Expected | None = None,
                      may_lack: Iterable[str] = (), ema_may_lack: Iterable[str] = (), resume: bool = False) -> None:
    """Check a checkpoint folder without loading its tensors; a CheckpointReadError names the file and the cause.

    Always: model.safetensors and ema.safetensors with sane headers (a sharded checkpoint: `shards/` whose pieces
    make up every tensor), trainer_state.json a JSON object with the keys sampling needs. With `expected`
    (`expected_ema`): the tensor names, shapes and dtypes of the model (EMA) weights match it, names in `may_lack`
    (`ema_may_lack`) may be absent. With `resume` (what training needs besides): the resume keys of
    trainer_state.json, the optimizer files of each phase in optim/ and the rng files of every rank of the run
    that wrote it."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointReadError(f"{path} does not exist")
    sharded = (path / SHARDS).exists()
    for name in ("trainer_state.json",) if sharded else ("model.safetensors", "ema.safetensors", "trainer_state.json"):
        if not (path / name).is_file():
            raise CheckpointReadError(f"{path / name} is missing: the checkpoint is not complete")
    state_path = path / "trainer_state.json"
    state = read_json(state_path)
    if not isinstance(state, dict):
        raise CheckpointReadError(f"{state_path} holds a JSON {type(state).__name__}, not an object")
    shards = sharded_tensors(path / SHARDS, state.get("world_size")) if sharded else None
    for key, kind in {**STATE_KEYS, **(RESUME_KEYS if resume else {})}.items():
        if key not in state:
            raise CheckpointReadError(f"{state_path} lacks the key {key!r}")
        if not isinstance(state[key], kind) or (kind is int and isinstance(state[key], bool)):
            raise CheckpointReadError(f"{state_path}: {key!r} is {state[key]!r}, not of the expected type")
    for part, want, lack in (("model", expected, may_lack), ("ema", expected_ema, ema_may_lack)):
        where = path / SHARDS if shards is not None else path / f"{part}.safetensors"
        found = ({k[len(part) + 1:]: v for k, v in shards.items() if k.startswith(f"{part}.")} if shards is not None
                 else safetensors_header(where))
        if shards is not None and not found:
            raise CheckpointReadError(f"{where} holds no {part} weights: the checkpoint is not complete")
        if want is not None:
            _check_tensors(where, found, want, lack)
    if not resume:
        return
    optim = _stems(path / "optim")
    listed = state.get("optim_files")  # written since checkpoints are verified; older ones: what is there
    if not optim and not listed:
        raise CheckpointReadError(f"{path / 'optim'} holds no optimizer state: the checkpoint is not complete")
    for stem in sorted(set(listed) if isinstance(listed, list) else optim):
        _check_state_files(path / "optim" / str(stem), shards if stem != "grad_scaler" else None)
    for rank in range(state["world_size"]):
        _check_state_files(path / "rng" / f"rank-{rank}")


def newest_usable(ckpts: CheckpointDir, verify: Callable[[Path], None]) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest committed checkpoint that `verify` accepts, and (path, why) of each newer one it rejected (a
    `latest` naming a folder that is not there among them). (None, []) when there is no checkpoint yet (no
    `latest`); a CheckpointReadError naming every rejected file when none is usable. Changes nothing on disk."""
    marker = ckpts.root / "latest"
    if not marker.is_file():
        return None, []
    rejected: list[tuple[Path, str]] = []
    try:
        named = ckpts.root / marker.read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        named, why = marker, f"{marker} is not readable ({err})"
        rejected.append((marker, why))
    candidates = ckpts.complete()[::-1]
    if named != marker and named not in candidates:
        rejected.append((marker, f"{marker} names {named.name!r}, which is not a committed checkpoint"))
    for path in candidates:
        try:
            verify(path)
        except CheckpointReadError as err:
            rejected.append((path, str(err)))
            continue
        return path, rejected
    raise CheckpointReadError("no usable checkpoint in " + str(ckpts.root) + ": " +
                              "; ".join(why for _, why in rejected))


def source_checkpoint(path: Path) -> tuple[Path, list[tuple[Path, str]]]:
    """The checkpoint another run starts from (`train.init_from`): `path` itself when it is one checkpoint folder
    (it holds trainer_state.json), else the newest usable checkpoint of the run directory `path`; each checked by
    `verify_checkpoint` (the files sampling needs: weights, EMA, trainer_state.json). Returns it and (path, why) of
    each newer checkpoint of the run that was passed over. CheckpointReadError saying why there is none."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointReadError(f"{path} does not exist" if not path.exists() else f"{path} is not a folder")
    if (path / "trainer_state.json").is_file():
        verify_checkpoint(path)
        return path, []
    chosen, rejected = newest_usable(CheckpointDir(path / "checkpoints"), verify_checkpoint)
    if chosen is None:
        raise CheckpointReadError(f"{path} is neither a run directory with a checkpoint ({path / 'checkpoints'} has "
                                  "no `latest`) nor a checkpoint folder (no trainer_state.json)")
    return chosen, rejected


def read_weights(path: Path, part: str, device: str = "cpu") -> dict[str, Tensor]:
    """The whole `part` ("model" or "ema") weights of checkpoint `path`, on this process alone, from either layout
    (a sharded checkpoint's pieces assembled, at any world size it was written with)."""
    if not (path / SHARDS).is_dir():
        return load_tensors(path / f"{part}.safetensors", device)
    prefix = f"{part}."
    tensors = {name: torch.empty(shape, dtype=SAFETENSORS_TO_TORCH[dtype])
               for name, (dtype, shape) in sharded_tensors(path / SHARDS).items() if name.startswith(prefix)}
    try:
        load_shards(path / SHARDS, tensors, collective=False)
    except Exception as err:  # DCP wraps a reader's error (a torn file) in its own exception types
        raise CheckpointReadError(f"{path / SHARDS}: could not read the {part} weights ({err})") from err
    return {name[len(prefix):]: t.to(device) for name, t in tensors.items()}


def weights_hash(path: Path) -> str:
    """A content hash of a checkpoint's EMA weights (what a frozen codec taken from it is), either layout."""
    if not (path / SHARDS).is_dir():
        return file_sha256(path / "ema.safetensors")
    return files_sha256(sorted((path / SHARDS).glob("*.safetensors")))
