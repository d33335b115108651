"""Gaussian diffusion in the IDDPM formulation (Nichol & Dhariwal 2021) on tensors of any rank.

A model is any callable `model(x_t, t, **model_kwargs) -> Tensor`, t long [B] in the original schedule's
index space: it returns [B, C, ...] for a fixed variance, or [B, 2C, ...] with LEARNED_RANGE, the last C
channels being v of IDDPM eq. 15. x may be [B, C, H, W], [B, C, T, H, W] or any other [B, C, ...].
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
    """What the network's mean channels predict."""

    EPSILON = "eps"  # the noise ε (DDPM eq. 11)
    START_X = "x0"  # the clean sample x_0
    VELOCITY = "v"  # v = √ᾱ_t·ε − √(1−ᾱ_t)·x_0 (Salimans & Ho 2022, §4)


class VarType(enum.Enum):
    """How the reverse-process variance Σ_θ(x_t, t) is chosen."""

    FIXED_SMALL = "fixed_small"  # β̃_t, the posterior variance (DDPM §3.2)
    FIXED_LARGE = "fixed_large"  # β_t (DDPM §3.2)
    LEARNED_RANGE = "learned_range"  # exp(u·log β_t + (1−u)·log β̃_t), u = (v+1)/2 (IDDPM eq. 15)


class LossType(enum.Enum):
    """Training objective (IDDPM §3.1). With LEARNED_RANGE the MSE losses are the hybrid L_simple + w·L_t, L_t
    the VLB term in bits/dim with the mean detached so it trains only the variance.

    MSE: w = 1, what DiT's (and IDDPM's default) code trains. RESCALED_MSE: w = T/1000, the paper's
    λ = 0.001 on L_vlb ≈ T·L_t under uniform t. The two agree at T = 1000. KL trains on L_t alone and
    RESCALED_KL on T·L_t, the full-chain L_vlb estimate."""

    MSE = "mse"
    RESCALED_MSE = "rescaled_mse"
    KL = "kl"
    RESCALED_KL = "rescaled_kl"


def mean_flat(x: Tensor) -> Tensor:
    """Mean over every dimension but the batch: [B, ...] → [B]."""
    return x.mean(dim=tuple(range(1, x.ndim)))


