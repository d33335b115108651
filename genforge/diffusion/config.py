"""Config section of a Gaussian-diffusion objective and its sampler (used by the diffusion and dalle2_decoder
families). It holds data; genforge.diffusion.build builds what it describes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from genforge.core.config import OnResume, StrictModel
from genforge.diffusion.samplers import SAMPLERS


class DiffusionConfig(StrictModel):
    """The objective (IDDPM's discrete chain by default, as DiT; rectified flow; EDM), its sampler and guidance."""

    objective: Literal["ddpm", "flow", "edm"] = Field(
        "ddpm", description="ddpm: IDDPM (Nichol & Dhariwal 2021); flow: rectified flow, velocity target (Liu et al. "
                            "2022, SiT); edm: EDM preconditioning and loss (Karras et al. 2022)")
    num_timesteps: int = Field(1000, ge=2, le=100_000)
    noise_schedule: Literal["linear", "cosine"] = "linear"
    prediction: Literal["eps", "x0", "v"] = "eps"
    learn_sigma: bool = Field(True, description="learned-range variance with the hybrid loss (IDDPM sec. 3.1)")
    fixed_variance: Literal["small", "large"] = Field(
        "small", description="without learn_sigma: small = the posterior variance beta-tilde_t, large = beta_t "
                             "(DDPM sec. 3.2; DiT's create_diffusion picks large, sigma_small=False)")
    loss: Literal["mse", "rescaled_mse", "kl", "rescaled_kl"] = Field(
        "mse", description="mse: DiT's hybrid weighting; rescaled_mse: the paper's lambda=0.001; kl: the VLB term "
                           "L_t alone; rescaled_kl: T*L_t, the full L_vlb estimate (DiT's use_kl)"
    )
    min_snr_gamma: float | None = Field(None, gt=0.0, description="Min-SNR-γ loss weighting (Hang et al. 2023); "
                                                                   "5 is the paper's choice; None: plain MSE")
    timestep_sampling: Literal["uniform", "logit_normal"] = Field(
        "uniform", description="training timesteps: uniform (DDPM Algorithm 1), or t/T ~ logit-normal (Esser et al. "
                               "2024, SD3 §3.1), which puts the training steps where timestep_mean says")
    timestep_mean: float = Field(0.0, ge=-5.0, le=5.0, description="logit_normal: mean of logit(t/T); > 0 draws "
                                                                    "more high-noise steps")
    timestep_std: float = Field(1.0, gt=0.0, le=5.0, description="logit_normal: std of logit(t/T)")
    flow_shift: Annotated[float, OnResume.CHANGE] = Field(
        1.0, gt=0.0, description="flow: sampling-time shift t' = s·t/(1 + (s − 1)·t) (SD3 §5.3.2; > 1 spends more "
                                 "steps at high noise)")
    sigma_data: float = Field(0.5, gt=0.0, description="edm: σ_data, the data's standard deviation")
    p_mean: float = Field(-1.2, ge=-10.0, le=10.0, description="edm: mean of ln σ in training")
    p_std: float = Field(1.2, gt=0.0, le=10.0, description="edm: std of ln σ in training")
    rho: Annotated[float, OnResume.CHANGE] = Field(
        7.0, gt=0.0, description="σ-samplers on ddpm and edm: EDM's time-step exponent ρ (eq. 5)")
    sampler: Annotated[str, OnResume.CHANGE] = Field(
        "ddpm", description="a registered sampler (genforge.diffusion.samplers): ddpm, ddim (the ddpm objective's "
                            "chain), euler, heun, euler_ancestral, dpmpp_2m")
    sample_steps: Annotated[int, OnResume.CHANGE] = Field(250, ge=1, description="respaced steps used for sampling")
    ddim_eta: Annotated[float, OnResume.CHANGE] = Field(0.0, ge=0.0, le=1.0)
    cfg_scale: Annotated[float, OnResume.CHANGE] = Field(
        4.0, ge=1.0, description="classifier-free guidance scale; 1 disables")
    guidance_channels: Annotated[int | None, OnResume.CHANGE] = Field(
        None, ge=1, description="guide only the first this many channels of the prediction, the others taken from the "
                                "conditional branch; None: every channel of the data. 3 on 4-channel latents is what "
                                "facebookresearch/DiT's sample.py does (its forward_with_cfg guides eps[:, :3]): "
                                "set it to compare FIDs with DiT's table (docs/diffusion.md)")
    guidance_interval: Annotated[tuple[float, float] | None, OnResume.CHANGE] = Field(
        None, description="guide only at noise levels σ in (lo, hi] (Kynkäänniemi et al. 2024); None: at every step")
    dynamic_threshold: Annotated[float | None, OnResume.CHANGE] = Field(
        None, gt=0.0, le=1.0, description="pixel data: at each sampling step, x̂₀ is divided by s = max(1, this "
                                          "quantile of |x̂₀| per sample) after clamping it to [−s, s] (Imagen's "
                                          "dynamic thresholding, Saharia et al. 2022 §2.3; 0.995 there, 0.95 in "
                                          "DALLE2-pytorch); None: the static clip to [−1, 1]. Latents are not "
                                          "clipped either way")

    @field_validator("sampler")
    @classmethod
    def _registered_sampler(cls, name: str) -> str:
        return SAMPLERS.get(name, "model.diffusion.sampler").name

    @model_validator(mode="after")
    def _fields_fit_the_objective(self) -> "DiffusionConfig":
        d = "model.diffusion"
        if self.objective != "ddpm":
            # (num_timesteps and noise_schedule, which presets set for ddpm, are simply not used)
            changed = [name for name in ("learn_sigma", "prediction", "loss", "min_snr_gamma")
                       if getattr(self, name) != DDPM_DEFAULTS[name]]
            if changed:
                hint = " (set it to false)" if "learn_sigma" in changed else ""
                raise ValueError(f"{d}.{changed[0]} applies to {d}.objective=ddpm, not {self.objective}{hint}")
            sampler = SAMPLERS.get(self.sampler, f"{d}.sampler")
            if sampler.discrete:
                raise ValueError(sampler_mismatch(self.sampler, self.objective))
        if self.guidance_interval is not None and not 0 <= self.guidance_interval[0] < self.guidance_interval[1]:
            raise ValueError(f"{d}.guidance_interval={list(self.guidance_interval)} must be [lo, hi] with 0 <= lo < hi")
        return self


DDPM_DEFAULTS = {name: field.default for name, field in DiffusionConfig.model_fields.items()}
DDPM_DEFAULTS["learn_sigma"] = False  # flow and edm predict one output per channel


def sampler_mismatch(sampler: str, objective: str) -> str:
    """The error for a sampler of the DDPM chain asked of another objective."""
    others = ", ".join(name for name, entry in SAMPLERS.items() if not entry.discrete)
    return (f"model.diffusion.sampler={sampler} steps the discrete DDPM chain and does not work with "
            f"model.diffusion.objective={objective}; use one of {others}")
