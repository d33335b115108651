"""Opening a finished (or running) run directory for sampling and evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from genforge.config import ConfigError, RunConfig, load_config
from genforge.data.loader import DataInfo, build_dataset, data_info
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
    info = data_info(build_dataset(cfg.data), cfg.data)
    with torch.device(device):
        return cfg.model.build_task(cfg, info)


def count_parameters(task: Task) -> dict[str, int]:
    """Trainable parameters per phase and in total."""
    counts = {phase: sum(p.numel() for p in task.parameters_for(phase)) for phase in task.phases}
    counts["total"] = sum(p.numel() for p in task.parameters())
    return counts


def load_run(run_dir: Path, device: torch.device | str = "cpu", ema: bool = True) -> LoadedRun:
    """Config + task with the latest checkpoint's EMA (or live) weights, safetensors only."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    cfg = load_config(str(config_path))
    ckpt = CheckpointDir(run_dir / "checkpoints").latest()
    if ckpt is None:
        raise ConfigError(f"{run_dir} has no checkpoint yet (checkpoints/latest is missing)")
    state = read_json(ckpt / "trainer_state.json")
    info = DataInfo(**state["data_info"])
    with torch.device(device):
        task = cfg.model.build_task(cfg, info)
    task.load_state_dict(load_tensors(ckpt / "model.safetensors", str(device)))
    if ema:
        shadow = load_tensors(ckpt / "ema.safetensors", str(device))
        missing, unexpected = task.ema_module().load_state_dict(shadow, strict=False)
        if unexpected or len(shadow) == 0:
            raise ConfigError(f"{ckpt / 'ema.safetensors'} does not match this model ({unexpected[:3]})")
    task.load_state_from_checkpoint(state["family_state"])
    task.eval()
    return LoadedRun(cfg, task, int(state["step"]), ckpt)