def normal_kl(mean1: Tensor, logvar1: Tensor, mean2: Tensor, logvar2: Tensor) -> Tensor:
    """Elementwise KL(N(mean1, e^logvar1) ‖ N(mean2, e^logvar2)) in nats (the Gaussian KLs of DDPM eq. 5)."""
    return 0.5 * (logvar2 - logvar1 - 1.0 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def _normal_cdf(x: Tensor) -> Tensor:
    """Φ(x) by its tanh approximation (Page 1977), smooth and cheap."""
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def discretized_gaussian_log_likelihood(x: Tensor, means: Tensor, log_scales: Tensor) -> Tensor:
    """Elementwise log p(x) of 8-bit data scaled to [-1, 1] under N(means, e^{2·log_scales}) integrated over each
    bin of width 2/255, the outer bins extended to ±∞ (DDPM §3.3 decoder)."""
    inv_std = torch.exp(-log_scales)
    upper = _normal_cdf(inv_std * (x - means + 1.0 / 255))  # Φ at the bin's upper edge
    lower = _normal_cdf(inv_std * (x - means - 1.0 / 255))  # Φ at the bin's lower edge
    log = lambda p: torch.log(p.clamp(min=1e-12))  # noqa: E731
    return torch.where(x < -0.999, log(upper), torch.where(x > 0.999, log(1.0 - lower), log(upper - lower)))


def clip_x0(x0: Tensor, dynamic_threshold: float | None = None) -> Tensor:
    """x̂₀ of pixel data brought into [-1, 1]: the static clip, or with `dynamic_threshold` = p Imagen's dynamic
    thresholding (Saharia et al. 2022, §2.3): s = the p-quantile of |x̂₀| over each sample's elements (linear
    interpolation between order statistics, as torch.quantile), s = max(s, 1), x̂₀ = clamp(x̂₀, −s, s) / s. Where
    s = 1 it is the static clip; a saturated x̂₀ (large guidance) is shrunk instead of flattened at ±1."""
    if dynamic_threshold is None:
        return x0.clamp(-1, 1)
    flat = x0.detach().abs().flatten(1).float()  # [B, N]
    n = flat.shape[1]
    position = dynamic_threshold * (n - 1)  # of the p-quantile among the sorted |x̂₀| (0-based)
    low = min(int(math.floor(position)), n - 1)
    frac = position - low
    s = flat.kthvalue(low + 1, dim=1).values  # [B]
    if frac > 0:
        s = s + frac * (flat.kthvalue(low + 2, dim=1).values - s)
    s = s.clamp_min(1.0).view(-1, *([1] * (x0.ndim - 1))).to(x0.dtype)
    return x0.clamp(-s, s) / s


class GaussianDiffusion:
    """Forward process q, reverse process p_θ, training losses and the DDPM/DDIM samplers for T = len(betas) steps."""

    def __init__(self, betas: np.ndarray, mean_type: MeanType, var_type: VarType, loss_type: LossType) -> None:
        betas = np.asarray(betas, dtype=np.float64)
        if betas.ndim != 1 or len(betas) == 0 or not ((betas > 0) & (betas <= 1)).all():
            raise ValueError("betas must be a non-empty 1-D array with values in (0, 1]")
        self.mean_type, self.var_type, self.loss_type = mean_type, var_type, loss_type
        self.num_timesteps = len(betas)

        alphas = 1.0 - betas
        ac = np.cumprod(alphas)
        ac_prev = np.append(1.0, ac[:-1])
        posterior_variance = betas * (1.0 - ac_prev) / (1.0 - ac)  # β̃_t, DDPM eq. 7
        # β̃_0 = 0: its log is clipped to β̃_1 as IDDPM does (to β_0 when there is a single step)
        clipped = np.append(posterior_variance[1] if len(betas) > 1 else betas[0], posterior_variance[1:])
        coefs = {
            "betas": betas,
            "log_betas": np.log(betas),
            "alphas_cumprod": ac,
            "alphas_cumprod_prev": ac_prev,
            "snr": ac / (1.0 - ac),  # signal-to-noise ratio ᾱ_t / (1 − ᾱ_t)
            "sqrt_alphas_cumprod": np.sqrt(ac),
            "sqrt_one_minus_alphas_cumprod": np.sqrt(1.0 - ac),
            "sqrt_recip_alphas_cumprod": np.sqrt(1.0 / ac),
            "sqrt_recipm1_alphas_cumprod": np.sqrt(1.0 / ac - 1.0),
            "posterior_variance": posterior_variance,
            "posterior_log_variance_clipped": np.log(clipped),
            "posterior_mean_coef1": betas * np.sqrt(ac_prev) / (1.0 - ac),  # DDPM eq. 7
            "posterior_mean_coef2": (1.0 - ac_prev) * np.sqrt(alphas) / (1.0 - ac),
            # FIXED_LARGE uses β_t, with β̃_1 at t = 0 for a better decoder likelihood (IDDPM)
            "large_variance": np.append(clipped[0], betas[1:]),
            "large_log_variance": np.log(np.append(clipped[0], betas[1:])),
        }
        self.coefs: dict[str, Tensor] = {k: torch.from_numpy(v) for k, v in coefs.items()}  # float64, CPU
        self._tables: dict[torch.device, dict[str, Tensor]] = {}  # float32 copies, one per device

    # ------------------------------------------------------------------------------ coefficients
    def _coef(self, name: str, t: Tensor, like: Tensor) -> Tensor:
        """Coefficient `name` at timesteps t [B], shaped [B, 1, ...] to broadcast against `like`."""
        if t.device not in self._tables:
            self._tables[t.device] = {k: v.to(t.device, torch.float32) for k, v in self.coefs.items()}
        return self._tables[t.device][name][t].view(-1, *([1] * (like.ndim - 1)))

    def _run_model(self, model: Model, x: Tensor, t: Tensor, model_kwargs: dict[str, Any] | None) -> Tensor:
        """model(x_t, t, **model_kwargs); SpacedDiffusion overrides it to pass the original timestep indices."""
        return model(x, t, **(model_kwargs or {}))

    # ---------------------------------------------------------------------------- forward process
    def q_sample(self, x_start: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """x_t = √ᾱ_t·x_0 + √(1 − ᾱ_t)·ε, a draw from q(x_t | x_0) (DDPM eq. 4)."""
        return (self._coef("sqrt_alphas_cumprod", t, x_start) * x_start
                + self._coef("sqrt_one_minus_alphas_cumprod", t, x_start) * noise)

    def q_posterior_mean_variance(self, x_start: Tensor, x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q(x_{t−1} | x_t, x_0) = N(μ̃_t, β̃_t·I) (DDPM eq. 6–7): mean, variance, log-variance
        (clipped at t = 0)."""
        mean = (self._coef("posterior_mean_coef1", t, x_t) * x_start
                + self._coef("posterior_mean_coef2", t, x_t) * x_t)
        variance = self._coef("posterior_variance", t, x_t).expand_as(x_t)
        return mean, variance, self._coef("posterior_log_variance_clipped", t, x_t).expand_as(x_t)

    # ------------------------------------------------------------------------------- conversions
    def predict_xstart_from_eps(self, x_t: Tensor, t: Tensor, eps: Tensor) -> Tensor:
        """x_0 = (x_t − √(1−ᾱ_t)·ε)/√ᾱ_t (DDPM eq. 4 solved for x_0)."""
        return (self._coef("sqrt_recip_alphas_cumprod", t, x_t) * x_t
                - self._coef("sqrt_recipm1_alphas_cumprod", t, x_t) * eps)

    def predict_eps_from_xstart(self, x_t: Tensor, t: Tensor, x_start: Tensor) -> Tensor:
        """ε = (x_t − √ᾱ_t·x_0)/√(1−ᾱ_t) (DDPM eq. 4 solved for ε)."""
        return ((self._coef("sqrt_recip_alphas_cumprod", t, x_t) * x_t - x_start)
                / self._coef("sqrt_recipm1_alphas_cumprod", t, x_t))

    def predict_xstart_from_v(self, x_t: Tensor, t: Tensor, v: Tensor) -> Tensor:
        """x_0 = √ᾱ_t·x_t − √(1−ᾱ_t)·v (Salimans & Ho 2022, §4)."""
        return (self._coef("sqrt_alphas_cumprod", t, x_t) * x_t
                - self._coef("sqrt_one_minus_alphas_cumprod", t, x_t) * v)

    def velocity(self, x_start: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """The v-prediction target v = √ᾱ_t·ε − √(1−ᾱ_t)·x_0 (Salimans & Ho 2022, §4)."""
        return (self._coef("sqrt_alphas_cumprod", t, x_start) * noise
                - self._coef("sqrt_one_minus_alphas_cumprod", t, x_start) * x_start)

    # ---------------------------------------------------------------------------- reverse process
    def _split_output(self, out: Tensor, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Model output → (mean channels, variance channels or None), in float32: under bf16/fp16 autocast the
        learned-range log-variance, its exp and the discretised likelihood underflow (DALLE2-pytorch's NaN losses with
        learned variance in fp16, its issues #138, #311)."""
        out = out.float()
        c = x.shape[1]
        expected = 2 * c if self.var_type == VarType.LEARNED_RANGE else c
        if out.shape[1] != expected:
            raise ValueError(f"{self.var_type.name} needs a model output with {expected} channels, got {out.shape[1]}")
        return (out[:, :c], out[:, c:]) if self.var_type == VarType.LEARNED_RANGE else (out, None)

    def p_mean_variance(self, model: Model, x: Tensor, t: Tensor, model_kwargs: dict[str, Any] | None = None,
                        clip_denoised: bool = True, model_output: Tensor | None = None,
                        dynamic_threshold: float | None = None) -> dict[str, Tensor]:
        """p_θ(x_{t−1} | x_t) = N(μ̃_t(x̂_0, x_t), Σ_θ) (DDPM eq. 1, IDDPM eq. 15): dict of mean, variance,
        log_variance, pred_xstart (x̂_0, with clip_denoised brought into [-1, 1] by `clip_x0`: clipped, or
        dynamically thresholded at the `dynamic_threshold` quantile) and eps (ε implied by x̂_0).
        Pass `model_output` to reuse an output already computed for (x, t)."""
        out = self._run_model(model, x, t, model_kwargs) if model_output is None else model_output
        mean_out, var_out = self._split_output(out, x)
        if var_out is not None:
            frac = (var_out + 1) / 2  # v ∈ [-1, 1] → interpolation weight u ∈ [0, 1] (IDDPM eq. 15)
            log_variance = (frac * self._coef("log_betas", t, x)
                            + (1 - frac) * self._coef("posterior_log_variance_clipped", t, x))
            variance = torch.exp(log_variance)
        elif self.var_type == VarType.FIXED_SMALL:
            variance = self._coef("posterior_variance", t, x).expand_as(x)
            log_variance = self._coef("posterior_log_variance_clipped", t, x).expand_as(x)
        else:
            variance = self._coef("large_variance", t, x).expand_as(x)
            log_variance = self._coef("large_log_variance", t, x).expand_as(x)

        if self.mean_type == MeanType.EPSILON:
            pred_xstart = self.predict_xstart_from_eps(x, t, mean_out)
        elif self.mean_type == MeanType.START_X:
            pred_xstart = mean_out
        else:
            pred_xstart = self.predict_xstart_from_v(x, t, mean_out)
        if clip_denoised:
            pred_xstart = clip_x0(pred_xstart, dynamic_threshold)
        mean, _, _ = self.q_posterior_mean_variance(pred_xstart, x, t)
        return {"mean": mean, "variance": variance, "log_variance": log_variance, "pred_xstart": pred_xstart,
                "eps": self.predict_eps_from_xstart(x, t, pred_xstart)}

    # ------------------------------------------------------------------------------------ losses
    def vb_terms_bpd(self, model: Model, x_start: Tensor, x_t: Tensor, t: Tensor,
                     model_kwargs: dict[str, Any] | None = None, clip_denoised: bool = True,
                     model_output: Tensor | None = None) -> dict[str, Tensor]:
        """The VLB term L_t in bits/dim, [B] (DDPM eq. 5): KL(q(x_{t−1}|x_t,x_0) ‖ p_θ(x_{t−1}|x_t)) for t > 0
        and the discretised decoder NLL −log p_θ(x_0|x_1) at t = 0. Returns dict(output, pred_xstart)."""
        true_mean, _, true_log_variance = self.q_posterior_mean_variance(x_start, x_t, t)
        out = self.p_mean_variance(model, x_t, t, model_kwargs, clip_denoised, model_output=model_output)
        kl = mean_flat(normal_kl(true_mean, true_log_variance, out["mean"], out["log_variance"])) / math.log(2.0)
        decoder_nll = -mean_flat(discretized_gaussian_log_likelihood(
            x_start, means=out["mean"], log_scales=0.5 * out["log_variance"])) / math.log(2.0)
        return {"output": torch.where(t == 0, decoder_nll, kl), "pred_xstart": out["pred_xstart"]}

    def min_snr_weight(self, t: Tensor, gamma: float) -> Tensor:
        """Min-SNR-γ loss weight [B] (Hang et al. 2023, eq. 9) for the MSE on this process's target: the
        effective ε-space weight min(SNR_t, γ) / SNR_t, with SNR_t = ᾱ_t / (1 − ᾱ_t), expressed for x0 (×SNR)
        and v (×SNR / (SNR + 1)) targets."""
        snr = self._coef("snr", t, t)
        clipped = snr.clamp(max=gamma)
        if self.mean_type == MeanType.EPSILON:
            return clipped / snr
        if self.mean_type == MeanType.START_X:
            return clipped
        return clipped / (snr + 1.0)

    def training_losses(self, model: Model, x_start: Tensor, t: Tensor, model_kwargs: dict[str, Any] | None = None,
                        noise: Tensor | None = None, min_snr_gamma: float | None = None) -> dict[str, Tensor]:
        """Per-example losses [B] at timesteps t: "loss", plus "mse" (L_simple, DDPM eq. 14, on the target of
        mean_type) and "vb" (IDDPM §3.1) where they apply. With `min_snr_gamma` the MSE enters "loss" with
        the Min-SNR-γ weight ("mse" stays the plain one, for logging)."""
        noise = torch.randn_like(x_start) if noise is None else noise
        x_t = self.q_sample(x_start, t, noise)
        if self.loss_type in (LossType.KL, LossType.RESCALED_KL):
            vb = self.vb_terms_bpd(model, x_start, x_t, t, model_kwargs, clip_denoised=False)["output"]
            return {"loss": vb * self.num_timesteps if self.loss_type == LossType.RESCALED_KL else vb}

        out = self._run_model(model, x_t, t, model_kwargs)
        mean_out, var_out = self._split_output(out, x_start)
        terms: dict[str, Tensor] = {}
        if var_out is not None:  # L_t trains only the variance: the mean channels are detached (IDDPM §3.1)
            frozen = torch.cat([mean_out.detach(), var_out], dim=1)
            vb = self.vb_terms_bpd(model, x_start, x_t, t, clip_denoised=False, model_output=frozen)["output"]
            terms["vb"] = vb * (self.num_timesteps / 1000.0) if self.loss_type == LossType.RESCALED_MSE else vb
        if self.mean_type == MeanType.EPSILON:
            target = noise
        elif self.mean_type == MeanType.START_X:
            target = x_start
        else:
            target = self.velocity(x_start, t, noise)
        terms["mse"] = mean_flat((target - mean_out) ** 2)
        weighted = terms["mse"] if min_snr_gamma is None else self.min_snr_weight(t, min_snr_gamma) * terms["mse"]
        terms["loss"] = weighted + terms["vb"] if "vb" in terms else weighted
        return terms

    # ---------------------------------------------------------------------------------- samplers
    @staticmethod
    def _randn(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
        """N(0, I) drawn on the generator's device (reproducible per generator), then moved to `device`."""
        draw_on = generator.device if generator is not None else device
        return torch.randn(shape, generator=generator, device=draw_on).to(device)

    def _loop(self, step: Callable[[Tensor, Tensor, int], Tensor], shape: tuple[int, ...], noise: Tensor | None,
              generator: torch.Generator | None, device: torch.device | str | None, progress: bool,
              desc: str) -> Tensor:
        """x ← step(x, t, i) for i = T−1, …, 0 from x_T = `noise` or a draw from `generator`."""
        if device is None:
            device = noise.device if noise is not None else generator.device if generator is not None else "cpu"
        device = torch.device(device)
        x = noise.to(device) if noise is not None else self._randn(tuple(shape), generator, device)
        for i in tqdm(range(self.num_timesteps - 1, -1, -1), desc=desc, disable=not progress, leave=False):
            x = step(x, torch.full((x.shape[0],), i, device=device, dtype=torch.long), i)
        return x

    @torch.no_grad()
    def p_sample_loop(self, model: Model, shape: tuple[int, ...], noise: Tensor | None = None,
                      model_kwargs: dict[str, Any] | None = None, clip_denoised: bool = True,
                      generator: torch.Generator | None = None, progress: bool = False,
                      device: torch.device | str | None = None, dynamic_threshold: float | None = None) -> Tensor:
        """Ancestral sampling x_T → x_0 (DDPM Algorithm 2), no noise added at the last step. Runs on `device`,
        else noise's, else the generator's, else the CPU. With clip_denoised, x̂_0 is clipped or dynamically
        thresholded (`clip_x0`)."""

        def step(x: Tensor, t: Tensor, i: int) -> Tensor:
            out = self.p_mean_variance(model, x, t, model_kwargs, clip_denoised, dynamic_threshold=dynamic_threshold)
            if i == 0:
                return out["mean"]
            return out["mean"] + torch.exp(0.5 * out["log_variance"]) * self._randn(tuple(x.shape), generator, x.device)

        return self._loop(step, shape, noise, generator, device, progress, "ddpm")

    @torch.no_grad()
    def ddim_sample_loop(self, model: Model, shape: tuple[int, ...], noise: Tensor | None = None,
                         model_kwargs: dict[str, Any] | None = None, clip_denoised: bool = True,
                         generator: torch.Generator | None = None, progress: bool = False,
                         device: torch.device | str | None = None, eta: float = 0.0,
                         dynamic_threshold: float | None = None) -> Tensor:
        """DDIM (Song et al. 2021, eq. 12 with σ_t(η) of eq. 16): η = 0 is deterministic, η = 1 is DDPM-like.
        Same arguments as p_sample_loop; the model's variance output, if any, is unused."""

        def step(x: Tensor, t: Tensor, i: int) -> Tensor:
            out = self.p_mean_variance(model, x, t, model_kwargs, clip_denoised, dynamic_threshold=dynamic_threshold)
            ac, ac_prev = self._coef("alphas_cumprod", t, x), self._coef("alphas_cumprod_prev", t, x)
            sigma = eta * torch.sqrt((1 - ac_prev) / (1 - ac) * (1 - ac / ac_prev))
            direction = torch.sqrt((1 - ac_prev - sigma**2).clamp(min=0)) * out["eps"]  # points to x_t
            x = torch.sqrt(ac_prev) * out["pred_xstart"] + direction
            if eta > 0 and i > 0:  # σ_0 = 0: no noise at the last step
                x = x + sigma * self._randn(tuple(x.shape), generator, x.device)
            return x

        return self._loop(step, shape, noise, generator, device, progress, "ddim")
