"""Per-sample randomness that does not depend on how a global batch is split.

A task draws its training noise (diffusion noise and timesteps, label dropout, masks, ...) from
`batch["rng"]`. Every draw is made for the whole global batch of the optimizer step from a generator
seeded by (seed, step, phase, draw number), and this micro-batch takes its own rows. So 1 process,
N processes and gradient accumulation see identical noise for each sample, and resuming at step `s`
needs no RNG state at all.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import Tensor


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (SplitMix-quality mixing through numpy's SeedSequence)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)[0] >> 1)


class BatchRandom:
    """Random draws for rows [offset, offset + size) of a global batch of `global_size` samples."""

    def __init__(self, seed: int, step: int, phase: int, global_size: int, offset: int, size: int,
                 device: torch.device | str = "cpu") -> None:
        self.seed, self.step, self.phase = seed, step, phase
        self.global_size, self.offset, self.size = global_size, offset, size
        self.device = torch.device(device)
        self.draws = 0

    def _generator(self) -> torch.Generator:
        self.draws += 1
        gen = torch.Generator(device=self.device)
        gen.manual_seed(mix_seed(self.seed, self.step, self.phase, self.draws))
        return gen

    def _rows(self, full: Tensor) -> Tensor:
        return full[self.offset : self.offset + self.size]

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """Standard normal [size, *shape]."""
        gen = self._generator()
        return self._rows(torch.randn(self.global_size, *shape, generator=gen, device=self.device, dtype=dtype))

    def rand(self, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """Uniform [0, 1) of shape [size, *shape]."""
        gen = self._generator()
        return self._rows(torch.rand(self.global_size, *shape, generator=gen, device=self.device, dtype=dtype))

    def rand_global(self, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """Uniform [0, 1) for the whole global batch, [global_size, *shape] (this micro-batch's rows are
        `rows(...)` of it): for normalisers that depend on every sample of the step."""
        gen = self._generator()
        return torch.rand(self.global_size, *shape, generator=gen, device=self.device, dtype=dtype)

    def rand_rows(self, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """Uniform [0, 1) of shape [size, *shape], row r drawn from its own generator seeded by (seed, step, phase,
        draw number, global row r): as split-invariant as `rand`, but only this micro-batch's rows are made, so
        memory grows with the micro-batch, not the global batch (dVAE's Gumbel noise at DALL·E size: [B, 8192,
        32, 32] per row)."""
        self.draws += 1
        out = torch.empty(self.size, *shape, device=self.device, dtype=dtype)
        gen = torch.Generator(device=self.device)
        for i in range(self.size):  # one draw per row of the micro-batch, not per element
            gen.manual_seed(mix_seed(self.seed, self.step, self.phase, self.draws, self.offset + i))
            torch.rand(shape, generator=gen, device=self.device, dtype=dtype, out=out[i])
        return out

    def rows(self, full: Tensor) -> Tensor:
        """This micro-batch's rows of a [global_size, ...] tensor."""
        return self._rows(full)

    def randint(self, high: int, *shape: int) -> Tensor:
        """Integers uniform in [0, high), shape [size, *shape]."""
        gen = self._generator()
        return self._rows(torch.randint(high, (self.global_size, *shape), generator=gen, device=self.device))


def global_rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU, CUDA) global RNG states, for a checkpoint (a family may draw from them)."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_global_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `global_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
