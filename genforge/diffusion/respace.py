"""Timestep respacing (IDDPM §4): run a subset of the training timesteps with the same marginals q(x_t | x_0)."""

from __future__ import annotations

from typing import Any, Iterable, Literal

import numpy as np
import torch
from torch import Tensor

from genforge.diffusion.gaussian import GaussianDiffusion, LossType, MeanType, Model, VarType
from genforge.diffusion.schedules import beta_schedule


def space_timesteps(num_timesteps: int, section_counts: str | list[int]) -> set[int]:
    """Timesteps to keep (IDDPM §4): "ddimN" = N steps 0, k, 2k, … with one integer stride k (DDIM; evenly
    spread like "N" when no stride gives exactly N); "N" or "a,b,c" (or [a, b, c]) = the schedule cut into equal
    sections, each with that many evenly spaced steps, both ends included."""
    if isinstance(section_counts, str) and section_counts.startswith("ddim"):
        wanted = int(section_counts[len("ddim"):])
        for stride in range(1, num_timesteps + 1):
            if len(range(0, num_timesteps, stride)) == wanted:
                return set(range(0, num_timesteps, stride))
        section_counts = [wanted]
    counts = [int(c) for c in section_counts.split(",")] if isinstance(section_counts, str) else list(section_counts)
    sizes = np.full(len(counts), num_timesteps // len(counts))
    sizes[: num_timesteps % len(counts)] += 1  # the first sections take the remainder
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    kept: set[int] = set()
    for start, size, count in zip(starts, sizes, counts):
        if not 0 <= count <= size:
            raise ValueError(f"cannot take {count} steps from a section of {size} of {num_timesteps} timesteps")
        kept.update((start + np.round(np.linspace(0, size - 1, count))).astype(int).tolist())
    if not kept:
        raise ValueError(f"respacing {section_counts!r} keeps no timestep")
    return kept


class SpacedDiffusion(GaussianDiffusion):
    """The base process restricted to kept steps k_0 < k_1 < …: β'_i = 1 − ᾱ_{k_i}/ᾱ_{k_{i−1}} leaves ᾱ at every
    kept step unchanged (IDDPM §4), and the model is called with the original indices k_i."""

    def __init__(self, use_timesteps: Iterable[int], betas: np.ndarray, mean_type: MeanType, var_type: VarType,
                 loss_type: LossType) -> None:
        base_ac = np.cumprod(1.0 - np.asarray(betas, dtype=np.float64))
        kept = np.array(sorted(set(use_timesteps)), dtype=np.int64)
        if kept.size == 0 or kept[0] < 0 or kept[-1] >= len(base_ac):
            raise ValueError(f"kept timesteps must be a non-empty subset of 0..{len(base_ac) - 1}")
        ac = base_ac[kept]
        super().__init__(1.0 - ac / np.append(1.0, ac[:-1]), mean_type, var_type, loss_type)
        self.timestep_map = torch.from_numpy(kept)  # spaced index i → original index k_i
        self._maps: dict[torch.device, Tensor] = {}

    def _run_model(self, model: Model, x: Tensor, t: Tensor, model_kwargs: dict[str, Any] | None) -> Tensor:
        """Call the model with the original timestep indices k_t (one gather, map cached per device)."""
        if t.device not in self._maps:
            self._maps[t.device] = self.timestep_map.to(t.device)
        return super()._run_model(model, x, self._maps[t.device][t], model_kwargs)


def create_diffusion(timestep_respacing: str | None = None, noise_schedule: str = "linear",
                     num_timesteps: int = 1000, mean_type: MeanType = MeanType.EPSILON, learn_sigma: bool = True,
                     loss_type: LossType = LossType.MSE,
                     fixed_variance: Literal["small", "large"] = "small") -> SpacedDiffusion:
    """The IDDPM process as DiT configures it (linear, T = 1000, ε, learned range, hybrid MSE); learn_sigma=False
    gives the fixed variance `fixed_variance`: "small" β̃_t (FIXED_SMALL) or "large" β_t (FIXED_LARGE, what DiT's
    sigma_small=False default picks). Respacing "" or None keeps all steps."""
    if fixed_variance not in ("small", "large"):
        raise ValueError(f"fixed_variance must be 'small' or 'large', got {fixed_variance!r}")
    betas = beta_schedule(noise_schedule, num_timesteps)
    kept = space_timesteps(num_timesteps, timestep_respacing) if timestep_respacing else range(num_timesteps)
    fixed = VarType.FIXED_SMALL if fixed_variance == "small" else VarType.FIXED_LARGE
    var_type = VarType.LEARNED_RANGE if learn_sigma else fixed
    return SpacedDiffusion(kept, betas, mean_type, var_type, loss_type)
