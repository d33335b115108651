"""Gaussian diffusion in the IDDPM formulation (Nichol & Dhariwal 2021), on tensors of any rank.

A model is any callable `model(x_t, t, **model_kwargs) -> Tensor`: [B, C, ...] for fixed variances, or
[B, 2C, ...] with learned-range variance (the extra channels are v of IDDPM eq. 15).
"""

from __future__ import annotations

import enum
import math
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

Model = Callable[..., Tensor]


class MeanType(enum.Enum):
    """What the network predicts for the mean."""

    EPSILON = "eps"  # the noise ε (DDPM)
    START_X = "x0"  # the clean sample x_0
    VELOCITY = "v"  # v = √ᾱ·ε − √(1−ᾱ)·x_0 (Salimans & Ho 2022)


class VarType(enum.Enum):
    """How the reverse-process variance Σ_θ(x_t, t) is chosen."""

    FIXED_SMALL = "fixed_small"  # β̃_t, the posterior variance
    FIXED_LARGE = "fixed_large"  # β_t
    LEARNED_RANGE = "learned_range"  # exp(v·log β_t + (1−v)·log β̃_t), IDDPM eq. 15


class LossType(enum.Enum):
    """Training objective. With LEARNED_RANGE, MSE is the hybrid loss L_simple + L_vb (stop-grad on the
    mean for L_vb) with L_vb per timestep, as DiT's code weights it; RESCALED_MSE multiplies L_vb by
    T/1000, the paper's λ = 0.001 on the full-chain L_vlb (IDDPM §3.1). KL trains on L_vlb alone."""

    MSE = "mse"
    RESCALED_MSE = "rescaled_mse"
    KL = "kl"
    RESCALED_KL = "rescaled_kl"


def mean_flat(x: Tensor) -> Tensor:
    """Mean over every dimension but the batch."""
    return x.mean(dim=tuple(range(1, x.ndim)))


