"""Samplers by name (in the spirit of k-diffusion's `sample_euler(model, x, sigmas, ...)`): every sampler is a
function of ONE signature, `run(diffusion, model, x_T, *, model_kwargs, generator, clip_denoised, progress, eta)`,
registered in `SAMPLERS` with the timestep respacing it needs. Callers look a sampler up by name and never switch
over the known ones; x_T is drawn by the caller, so the same noise can start any sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch import Tensor

from genforge.core.registry import Registry
from genforge.diffusion.gaussian import GaussianDiffusion, Model

__all__ = ["SAMPLERS", "Sampler", "SamplerFn", "sample_ddim", "sample_ddpm"]


class SamplerFn(Protocol):
    """x_T → x_0 on `diffusion` (respaced as the sampler's `respacing` says), on x's device."""

    def __call__(self, diffusion: GaussianDiffusion, model: Model, x: Tensor, *,
                 model_kwargs: dict[str, Any] | None, generator: torch.Generator | None, clip_denoised: bool,
                 progress: bool, eta: float = 0.0) -> Tensor: ...


@dataclass(frozen=True)
class Sampler:
    """A registered sampler: its name, its function, and `respacing(steps)`, the timestep respacing it runs on."""

    name: str
    run: SamplerFn
    respacing: Callable[[int], str]


SAMPLERS: Registry[Sampler] = Registry("sampler")


def sample_ddpm(diffusion: GaussianDiffusion, model: Model, x: Tensor, *, model_kwargs: dict[str, Any] | None,
                generator: torch.Generator | None, clip_denoised: bool, progress: bool, eta: float = 0.0) -> Tensor:
    """Ancestral sampling (Ho et al. 2020, Algorithm 2); `eta` is unused."""
    return diffusion.p_sample_loop(model, tuple(x.shape), noise=x, model_kwargs=model_kwargs,
                                   clip_denoised=clip_denoised, generator=generator, progress=progress)


def sample_ddim(diffusion: GaussianDiffusion, model: Model, x: Tensor, *, model_kwargs: dict[str, Any] | None,
                generator: torch.Generator | None, clip_denoised: bool, progress: bool, eta: float = 0.0) -> Tensor:
    """DDIM (Song et al. 2021, eq. 12 with σ_t(η) of eq. 16): η = 0 deterministic, η = 1 DDPM-like."""
    return diffusion.ddim_sample_loop(model, tuple(x.shape), noise=x, model_kwargs=model_kwargs,
                                      clip_denoised=clip_denoised, generator=generator, progress=progress, eta=eta)


def _ddpm_respacing(steps: int) -> str:
    """`steps` evenly spaced timesteps, both ends kept (IDDPM §4)."""
    return str(steps)


def _ddim_respacing(steps: int) -> str:
    """`steps` timesteps 0, k, 2k, … of one integer stride (DDIM's spacing)."""
    return f"ddim{steps}"


SAMPLERS.register("ddpm", Sampler("ddpm", sample_ddpm, _ddpm_respacing))
SAMPLERS.register("ddim", Sampler("ddim", sample_ddim, _ddim_respacing))
