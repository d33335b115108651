"""Training objectives of the diffusion families, one small class each with the same interface (as NVlabs/edm's
`training/loss.py`): `training_losses` (per-example losses of a batch) and, for sampling, `denoiser` (the
network seen as an x₀-estimator D(x; σ) in the variance-exploding form x = x₀ + σ·ε that every σ-sampler steps,
Karras et al. 2022 §2), `sigmas` (its time-step discretisation) and `sigma_of_time` (what σ a model-time input
means, for guidance intervals).

The training noise is drawn first (`draw`: the time or σ, then ε, from the batch's random stream), then the loss
is computed (`training_losses`), so a family can draw its own numbers (label dropout) in between, in a fixed order.

- `DDPMObjective`: IDDPM's discrete chain (genforge.diffusion.gaussian); in VE form x = x_t / √ᾱ_t, σ² = (1 − ᾱ)/ᾱ.
- `FlowObjective`: rectified flow / the linear interpolant x_t = (1 − t)·x₀ + t·ε with the velocity target
  v = ε − x₀ (Liu et al. 2022; Lipman et al. 2022; SiT), t uniform or logit-normal (SD3 §3.1); in VE form
  σ = t / (1 − t), x = x_t / (1 − t).
- `EDMObjective`: EDM's preconditioning and loss (Karras et al. 2022, Table 1): D = c_skip·x + c_out·F(c_in·x;
  c_noise), ln σ ~ N(P_mean, P_std²), weight λ(σ) = (σ² + σ_data²)/(σ·σ_data)².

Models are called as model(x, t, **kwargs) with t a float [B] near DiT's 0..1000 timestep range, and the first C
output channels are the prediction (learned-variance channels, ddpm only, follow).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from genforge.core.random import BatchRandom
from genforge.diffusion.gaussian import GaussianDiffusion, MeanType, Model, clip_x0, mean_flat

Denoiser = Callable[[Tensor, Tensor], Tensor]  # D(x [B, C, ...], σ [B]) -> x̂₀ [B, C, ...]


def karras_sigmas(steps: int, sigma_min: float, sigma_max: float, rho: float = 7.0) -> Tensor:
    """EDM's time steps (Karras et al. 2022, eq. 5): σ_i = (σ_max^{1/ρ} + i/(N−1)·(σ_min^{1/ρ} − σ_max^{1/ρ}))^ρ,
    then σ_N = 0: float64 [steps + 1], decreasing."""
    ramp = torch.linspace(0, 1, steps, dtype=torch.float64)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    sigmas = (hi + ramp * (lo - hi)) ** rho if steps > 1 else torch.tensor([sigma_max], dtype=torch.float64)
    return torch.cat([sigmas, sigmas.new_zeros(1)])


def _expand(values: Tensor, like: Tensor) -> Tensor:
    """[B] -> [B, 1, ...] to broadcast against `like`."""
    return values.view(-1, *([1] * (like.ndim - 1))).to(like.dtype)


class Objective:
    """The interface every objective implements."""

    name: str
    sigma_min: float
    sigma_max: float

    def draw(self, rng: BatchRandom, x0: Tensor) -> tuple[Tensor, Tensor]:
        """The training time (or σ) [B] and noise ε [B, C, ...] of the batch x0, from its random stream."""
        raise NotImplementedError

    def training_losses(self, model: Model, x0: Tensor, time: Tensor, noise: Tensor,
                        model_kwargs: dict[str, Any] | None = None) -> dict[str, Tensor]:
        """Per-example losses [B] of the batch x0 at the drawn `time` and `noise`: "loss", plus parts to log."""
        raise NotImplementedError

    def denoiser(self, model: Model, model_kwargs: dict[str, Any] | None, channels: int, clip: bool = False,
                 dynamic_threshold: float | None = None) -> Denoiser:
        """D(x; σ): the model as an estimator of x₀ from x = x₀ + σ·ε (with `clip` brought into [-1, 1] by
        `clip_x0`: clamped, or dynamically thresholded at the `dynamic_threshold` quantile)."""
        raise NotImplementedError

    def sigmas(self, steps: int, rho: float = 7.0) -> Tensor:
        """σ_0 > … > σ_{steps−1} > σ_steps = 0 to sample with (default: EDM's ρ-spacing between σ_max and σ_min)."""
        return karras_sigmas(steps, self.sigma_min, self.sigma_max, rho)

    def sigma_of_time(self, t: Tensor) -> Tensor:
        """σ of a model-time input t."""
        raise NotImplementedError


class DDPMObjective(Objective):
    """IDDPM's objective on `diffusion` (unchanged: `GaussianDiffusion.training_losses`), and its VE view for the
    σ-samplers, with continuous timesteps interpolated in log σ between the chain's (k-diffusion's DiscreteSchedule)."""

    name = "ddpm"

    def __init__(self, diffusion: GaussianDiffusion, draw_timesteps: Callable[[BatchRandom], Tensor],
                 min_snr_gamma: float | None = None) -> None:
        self.diffusion, self.draw_timesteps, self.min_snr_gamma = diffusion, draw_timesteps, min_snr_gamma
        ac = diffusion.coefs["alphas_cumprod"]
        self.log_sigmas = (((1 - ac) / ac).sqrt()).log()  # float64 [T], increasing
        self.sigma_min, self.sigma_max = float(self.log_sigmas[0].exp()), float(self.log_sigmas[-1].exp())

    def draw(self, rng: BatchRandom, x0: Tensor) -> tuple[Tensor, Tensor]:
        return self.draw_timesteps(rng), rng.randn(*x0.shape[1:]).to(x0.dtype)  # t long [B], ε

    def training_losses(self, model: Model, x0: Tensor, time: Tensor, noise: Tensor,
                        model_kwargs: dict[str, Any] | None = None) -> dict[str, Tensor]:
        return self.diffusion.training_losses(model, x0, time, model_kwargs=model_kwargs, noise=noise,
                                              min_snr_gamma=self.min_snr_gamma)

    def time_of_sigma(self, sigma: Tensor) -> Tensor:
        """The (fractional) timestep whose σ is `sigma`: linear interpolation of log σ over the chain."""
        table = self.log_sigmas.to(sigma.device)
        log_sigma = sigma.double().clamp(float(table[0].exp()), float(table[-1].exp())).log()
        index = torch.searchsorted(table, log_sigma).clamp(1, len(table) - 1)
        low, high = table[index - 1], table[index]
        return (index - 1 + (log_sigma - low) / (high - low)).float()

    def sigma_of_time(self, t: Tensor) -> Tensor:
        table = self.log_sigmas.to(t.device)
        t = t.double().clamp(0, len(table) - 1)
        low = t.floor().long().clamp(max=len(table) - 2)
        frac = t - low
        return (table[low] * (1 - frac) + table[low + 1] * frac).exp().float()

    def denoiser(self, model: Model, model_kwargs: dict[str, Any] | None, channels: int, clip: bool = False,
                 dynamic_threshold: float | None = None) -> Denoiser:
        mean_type = self.diffusion.mean_type

        def denoise(x: Tensor, sigma: Tensor) -> Tensor:
            alpha_bar = _expand(1 / (1 + sigma.double() ** 2), x)  # ᾱ of this σ
            x_t = x * alpha_bar.sqrt()
            out = model(x_t, self.time_of_sigma(sigma), **(model_kwargs or {}))[:, :channels]
            if mean_type == MeanType.EPSILON:
                x0 = (x_t - (1 - alpha_bar).sqrt() * out) / alpha_bar.sqrt()
            elif mean_type == MeanType.START_X:
                x0 = out
            else:  # v = √ᾱ·ε − √(1−ᾱ)·x₀  =>  x₀ = √ᾱ·x_t − √(1−ᾱ)·v
                x0 = alpha_bar.sqrt() * x_t - (1 - alpha_bar).sqrt() * out
            return clip_x0(x0, dynamic_threshold) if clip else x0

        return denoise


class FlowObjective(Objective):
    """Rectified flow: x_t = (1 − t)·x₀ + t·ε, the model predicts v = ε − x₀ at model time 1000·t; loss
    ‖v̂ − v‖² (conditional flow matching). t ~ U(0, 1), or logit-normal: t = sigmoid(m + s·n), n ~ N(0, 1)."""

    name = "flow"
    TIME_SCALE = 1000.0  # model time = 1000·t, DiT's timestep range
    T_MAX = 1 - 1e-3  # sampling starts at σ = t/(1 − t) = 999: x ≈ ε·999, the x₀ share (0.1 %) is dropped

    def __init__(self, timestep_sampling: str = "uniform", mean: float = 0.0, std: float = 1.0,
                 shift: float = 1.0) -> None:
        self.timestep_sampling, self.mean, self.std, self.shift = timestep_sampling, mean, std, shift
        self.sigma_min, self.sigma_max = 1e-3, self.T_MAX / (1 - self.T_MAX)

    @staticmethod
    def interpolate(x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """x_t = (1 − t)·x₀ + t·ε, t [B]."""
        return _expand(1 - t, x0) * x0 + _expand(t, x0) * noise

    def draw(self, rng: BatchRandom, x0: Tensor) -> tuple[Tensor, Tensor]:
        if self.timestep_sampling == "uniform":
            t = rng.rand()  # [B] in [0, 1)
        else:
            t = torch.sigmoid(self.mean + self.std * rng.randn())
        return t, rng.randn(*x0.shape[1:]).to(x0.dtype)

    def training_losses(self, model: Model, x0: Tensor, time: Tensor, noise: Tensor,
                        model_kwargs: dict[str, Any] | None = None) -> dict[str, Tensor]:
        t = time
        x_t = self.interpolate(x0, t, noise)
        v = model(x_t, t * self.TIME_SCALE, **(model_kwargs or {}))[:, : x0.shape[1]]
        mse = mean_flat((v.float() - (noise - x0).float()) ** 2)
        return {"loss": mse, "mse": mse}

    def sigmas(self, steps: int, rho: float = 7.0) -> Tensor:
        """t uniform from T_MAX to 0 (shifted as SD3 §5.3.2: t' = s·t / (1 + (s − 1)·t)), as σ = t/(1 − t); ρ is
        not used."""
        t = torch.linspace(self.T_MAX, 0, steps + 1, dtype=torch.float64)
        t = self.shift * t / (1 + (self.shift - 1) * t)
        return t / (1 - t)

    def sigma_of_time(self, t: Tensor) -> Tensor:
        t = t / self.TIME_SCALE
        return t / (1 - t).clamp_min(1e-12)

    def denoiser(self, model: Model, model_kwargs: dict[str, Any] | None, channels: int, clip: bool = False,
                 dynamic_threshold: float | None = None) -> Denoiser:
        def denoise(x: Tensor, sigma: Tensor) -> Tensor:
            t = sigma.double() / (1 + sigma.double())  # [B]
            x_t = x / _expand(1 + sigma.double(), x)
            v = model(x_t, (t * self.TIME_SCALE).float(), **(model_kwargs or {}))[:, :channels]
            x0 = x_t - _expand(t, x) * v
            return clip_x0(x0, dynamic_threshold) if clip else x0

        return denoise


class EDMObjective(Objective):
    """EDM (Karras et al. 2022, Table 1): D(x; σ) = c_skip·x + c_out·F(c_in·x; c_noise) with c_skip = σ_d²/(σ² + σ_d²),
    c_out = σ·σ_d/√(σ² + σ_d²), c_in = 1/√(σ² + σ_d²), c_noise = ¼·ln σ (given to the model as 1000·c_noise);
    training σ: ln σ ~ N(P_mean, P_std²); loss λ(σ)·‖D(x₀ + σ·ε; σ) − x₀‖², λ = (σ² + σ_d²)/(σ·σ_d)²."""

    name = "edm"
    TIME_SCALE = 1000.0

    def __init__(self, sigma_data: float = 0.5, p_mean: float = -1.2, p_std: float = 1.2, sigma_min: float = 0.002,
                 sigma_max: float = 80.0) -> None:
        self.sigma_data, self.p_mean, self.p_std = sigma_data, p_mean, p_std
        self.sigma_min, self.sigma_max = sigma_min, sigma_max

    def preconditioning(self, sigma: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """c_skip, c_out, c_in, c_noise at σ (Table 1)."""
        sd2 = self.sigma_data**2
        c_skip = sd2 / (sigma**2 + sd2)
        c_out = sigma * self.sigma_data / (sigma**2 + sd2).sqrt()
        c_in = 1 / (sigma**2 + sd2).sqrt()
        return c_skip, c_out, c_in, sigma.log() / 4

    def loss_weight(self, sigma: Tensor) -> Tensor:
        """λ(σ) = (σ² + σ_d²)/(σ·σ_d)² (Table 1): the effective weight of the network's own error is 1."""
        return (sigma**2 + self.sigma_data**2) / (sigma * self.sigma_data) ** 2

    def precondition(self, model: Model, x: Tensor, sigma: Tensor, model_kwargs: dict[str, Any] | None,
                     channels: int) -> Tensor:
        """D(x; σ) for x [B, C, ...], σ [B]."""
        c_skip, c_out, c_in, c_noise = self.preconditioning(sigma.float())
        out = model(_expand(c_in, x) * x, c_noise * self.TIME_SCALE, **(model_kwargs or {}))[:, :channels]
        return _expand(c_skip, x) * x + _expand(c_out, x) * out

    def draw(self, rng: BatchRandom, x0: Tensor) -> tuple[Tensor, Tensor]:
        sigma = (self.p_mean + self.p_std * rng.randn()).exp()  # [B], log-normal
        return sigma, rng.randn(*x0.shape[1:]).to(x0.dtype)

    def training_losses(self, model: Model, x0: Tensor, time: Tensor, noise: Tensor,
                        model_kwargs: dict[str, Any] | None = None) -> dict[str, Tensor]:
        sigma = time
        denoised = self.precondition(model, x0 + _expand(sigma, x0) * noise, sigma, model_kwargs, x0.shape[1])
        mse = mean_flat((denoised.float() - x0.float()) ** 2)
        return {"loss": self.loss_weight(sigma) * mse, "mse": mse}

    def sigma_of_time(self, t: Tensor) -> Tensor:
        return (t / self.TIME_SCALE * 4).exp()

    def denoiser(self, model: Model, model_kwargs: dict[str, Any] | None, channels: int, clip: bool = False,
                 dynamic_threshold: float | None = None) -> Denoiser:
        def denoise(x: Tensor, sigma: Tensor) -> Tensor:
            x0 = self.precondition(model, x, sigma, model_kwargs, channels)
            return clip_x0(x0, dynamic_threshold) if clip else x0

        return denoise


def gaussian_denoiser(mean: float, std: float) -> Denoiser:
    """The ideal denoiser of data N(mean, std²) per element: E[x₀ | x₀ + σ·ε = x] = mean + std²/(std² + σ²)·(x − mean)
    (for tests of samplers against a known answer)."""

    def denoise(x: Tensor, sigma: Tensor) -> Tensor:
        s2 = _expand(sigma.double() ** 2, x)
        return (mean + std**2 / (std**2 + s2) * (x - mean)).to(x.dtype)

    return denoise


__all__ = ["DDPMObjective", "Denoiser", "EDMObjective", "FlowObjective", "Objective", "gaussian_denoiser",
           "karras_sigmas"]
