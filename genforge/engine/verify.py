"""Checking a checkpoint before loading it (`verify_checkpoint`: the safetensors headers against the model, the JSON
state, every file a resume needs, finite weights), choosing the newest usable one (`newest_usable`), and reading the
weights of another run's checkpoint (`source_checkpoint`, `read_weights`), in either layout."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from genforge.core.files import file_sha256, files_sha256
from genforge.engine.checkpoint import (EMA_PART, GRAD_SCALER, MODEL_PART, SHARDS, TRAINER_STATE, CheckpointDir,
                                        CheckpointReadError, OPTIM, POWER_EMA, optimizer_stem, read_json, read_part,
                                        read_trainer_state, rng_stem, tensor_refs, weights_file)
from genforge.engine.sharding import load_shards

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


def nonfinite_weights(path: Path) -> list[str]:
    """"<file>: <tensor>" of every model or EMA tensor of checkpoint `path` that holds a NaN or an infinity, read one
    tensor at a time (a sharded checkpoint: every rank's pieces). A file that cannot be read is a
    CheckpointReadError naming it."""
    sharded = (path / SHARDS).is_dir()
    files = sorted((path / SHARDS).glob("*.safetensors")) if sharded else [weights_file(path, MODEL_PART),
                                                                            weights_file(path, EMA_PART)]
    bad = []
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as tensors:
                for name in tensors.keys():
                    if sharded and not name.startswith(("model.", "ema.")):  # optimizer state: not weights
                        continue
                    tensor = tensors.get_tensor(name)
                    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                        bad.append(f"{file.name}: {name}")
        except (OSError, SafetensorError) as err:
            raise CheckpointReadError(f"{file} is not readable ({err})") from err
    return bad


def verify_checkpoint(path: Path, expected: Expected | None = None, *, expected_ema: Expected | None = None,
                      may_lack: Iterable[str] = (), ema_may_lack: Iterable[str] = (), resume: bool = False,
                      expected_power_ema: Expected | None = None) -> None:
    """Check a checkpoint folder before anything is loaded from it; a CheckpointReadError names the file and the
    cause.

    Always: model.safetensors and ema.safetensors with sane headers (a sharded checkpoint: `shards/` whose pieces
    make up every tensor), trainer_state.json a JSON object with the keys sampling needs, and then weights that are
    all finite (read one tensor at a time: a checkpoint with a NaN is not complete). With `expected`
    (`expected_ema`): the tensor names, shapes and dtypes of the model (EMA) weights match it, names in `may_lack`
    (`ema_may_lack`) may be absent; with `expected_power_ema` (train.ema.kind=power), the other power-function
    EMAs (`power_ema.safetensors`, names `<index>/<name>`) too. With `resume` (what training needs besides): the
    resume keys of trainer_state.json, the optimizer files of each phase in optim/ and the rng files of every rank of
    the run that wrote it."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointReadError(f"{path} does not exist")
    sharded = (path / SHARDS).exists()
    weights = [] if sharded else [weights_file(path, MODEL_PART), weights_file(path, EMA_PART)]
    for file in [path / TRAINER_STATE, *weights]:
        if not file.is_file():
            raise CheckpointReadError(f"{file} is missing: the checkpoint is not complete")
    state_path = path / TRAINER_STATE
    state = read_trainer_state(path)
    for key, kind in {**STATE_KEYS, **(RESUME_KEYS if resume or sharded else {})}.items():
        if key not in state:
            raise CheckpointReadError(f"{state_path} lacks the key {key!r}")
        if not isinstance(state[key], kind) or (kind is int and isinstance(state[key], bool)):
            raise CheckpointReadError(f"{state_path}: {key!r} is {state[key]!r}, not of the expected type")
    shards = sharded_tensors(path / SHARDS, state["world_size"]) if sharded else None
    parts = [(MODEL_PART, expected, may_lack), (EMA_PART, expected_ema, ema_may_lack)]
    if expected_power_ema is not None:
        power_lack = {k for k in expected_power_ema if k.split("/", 1)[1] in set(ema_may_lack)}
        parts.append((POWER_EMA, expected_power_ema, power_lack))
    for part, want, lack in parts:
        where = path / SHARDS if shards is not None else weights_file(path, part)
        found = ({k[len(part) + 1:]: v for k, v in shards.items() if k.startswith(f"{part}.")} if shards is not None
                 else safetensors_header(where))
        if shards is not None and not found:
            raise CheckpointReadError(f"{where} holds no {part} weights: the checkpoint is not complete")
        if want is not None:
            _check_tensors(where, found, want, lack)
    bad = nonfinite_weights(path)
    if bad:
        raise CheckpointReadError(f"{path}: non-finite values (NaN or infinity) in {', '.join(bad[:3])}"
                                  f"{' ...' if len(bad) > 3 else ''}; genforge never writes them (a bit flip or "
                                  "another tool did): the checkpoint is not usable")
    if not resume:
        return
    listed = state["optim_files"]
    if not isinstance(listed, list) or not listed:
        raise CheckpointReadError(f"{path / OPTIM} holds no optimizer state: the checkpoint is not complete")
    for stem in sorted(map(str, listed)):
        _check_state_files(optimizer_stem(path, stem), shards if stem != GRAD_SCALER else None)
    for rank in range(state["world_size"]):
        _check_state_files(rng_stem(path, rank))


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
    if (path / TRAINER_STATE).is_file():
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
        return read_part(path, part, device)
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
        return file_sha256(weights_file(path, EMA_PART))
    return files_sha256(sorted((path / SHARDS).glob("*.safetensors")))
