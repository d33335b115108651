"""AdamW (fused where the device supports it) and the learning-rate schedules."""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from genforge.core.config import TrainConfig


def _decayed(param: nn.Parameter) -> bool:
    """Weight decay applies to matrices (ndim ≥ 2), not to biases, norms and embeddings' scalars."""
    return param.ndim >= 2


def build_optimizer(params: Iterable[nn.Parameter], cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay only on matrices (`_decayed`)."""
    params = [p for p in params if p.requires_grad]
    groups = [
        {"params": [p for p in params if _decayed(p)], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if not _decayed(p)], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    fused = device.type in ("cuda", "cpu", "xpu", "mps")
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=fused)
    except (RuntimeError, TypeError):  # a device or dtype without the fused kernel
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr at optimizer step `step`: linear warm-up, then constant, cosine decay to min_lr_ratio at
    cfg.steps, or exponential: lr_decay_rate^⌊(step − warmup) / lr_decay_every⌋, floored at min_lr_ratio (the
    step-wise ExponentialLR of DALLE-pytorch's train_vae.py, gamma 0.98 every 100 steps; the seed also decays once
    after its very first step, this schedule first after lr_decay_every steps)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return 1.0
    if cfg.lr_schedule == "exponential":
        decays = (step - cfg.warmup_steps) // cfg.lr_decay_every
        return max(cfg.min_lr_ratio, cfg.lr_decay_rate ** decays)
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> LambdaLR:
    """The learning-rate schedule of `cfg` (`lr_factor`) over optimizer steps."""
    return LambdaLR(optimizer, lambda step: lr_factor(step, cfg))


def apply_optimizer_settings(optimizer: torch.optim.Optimizer, scheduler: LambdaLR, cfg: TrainConfig) -> None:
    """Give a restored optimizer and schedule the settings of `cfg` (a resume that changed train.lr, the schedule,
    weight decay or betas): the state restores the saved lr, so the base lr, the current lr (base · `lr_factor` at
    the restored step) and the rest are set again. With unchanged settings every value stays bit for bit."""
    scheduler.base_lrs = [cfg.lr] * len(optimizer.param_groups)
    for group in optimizer.param_groups:
        group["initial_lr"] = cfg.lr
        group["lr"] = cfg.lr * lr_factor(scheduler.last_epoch, cfg)
        group["betas"] = tuple(cfg.betas)
        group["weight_decay"] = cfg.weight_decay if all(_decayed(p) for p in group["params"]) else 0.0
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


@torch.no_grad()
def materialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state (AdamW: zero moments, step 0) for every parameter that has none, without
    changing a weight: one step at lr 0 on zero gradients (as torch.distributed.checkpoint's state-dict helpers do).
    A sharded checkpoint is loaded into existing tensors, in place."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if all(optimizer.state.get(p) for p in params):
        return
    lrs = [group["lr"] for group in optimizer.param_groups]
    for p in params:
        p.grad = torch.zeros_like(p)
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
