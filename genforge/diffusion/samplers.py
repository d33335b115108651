"""Samplers by name (in the spirit of k-diffusion's `sample_euler(model, x, sigmas, extra_args, callback)`): every
sampler is a function of ONE signature, `run(process, noise, *, generator, progress, eta)`, registered in `SAMPLERS`
with the timestep respacing it needs and whether it steps the discrete DDPM chain. `noise` is unit Gaussian x_T,
drawn by the caller, so the same noise can start any sampler; a `SamplingProcess` carries the (guided) model and,
for the DDPM chain, the respaced `GaussianDiffusion`, or for the σ-samplers (Karras et al. 2022's VE form
x = x₀ + σ·ε) the denoiser D(x; σ) and the σ steps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
from torch import Tensor
from tqdm.auto import tqdm

from genforge.core.registry import Registry
from genforge.diffusion.gaussian import GaussianDiffusion, Model
from genforge.diffusion.objectives import Denoiser

__all__ = ["SAMPLERS", "Sampler", "SamplerFn", "SamplingProcess", "sample_ddim", "sample_ddpm", "sample_dpmpp_2m",
           "sample_euler", "sample_euler_ancestral", "sample_heun"]


@dataclass
class SamplingProcess:
    """What a sampler runs on. The DDPM chain (ddpm, ddim): `model`, `model_kwargs`, `clip_denoised` (with
    `dynamic_threshold`: Imagen's dynamic thresholding of x̂₀ instead of the static clip) and the respaced
    `diffusion`. The σ-samplers: `denoise` (D(x; σ), σ [B], which clips by itself) and `sigmas` (decreasing, ending
    at 0)."""

    model: Model | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    clip_denoised: bool = False
    dynamic_threshold: float | None = None
    diffusion: GaussianDiffusion | None = None
    denoise: Denoiser | None = None
    sigmas: Tensor | None = None


class SamplerFn(Protocol):
    """noise (x_T, unit Gaussian) → x₀."""

    def __call__(self, process: SamplingProcess, noise: Tensor, *, generator: torch.Generator | None,
                 progress: bool, eta: float = 0.0) -> Tensor: ...


@dataclass(frozen=True)
class Sampler:
    """A registered sampler: its name, its function, `respacing(steps)` (the DDPM chain's timestep respacing it runs
    on; "" for σ-samplers) and whether it steps the discrete DDPM chain (then it works with objective=ddpm only)."""

    name: str
    run: SamplerFn
    respacing: Callable[[int], str]
    discrete: bool = False


SAMPLERS: Registry[Sampler] = Registry("sampler")


# ------------------------------------------------------------------------------------------- the DDPM chain
def sample_ddpm(process: SamplingProcess, noise: Tensor, *, generator: torch.Generator | None, progress: bool,
                eta: float = 0.0) -> Tensor:
    """Ancestral sampling (Ho et al. 2020, Algorithm 2); `eta` is unused."""
    return process.diffusion.p_sample_loop(process.model, tuple(noise.shape), noise=noise,
                                           model_kwargs=process.model_kwargs, clip_denoised=process.clip_denoised,
                                           generator=generator, progress=progress,
                                           dynamic_threshold=process.dynamic_threshold)


def sample_ddim(process: SamplingProcess, noise: Tensor, *, generator: torch.Generator | None, progress: bool,
                eta: float = 0.0) -> Tensor:
    """DDIM (Song et al. 2021, eq. 12 with σ_t(η) of eq. 16): η = 0 deterministic, η = 1 DDPM-like."""
    return process.diffusion.ddim_sample_loop(process.model, tuple(noise.shape), noise=noise,
                                              model_kwargs=process.model_kwargs, clip_denoised=process.clip_denoised,
                                              generator=generator, progress=progress, eta=eta,
                                              dynamic_threshold=process.dynamic_threshold)


# ------------------------------------------------------------------------------------------- σ-samplers
def _steps(process: SamplingProcess, progress: bool, desc: str) -> tuple[Tensor, Any]:
    sigmas = process.sigmas
    return sigmas, tqdm(range(len(sigmas) - 1), desc=desc, disable=not progress, leave=False)


def _at(sigma: Tensor, x: Tensor) -> Tensor:
    """σ as a [B] tensor on x's device, dtype float32 (the denoiser's input)."""
    return sigma.to(x.device, torch.float32).expand(x.shape[0])


def _noise_like(x: Tensor, generator: torch.Generator | None) -> Tensor:
    draw_on = generator.device if generator is not None else x.device
    return torch.randn(x.shape, generator=generator, device=draw_on).to(x.device, x.dtype)


def sample_euler(process: SamplingProcess, noise: Tensor, *, generator: torch.Generator | None, progress: bool,
                 eta: float = 0.0) -> Tensor:
    """Euler's method on the ODE dx/dσ = (x − D(x; σ))/σ (Karras et al. 2022, Algorithm 1 without its correction)."""
    sigmas, steps = _steps(process, progress, "euler")
    x = noise * sigmas[0].item()
    for i in steps:
        d = (x - process.denoise(x, _at(sigmas[i], x))) / sigmas[i].item()
        x = x + d * (sigmas[i + 1] - sigmas[i]).item()
    return x


