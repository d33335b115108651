"""Exponential moving average of a module's weights (the EMA model DiT and ADM sample from)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn


class EMA:
    """fp32 shadow copy of `module`'s trainable parameters (buffers, e.g. an EMA-updated codebook, stay live).

    decay_n = min(decay, (1 + n) / (10 + n)) with warm-up, where n counts updates since `start`;
    before `start` the shadow copies the weights. `decays` (parameter name -> decay) says which parameters an update
    averages and with which decay (a phase's own `train.phases.<phase>.ema_decay`); the others keep their shadow
    bit for bit (a stage of a cascade that this run does not train). Default: every parameter, at `decay`.
    """

    def __init__(self, module: nn.Module, decay: float, warmup: bool = True, start: int = 0,
                 decays: dict[str, float] | None = None) -> None:
        self.module, self.decay, self.warmup, self.start = module, decay, warmup, start
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        params = dict(module.named_parameters())
        self.shadow: dict[str, Tensor] = {n: params[n].detach().float().clone() for n in self.names}
        decays = decays if decays is not None else dict.fromkeys(self.names, decay)
        self.groups: dict[float, list[str]] = {}  # decay -> the names averaged with it
        for name in self.names:
            if name in decays:
                self.groups.setdefault(decays[name], []).append(name)

    def decay_at(self, step: int, decay: float | None = None) -> float:
        """The decay used by the update after optimizer step `step` (0 before `start`: copy) for a parameter whose
        configured decay is `decay` (default: the EMA's)."""
        decay = self.decay if decay is None else decay
        if step < self.start:
            return 0.0
        n = step - self.start
        return min(decay, (1 + n) / (10 + n)) if self.warmup else decay

    @torch.no_grad()
    def update(self, step: int) -> None:
        """shadow <- decay·shadow + (1 − decay)·weights, for every averaged parameter at once (one call per decay)."""
        params = dict(self.module.named_parameters())
        for decay, names in self.groups.items():
            live = [params[n].detach().float() for n in names]
            shadow = [self.shadow[n] for n in names]
            torch._foreach_lerp_(shadow, live, 1.0 - self.decay_at(step, decay))

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, Tensor], may_lack: set[str] = frozenset()) -> None:
        """Copy `state` into the shadow weights; names in `may_lack` (weights new since `state` was saved) keep their
        current shadow when absent."""
        missing = set(self.names) - set(state) - set(may_lack)
        if missing:
            raise KeyError(f"EMA state lacks {sorted(missing)[:5]}")
        for n in self.names:
            if n in state:
                self.shadow[n].copy_(state[n])

    @contextmanager
    def swapped_in(self) -> Iterator[nn.Module]:
        """Temporarily load the EMA weights into the module (e.g. to sample), then restore the live ones."""
        params = dict(self.module.named_parameters())
        backup = {n: params[n].detach().clone() for n in self.names}
        with torch.no_grad():
            for n in self.names:
                params[n].copy_(self.shadow[n])
        try:
            yield self.module
        finally:
            with torch.no_grad():
                for n in self.names:
                    params[n].copy_(backup[n])
