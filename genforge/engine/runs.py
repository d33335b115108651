"""Opening a finished (or running) run directory for sampling, evaluation and encoding."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from genforge.config import ConfigError, RunConfig, load_config
from genforge.data.loader import DataInfo, scan_data_info
from genforge.engine.checkpoint import CheckpointDir, load_tensors, read_json
from genforge.engine.task import Task


@dataclass
class LoadedRun:
    config: RunConfig
    task: Task
    step: int
    checkpoint: Path


def build_task(cfg: RunConfig, device: torch.device | str = "cpu") -> Task:
    """The task of `cfg`, with the data set scanned only for what the model needs (its classes)."""
    info = scan_data_info(cfg.data)
    with torch.device(device):
        return cfg.model.build_task(cfg, info)


def missing_inputs(cfg: RunConfig) -> list[str]:
    """Inputs of `cfg` that earlier pipeline stages write and that do not exist yet: a cache folder, a
    tokenizer run (`model.input_runs()`), as "field=path (what writes it)"."""
    missing = []
    if cfg.data.source == "cache" and not (Path(cfg.data.path) / "cache.json").is_file():
        missing.append(f"data.path={cfg.data.path} (written by `genforge encode`)")
    for field, path in cfg.model.input_runs().items():
        if not (Path(path) / "checkpoints" / "latest").is_file():
            missing.append(f"{field}={path} (a trained run)")
    return missing


def count_parameters(task: Task) -> dict[str, int]:
    """Trainable parameters per phase and in total."""
    counts = {phase: sum(p.numel() for p in task.parameters_for(phase)) for phase in task.phases}
    counts["total"] = sum(p.numel() for p in task.parameters())
    return counts


def load_run(run_dir: Path, device: torch.device | str = "cpu", ema: bool = True) -> LoadedRun:
    """Config + task with the latest checkpoint's EMA (or live) weights, safetensors only. On the meta device
    only the structure is built (nothing is read but the config and the checkpoint's JSON)."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    cfg = load_config(str(config_path))
    ckpt = CheckpointDir(run_dir / "checkpoints").latest()
    if ckpt is None:
        raise ConfigError(f"{run_dir} has no checkpoint yet (checkpoints/latest is missing)")
    state = read_json(ckpt / "trainer_state.json")
    # a finished run is sampled, not trained: its data cache is neither needed nor re-checked (a generator
    # keeps the codec weights it trained with in its own checkpoint)
    info = replace(DataInfo(**state["data_info"]), encoder_hash=None)
    with torch.device(device):
        task = cfg.model.build_task(cfg, info)
    if torch.device(device).type != "meta":
        task.load_state_dict(load_tensors(ckpt / "model.safetensors", str(device)))
        if ema:
            shadow = load_tensors(ckpt / "ema.safetensors", str(device))
            missing, unexpected = task.ema_module().load_state_dict(shadow, strict=False)
            if unexpected or len(shadow) == 0:
                raise ConfigError(f"{ckpt / 'ema.safetensors'} does not match this model ({unexpected[:3]})")
    task.load_state_from_checkpoint(state["family_state"])
    task.eval()
    return LoadedRun(cfg, task, int(state["step"]), ckpt)


@dataclass(frozen=True)
class CodecInfo:
    """Which tokenizer checkpoint a codec comes from; `encoder_hash` identifies its weights."""

    kind: str  # "latent" (LatentCodec: float [B, C, h, w]) or "tokens" (TokenCodec: long ids [B, h, w])
    run_dir: str  # absolute path of the tokenizer's run directory
    family: str
    step: int
    checkpoint: str  # the checkpoint folder the weights come from
    encoder_hash: str  # sha256 of that checkpoint's ema.safetensors
    channels: int  # latent channels (0 for tokens)
    codebook_size: int  # (0 for latents)
    downsample: int  # pixels per latent or token, along each side
    image_size: int  # the tokenizer's training resolution (data.image_size)


_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in chunks; remembered per (path, size, mtime) for the rest of the process."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        with open(path, "rb") as f:
            _HASHES[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _HASHES[key]


def load_codec(run_dir: Path | str, device: torch.device | str = "cpu") -> tuple[nn.Module, CodecInfo]:
    """The frozen codec of a tokenizer run (EMA weights of its latest checkpoint) and where it comes from.
    Raises ConfigError when `run_dir` is not a run, has no checkpoint, or is not a tokenizer."""
    from genforge.nn.codec import LatentCodec, TokenCodec

    run_dir = Path(run_dir).resolve()
    run = load_run(run_dir, device)
    codec = run.task.codec()
    family = run.config.model.family
    if codec is None:
        raise ConfigError(f"{run_dir} is a {family!r} run, not a tokenizer (its task has no codec); "
                          "give the run directory of a klvae, vqgan or dvae run")
    if isinstance(codec, TokenCodec):
        kind, channels, codebook_size = "tokens", 0, int(codec.codebook_size)
    elif isinstance(codec, LatentCodec):
        kind, channels, codebook_size = "latent", int(codec.latent_channels), 0
    else:
        raise ConfigError(f"{run_dir}: family {family!r} hands out a codec that is neither a LatentCodec nor a "
                          "TokenCodec (genforge.nn.codec)")
    codec.eval().requires_grad_(False)
    info = CodecInfo(kind=kind, run_dir=str(run_dir), family=family, step=run.step, checkpoint=str(run.checkpoint),
                     encoder_hash=file_sha256(run.checkpoint / "ema.safetensors"), channels=channels,
                     codebook_size=codebook_size, downsample=int(codec.downsample),
                     image_size=run.config.data.image_size)
    return codec, info


KIND_NAMES = {"latent": "continuous latents", "tokens": "discrete tokens"}


def load_input_codec(run_dir: str, field: str, kind: str, model: str, data: DataInfo,
                     cache_path: str | None) -> tuple[nn.Module, CodecInfo]:
    """The frozen codec of the tokenizer run a generator (`model`, e.g. "DiT") is built on, from the config field
    `field`: it must make `kind` ("latent" or "tokens"), and when the data is a cache, be the one that wrote it.
    Errors name the field."""
    from genforge.data.cache import check_cache
    from genforge.engine.checkpoint import CheckpointReadError

    try:
        codec, info = load_codec(run_dir, device=torch.get_default_device())
    except (ConfigError, CheckpointReadError) as err:
        raise ConfigError(f"{field}: {err}") from None
    if info.kind != kind:
        wanted = "a klvae run" if kind == "latent" else "a vqgan or dvae run"
        raise ValueError(f"{field}={run_dir} is a {info.family!r} tokenizer of {KIND_NAMES[info.kind]}; {model} "
                         f"models {KIND_NAMES[kind]} (use {wanted})")
    check_cache(data, info, cache_path)
    return codec, info