def normal_kl(mean1: Tensor, logvar1: Tensor, mean2: Tensor, logvar2: Tensor) -> Tensor:
    """KL(N(mean1, e^logvar1) || N(mean2, e^logvar2)), elementwise, in nats."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def _standard_normal_cdf(x: Tensor) -> Tensor:
    """Fast tanh approximation of Φ(x)."""
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def discretized_gaussian_log_likelihood(x: Tensor, means: Tensor, log_scales: Tensor) -> Tensor:
    """log p(x) of data in [-1, 1] quantised to 256 bins under N(means, e^{2·log_scales}) (DDPM §3.3)."""
    centered = x - means
    inv_std = torch.exp(-log_scales)
    cdf_plus = _standard_normal_cdf(inv_std * (centered + 1.0 / 255))
    cdf_min = _standard_normal_cdf(inv_std * (centered - 1.0 / 255))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_delta))


class GaussianDiffusion:
    """Forward process q, reverse process p_θ, the training losses and the DDPM/DDIM samplers."""

    def __init__(self, betas: np.ndarray, mean_type: MeanType, var_type: VarType, loss_type: LossType) -> None:
        betas = np.asarray(betas, dtype=np.float64)
        if betas.ndim != 1 or not ((betas > 0) & (betas <= 1)).all():
            raise ValueError("betas must be a 1-D array in (0, 1]")
        self.mean_type, self.var_type, self.loss_type = mean_type, var_type, loss_type
        self.num_timesteps = len(betas)
        self.timestep_map: Tensor | None = None  # respacing: model sees original timestep indices

        alphas = 1.0 - betas
        ac = np.cumprod(alphas)
        ac_prev = np.append(1.0, ac[:-1])
        posterior_variance = betas * (1.0 - ac_prev) / (1.0 - ac)  # β̃_t, DDPM eq. 7
        self.np = {
            "betas": betas,
            "alphas_cumprod": ac,
            "alphas_cumprod_prev": ac_prev,
            "sqrt_alphas_cumprod": np.sqrt(ac),
            "sqrt_one_minus_alphas_cumprod": np.sqrt(1.0 - ac),
            "sqrt_recip_alphas_cumprod": np.sqrt(1.0 / ac),
            "sqrt_recipm1_alphas_cumprod": np.sqrt(1.0 / ac - 1.0),
            "posterior_variance": posterior_variance,
            # β̃_0 = 0: clip the log at t = 0 to β̃_1, as IDDPM does
            "posterior_log_variance_clipped": np.log(np.append(posterior_variance[1], posterior_variance[1:])),
            "posterior_mean_coef1": betas * np.sqrt(ac_prev) / (1.0 - ac),  # DDPM eq. 7
            "posterior_mean_coef2": (1.0 - ac_prev) * np.sqrt(alphas) / (1.0 - ac),
            "log_betas": np.log(betas),
            "fixed_large_variance": np.append(posterior_variance[1], betas[1:]),
        }
        self._tables: dict[torch.device, dict[str, Tensor]] = {}

    # ------------------------------------------------------------------------------ coefficients
    def _coef(self, name: str, t: Tensor, ndim: int) -> Tensor:
        """Coefficient `name` at timesteps t [B], shaped [B, 1, ...] to broadcast against an ndim tensor."""
        if t.device not in self._tables:
            self._tables[t.device] = {k: torch.from_numpy(v).float().to(t.device) for k, v in self.np.items()}
        return self._tables[t.device][name][t].view(-1, *([1] * (ndim - 1)))

    def _call(self, model: Model, x: Tensor, t: Tensor, model_kwargs: dict[str, Any] | None) -> Tensor:
        if self.timestep_map is not None:
            t = self.timestep_map.to(t.device)[t]
        return model(x, t, **(model_kwargs or {}))

    # ---------------------------------------------------------------------------- forward process
    def q_mean_variance(self, x_start: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q(x_t | x_0) = N(√ᾱ_t·x_0, (1 − ᾱ_t)·I) (DDPM eq. 4): mean, variance, log-variance."""
        mean = self._coef("sqrt_alphas_cumprod", t, x_start.ndim) * x_start
        variance = 1.0 - self._coef("alphas_cumprod", t, x_start.ndim)
        return mean, variance.expand_as(x_start), torch.log(variance).expand_as(x_start)

    def q_sample(self, x_start: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """x_t = √ᾱ_t·x_0 + √(1 − ᾱ_t)·ε."""
        n = x_start.ndim
        return self._coef("sqrt_alphas_cumprod", t, n) * x_start + self._coef("sqrt_one_minus_alphas_cumprod", t, n) * noise

    def q_posterior_mean_variance(self, x_start: Tensor, x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q(x_{t−1} | x_t, x_0) = N(μ̃_t, β̃_t·I) (DDPM eq. 6–7): mean, variance, clipped log-variance."""
        n = x_t.ndim
        mean = self._coef("posterior_mean_coef1", t, n) * x_start + self._coef("posterior_mean_coef2", t, n) * x_t
        return (mean, self._coef("posterior_variance", t, n).expand_as(x_t),
                self._coef("posterior_log_variance_clipped", t, n).expand_as(x_t))

    # ------------------------------------------------------------------------------- conversions
    def predict_xstart_from_eps(self, x_t: Tensor, t: Tensor, eps: Tensor) -> Tensor:
        n = x_t.ndim
        return self._coef("sqrt_recip_alphas_cumprod", t, n) * x_t - self._coef("sqrt_recipm1_alphas_cumprod", t, n) * eps

    def predict_eps_from_xstart(self, x_t: Tensor, t: Tensor, x_start: Tensor) -> Tensor:
        n = x_t.ndim
        return (self._coef("sqrt_recip_alphas_cumprod", t, n) * x_t - x_start) / self._coef(
            "sqrt_recipm1_alphas_cumprod", t, n)

    def predict_xstart_from_v(self, x_t: Tensor, t: Tensor, v: Tensor) -> Tensor:
        """x_0 = √ᾱ·x_t − √(1−ᾱ)·v."""
        n = x_t.ndim
        return self._coef("sqrt_alphas_cumprod", t, n) * x_t - self._coef("sqrt_one_minus_alphas_cumprod", t, n) * v

    def velocity(self, x_start: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """v = √ᾱ·ε − √(1−ᾱ)·x_0."""
        n = x_start.ndim
        return self._coef("sqrt_alphas_cumprod", t, n) * noise - self._coef("sqrt_one_minus_alphas_cumprod", t, n) * x_start

    # ---------------------------------------------------------------------------- reverse process
    def p_mean_variance(self, model: Model, x: Tensor, t: Tensor, model_kwargs: dict[str, Any] | None = None,
                        clip_denoised: bool = True, denoised_fn: Callable[[Tensor], Tensor] | None = None,
                        model_output: Tensor | None = None) -> dict[str, Tensor]:
        """p_θ(x_{t−1} | x_t): mean, variance, log_variance, and the predicted x_0 and ε."""
        out = self._call(model, x, t, model_kwargs) if model_output is None else model_output
        c, n = x.shape[1], x.ndim
        if self.var_type == VarType.LEARNED_RANGE:
            out, v = out[:, :c], out[:, c:]
            frac = (v + 1) / 2  # v in [-1, 1] interpolates between log β̃_t and log β_t (IDDPM eq. 15)
            log_variance = (frac * self._coef("log_betas", t, n)
                            + (1 - frac) * self._coef("posterior_log_variance_clipped", t, n))
            variance = torch.exp(log_variance)
        else:
            name = "posterior_variance" if self.var_type == VarType.FIXED_SMALL else "fixed_large_variance"
            variance = self._coef(name, t, n).expand_as(x)
            log_variance = torch.log(variance.clamp(min=1e-20)) if self.var_type == VarType.FIXED_LARGE \
                else self._coef("posterior_log_variance_clipped", t, n).expand_as(x)

        if self.mean_type == MeanType.EPSILON:
            pred_xstart = self.predict_xstart_from_eps(x, t, out)
        elif self.mean_type == MeanType.START_X:
            pred_xstart = out
        else:
            pred_xstart = self.predict_xstart_from_v(x, t, out)
        if denoised_fn is not None:
            pred_xstart = denoised_fn(pred_xstart)
        if clip_denoised:
            pred_xstart = pred_xstart.clamp(-1, 1)
        mean, _, _ = self.q_posterior_mean_variance(pred_xstart, x, t)
        return {"mean": mean, "variance": variance, "log_variance": log_variance, "pred_xstart": pred_xstart,
                "eps": self.predict_eps_from_xstart(x, t, pred_xstart)}

    # ------------------------------------------------------------------------------------ losses
    def vb_terms_bpd(self, model: Model, x_start: Tensor, x_t: Tensor, t: Tensor,
                     model_kwargs: dict[str, Any] | None = None, clip_denoised: bool = True,
                     model_output: Tensor | None = None) -> dict[str, Tensor]:
        """The VLB term L_t in bits/dim: KL(q(x_{t−1}|x_t,x_0) || p_θ(x_{t−1}|x_t)) for t > 0, and the
        discretised decoder NLL −log p_θ(x_0|x_1) at t = 0 (DDPM eq. 5)."""
        true_mean, _, true_log_variance = self.q_posterior_mean_variance(x_start, x_t, t)
        out = self.p_mean_variance(model, x_t, t, model_kwargs, clip_denoised, model_output=model_output)
        kl = mean_flat(normal_kl(true_mean, true_log_variance, out["mean"], out["log_variance"])) / math.log(2.0)
        nll = -mean_flat(discretized_gaussian_log_likelihood(
            x_start, means=out["mean"], log_scales=0.5 * out["log_variance"])) / math.log(2.0)
        return {"output": torch.where(t == 0, nll, kl), "pred_xstart": out["pred_xstart"]}

    def training_losses(self, model: Model, x_start: Tensor, t: Tensor, model_kwargs: dict[str, Any] | None = None,
                        noise: Tensor | None = None) -> dict[str, Tensor]:
        """Per-example losses [B] at timesteps t: "loss", plus "mse" and "vb" where they apply."""
        noise = torch.randn_like(x_start) if noise is None else noise
        x_t = self.q_sample(x_start, t, noise)
        terms: dict[str, Tensor] = {}
        if self.loss_type in (LossType.KL, LossType.RESCALED_KL):
            terms["loss"] = self.vb_terms_bpd(model, x_start, x_t, t, model_kwargs, clip_denoised=False)["output"]
            if self.loss_type == LossType.RESCALED_KL:
                terms["loss"] = terms["loss"] * self.num_timesteps
            return terms

        out = self._call(model, x_t, t, model_kwargs)
        c = x_start.shape[1]
        if self.var_type == VarType.LEARNED_RANGE:
            # L_vb trains only the variance: the mean output is detached (IDDPM §3.1)
            frozen = torch.cat([out[:, :c].detach(), out[:, c:]], dim=1)
            terms["vb"] = self.vb_terms_bpd(model, x_start, x_t, t, clip_denoised=False, model_output=frozen)["output"]
            if self.loss_type == LossType.RESCALED_MSE:
                terms["vb"] = terms["vb"] * (self.num_timesteps / 1000.0)
        target = {MeanType.EPSILON: noise, MeanType.START_X: x_start,
                  MeanType.VELOCITY: self.velocity(x_start, t, noise)}[self.mean_type]
        terms["mse"] = mean_flat((target - out[:, :c]) ** 2)
        terms["loss"] = terms["mse"] + terms["vb"] if "vb" in terms else terms["mse"]
        return terms

    def sample_timesteps(self, batch_size: int, device: torch.device | str,
                         generator: torch.Generator | None = None) -> Tensor:
        """t ~ U{0, …, T−1}."""
        return torch.randint(0, self.num_timesteps, (batch_size,), device=device, generator=generator)

    # ---------------------------------------------------------------------------------- samplers
    @staticmethod
    def _randn(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
        gen_device = generator.device if generator is not None else device
        return torch.randn(shape, generator=generator, device=gen_device).to(device)

    def _start(self, shape, noise, generator) -> Tensor:
        if noise is not None:
            return noise
        return self._randn(tuple(shape), generator, generator.device if generator is not None else torch.device("cpu"))

    @torch.no_grad()
    def p_sample_loop(self, model: Model, shape: tuple[int, ...], noise: Tensor | None = None,
                      model_kwargs: dict[str, Any] | None = None, clip_denoised: bool = True,
                      generator: torch.Generator | None = None, progress: bool = False) -> Tensor:
        """Ancestral sampling x_T → x_0 (DDPM Algorithm 2); no noise is added at the last step."""
        x = self._start(shape, noise, generator)
        for i in tqdm(range(self.num_timesteps - 1, -1, -1), disable=not progress, desc="ddpm", leave=False):
            t = torch.full((x.shape[0],), i, device=x.device, dtype=torch.long)
            out = self.p_mean_variance(model, x, t, model_kwargs, clip_denoised)
            z = self._randn(tuple(x.shape), generator, x.device)
            x = out["mean"] + (i > 0) * torch.exp(0.5 * out["log_variance"]) * z
        return x

    @torch.no_grad()
    def ddim_sample_loop(self, model: Model, shape: tuple[int, ...], noise: Tensor | None = None,
                         model_kwargs: dict[str, Any] | None = None, clip_denoised: bool = True,
                         generator: torch.Generator | None = None, progress: bool = False,
                         eta: float = 0.0) -> Tensor:
        """DDIM (Song et al. 2021, eq. 12); eta = 0 is deterministic, eta = 1 matches DDPM's variance."""
        x = self._start(shape, noise, generator)
        for i in tqdm(range(self.num_timesteps - 1, -1, -1), disable=not progress, desc="ddim", leave=False):
            t = torch.full((x.shape[0],), i, device=x.device, dtype=torch.long)
            out = self.p_mean_variance(model, x, t, model_kwargs, clip_denoised)
            ab = self._coef("alphas_cumprod", t, x.ndim)
            ab_prev = self._coef("alphas_cumprod_prev", t, x.ndim)
            sigma = eta * torch.sqrt((1 - ab_prev) / (1 - ab)) * torch.sqrt(1 - ab / ab_prev)
            x = (out["pred_xstart"] * torch.sqrt(ab_prev)
                 + torch.sqrt((1 - ab_prev - sigma**2).clamp(min=0)) * out["eps"])
            if eta > 0 and i > 0:
                x = x + sigma * self._randn(tuple(x.shape), generator, x.device)
        return x
