"""Timestep respacing (IDDPM §4): sample with a subset of the training timesteps, same marginals."""

from __future__ import annotations

import numpy as np
import torch

from genforge.diffusion.gaussian import GaussianDiffusion, LossType, MeanType, VarType
from genforge.diffusion.schedules import beta_schedule


def space_timesteps(num_timesteps: int, section_counts: str | list[int]) -> set[int]:
    """Kept timesteps: "ddimN" = N evenly strided steps from 0 (DDIM); "N" or "a,b,c" = that many steps
    spread evenly over each of equal sections of the schedule (IDDPM)."""
    if isinstance(section_counts, str) and section_counts.startswith("ddim"):
        wanted = int(section_counts[len("ddim"):])
        for stride in range(1, num_timesteps):
            if len(range(0, num_timesteps, stride)) == wanted:
                return set(range(0, num_timesteps, stride))
        section_counts = [wanted]  # no exact stride: spread evenly instead
    counts = [int(c) for c in section_counts.split(",")] if isinstance(section_counts, str) else list(section_counts)
    base, extra = divmod(num_timesteps, len(counts))
    kept: set[int] = set()
    start = 0
    for i, count in enumerate(counts):
        size = base + (1 if i < extra else 0)
        if not 1 <= count <= size:
            raise ValueError(f"cannot take {count} steps from a section of {size} timesteps")
        stride = (size - 1) / (count - 1) if count > 1 else 1
        kept.update(start + round(stride * j) for j in range(count))
        start += size
    return kept


class SpacedDiffusion(GaussianDiffusion):
    """The base process restricted to `use_timesteps`: β'_i = 1 − ᾱ_{k_i}/ᾱ_{k_{i−1}} keeps ᾱ at every kept
    step unchanged, and the model is called with the original timestep indices k_i."""

    def __init__(self, use_timesteps: set[int], betas: np.ndarray, mean_type: MeanType, var_type: VarType,
                 loss_type: LossType) -> None:
        base_ac = np.cumprod(1.0 - np.asarray(betas, dtype=np.float64))
        kept = sorted(use_timesteps)
        prev = np.append(1.0, base_ac[kept][:-1])
        super().__init__(1.0 - base_ac[kept] / prev, mean_type, var_type, loss_type)
        self.timestep_map = torch.tensor(kept, dtype=torch.long)


def create_diffusion(timestep_respacing: str | None = None, noise_schedule: str = "linear",
                     num_timesteps: int = 1000, mean_type: MeanType = MeanType.EPSILON, learn_sigma: bool = True,
                     loss_type: LossType = LossType.MSE) -> SpacedDiffusion:
    """DiT's defaults: linear schedule, T = 1000, ε-prediction, learned-range variance, hybrid loss."""
    betas = beta_schedule(noise_schedule, num_timesteps)
    kept = space_timesteps(num_timesteps, timestep_respacing) if timestep_respacing else set(range(num_timesteps))
    var_type = VarType.LEARNED_RANGE if learn_sigma else VarType.FIXED_SMALL
    return SpacedDiffusion(kept, betas, mean_type, var_type, loss_type)