def sample_heun(process: SamplingProcess, noise: Tensor, *, generator: torch.Generator | None, progress: bool,
                eta: float = 0.0) -> Tensor:
    """Heun's 2nd-order method (Karras et al. 2022, Algorithm 1 with S_churn = 0; Euler on the last step)."""
    sigmas, steps = _steps(process, progress, "heun")
    x = noise * sigmas[0].item()
    for i in steps:
        s, s_next = sigmas[i].item(), sigmas[i + 1].item()
        d = (x - process.denoise(x, _at(sigmas[i], x))) / s
        x_next = x + d * (s_next - s)
        if s_next > 0:  # the correction, trapezoidal in σ
            d_next = (x_next - process.denoise(x_next, _at(sigmas[i + 1], x))) / s_next
            x_next = x + (d + d_next) / 2 * (s_next - s)
        x = x_next
    return x


def sample_euler_ancestral(process: SamplingProcess, noise: Tensor, *, generator: torch.Generator | None,
                           progress: bool, eta: float = 0.0) -> Tensor:
    """Ancestral Euler (k-diffusion): Euler to σ_down, then noise of std σ_up = η·posterior std (η = 0 means 1)."""
    # σ → σ': σ_up = min(σ', η·√(σ'²(σ² − σ'²)/σ²)), σ_down = √(σ'² − σ_up²)
    sigmas, steps = _steps(process, progress, "euler_ancestral")
    eta = eta or 1.0
    x = noise * sigmas[0].item()
    for i in steps:
        s, s_next = sigmas[i].item(), sigmas[i + 1].item()
        up = min(s_next, eta * (s_next**2 * (s**2 - s_next**2) / s**2) ** 0.5)
        down = (s_next**2 - up**2) ** 0.5
        d = (x - process.denoise(x, _at(sigmas[i], x))) / s
        x = x + d * (down - s)
        if s_next > 0:
            x = x + _noise_like(x, generator) * up
    return x


def sample_dpmpp_2m(process: SamplingProcess, noise: Tensor, *, generator: torch.Generator | None, progress: bool,
                    eta: float = 0.0) -> Tensor:
    """DPM-Solver++(2M) (Lu et al. 2022, Algorithm 2): a 2nd-order multistep update in λ = −ln σ."""
    sigmas, steps = _steps(process, progress, "dpmpp_2m")
    x = noise * sigmas[0].item()
    previous = None
    for i in steps:
        s, s_next = sigmas[i].item(), sigmas[i + 1].item()
        denoised = process.denoise(x, _at(sigmas[i], x))
        if s_next == 0:
            x = denoised
            break
        h = math.log(s) - math.log(s_next)  # step in λ = −ln σ
        if previous is None:
            estimate = denoised
        else:
            r = (math.log(sigmas[i - 1].item()) - math.log(s)) / h  # last step over this one
            estimate = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * previous
        x = (s_next / s) * x - math.expm1(-h) * estimate
        previous = denoised
    return x


def _ddpm_respacing(steps: int) -> str:
    """`steps` evenly spaced timesteps, both ends kept (IDDPM §4)."""
    return str(steps)


def _ddim_respacing(steps: int) -> str:
    """`steps` timesteps 0, k, 2k, … of one integer stride (DDIM's spacing)."""
    return f"ddim{steps}"


def _no_respacing(steps: int) -> str:
    """σ-samplers step their own σ discretisation, not a respaced chain."""
    return ""


SAMPLERS.register("ddpm", Sampler("ddpm", sample_ddpm, _ddpm_respacing, discrete=True))
SAMPLERS.register("ddim", Sampler("ddim", sample_ddim, _ddim_respacing, discrete=True))
SAMPLERS.register("euler", Sampler("euler", sample_euler, _no_respacing))
SAMPLERS.register("heun", Sampler("heun", sample_heun, _no_respacing))
SAMPLERS.register("euler_ancestral", Sampler("euler_ancestral", sample_euler_ancestral, _no_respacing))
SAMPLERS.register("dpmpp_2m", Sampler("dpmpp_2m", sample_dpmpp_2m, _no_respacing))
