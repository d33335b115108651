"""Exponential moving average of a module's weights (the EMA model DiT and ADM sample from)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn


class EMA:
    """fp32 shadow copy of `module`'s trainable parameters (buffers, e.g. an EMA-updated codebook, stay live).

    decay_n = min(decay, (1 + n) / (10 + n)) with warm-up, where n counts updates since `start`;
    before `start` the shadow copies the weights.
    """

    def __init__(self, module: nn.Module, decay: float, warmup: bool = True, start: int = 0) -> None:
        self.module, self.decay, self.warmup, self.start = module, decay, warmup, start
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        params = dict(module.named_parameters())
        self.shadow: dict[str, Tensor] = {n: params[n].detach().float().clone() for n in self.names}

    def decay_at(self, step: int) -> float:
        """The decay used by the update after optimizer step `step` (0 before `start`: copy)."""
        if step < self.start:
            return 0.0
        n = step - self.start
        return min(self.decay, (1 + n) / (10 + n)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, step: int) -> None:
        """shadow <- decay·shadow + (1 − decay)·weights, for every parameter at once."""
        params = dict(self.module.named_parameters())
        live = [params[n].detach().float() for n in self.names]
        shadow = [self.shadow[n] for n in self.names]
        torch._foreach_lerp_(shadow, live, 1.0 - self.decay_at(step))

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        missing = set(self.names) - set(state)
        if missing:
            raise KeyError(f"EMA state lacks {sorted(missing)[:5]}")
        for n in self.names:
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
