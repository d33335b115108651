"""Config section of a Gaussian-diffusion objective and its sampler (used by dit, later dalle2_decoder)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator
from torch import Tensor

from genforge.core.config import StrictModel
from genforge.core.random import BatchRandom
from genforge.diffusion.gaussian import LossType, MeanType, Model
from genforge.diffusion.respace import SpacedDiffusion, create_diffusion
from genforge.diffusion.guidance import classifier_free_guidance
from genforge.diffusion.objectives import DDPMObjective, EDMObjective, FlowObjective, Objective
from genforge.diffusion.samplers import SAMPLERS, SamplingProcess


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
    flow_shift: float = Field(1.0, gt=0.0, description="flow: sampling-time shift t' = s·t/(1 + (s − 1)·t) "
                                                       "(SD3 §5.3.2; > 1 spends more steps at high noise)")
    sigma_data: float = Field(0.5, gt=0.0, description="edm: σ_data, the data's standard deviation")
    p_mean: float = Field(-1.2, ge=-10.0, le=10.0, description="edm: mean of ln σ in training")
    p_std: float = Field(1.2, gt=0.0, le=10.0, description="edm: std of ln σ in training")
    rho: float = Field(7.0, gt=0.0, description="σ-samplers on ddpm and edm: EDM's time-step exponent ρ (eq. 5)")
    sampler: str = Field("ddpm", description="a registered sampler (genforge.diffusion.samplers): ddpm, ddim (the "
                                             "ddpm objective's chain), euler, heun, euler_ancestral, dpmpp_2m")
    sample_steps: int = Field(250, ge=1, description="respaced steps used for sampling")
    ddim_eta: float = Field(0.0, ge=0.0, le=1.0)
    cfg_scale: float = Field(4.0, ge=1.0, description="classifier-free guidance scale; 1 disables")
    guidance_interval: tuple[float, float] | None = Field(
        None, description="guide only at noise levels σ in (lo, hi] (Kynkäänniemi et al. 2024); None: at every step")

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

    def draw_timesteps(self, rng: BatchRandom) -> Tensor:
        """Training timesteps long [B] in {0, …, T−1} from the batch's random stream."""
        if self.timestep_sampling == "uniform":
            return rng.randint(self.num_timesteps)
        u = torch.sigmoid(self.timestep_mean + self.timestep_std * rng.randn())  # (0, 1), logit-normal
        return (u * self.num_timesteps).long().clamp_(max=self.num_timesteps - 1)

    def objective_for_training(self) -> Objective:
        """The objective whose `training_losses` a family calls."""
        if self.objective == "flow":
            return FlowObjective(self.timestep_sampling, self.timestep_mean, self.timestep_std, self.flow_shift)
        if self.objective == "edm":
            return EDMObjective(self.sigma_data, self.p_mean, self.p_std)
        return DDPMObjective(self.build(), self.draw_timesteps, self.min_snr_gamma)

    def sampling_process(self, model: Model, model_kwargs: dict[str, Any], channels: int, clip: bool, sampler: str,
                         steps: int, cfg_scale: float, null_kwargs: dict[str, Tensor] | None) -> SamplingProcess:
        """What `SAMPLERS[sampler]` runs on for `steps` steps: the model, guided by `cfg_scale` against `null_kwargs`
        (within `guidance_interval`), on the respaced chain (ddpm, ddim) or as the objective's denoiser with its σ
        steps (σ-samplers). ValueError for a sampler the objective cannot run."""
        entry = SAMPLERS.get(sampler, "--sampler")
        if entry.discrete and self.objective != "ddpm":
            raise ValueError(sampler_mismatch(sampler, self.objective))
        objective = self.objective_for_training()
        if cfg_scale > 1.0 and null_kwargs is not None:
            active = None
            if self.guidance_interval is not None:  # σ of the model's time input (the chain's: the timestep index)
                lo, hi = self.guidance_interval

                def active(t: Tensor) -> bool:
                    return lo < objective.sigma_of_time(t[:1].float()).item() <= hi

            model = classifier_free_guidance(model, cfg_scale, null_kwargs, out_channels=channels, active=active)
        if entry.discrete:
            return SamplingProcess(model, model_kwargs, clip, diffusion=self.model_copy(
                update={"sampler": sampler}).build(steps))
        denoise = objective.denoiser(model, model_kwargs, channels, clip)
        return SamplingProcess(model, model_kwargs, clip, denoise=denoise, sigmas=objective.sigmas(steps, self.rho))

    def build(self, sample_steps: int | None = None) -> SpacedDiffusion:
        """The diffusion process; for sampling pass `sample_steps` (respaced), for training leave None."""
        mean_type = {"eps": MeanType.EPSILON, "x0": MeanType.START_X, "v": MeanType.VELOCITY}[self.prediction]
        loss_type = {"mse": LossType.MSE, "rescaled_mse": LossType.RESCALED_MSE, "kl": LossType.KL,
                     "rescaled_kl": LossType.RESCALED_KL}[self.loss]
        respacing = "" if sample_steps is None else SAMPLERS.get(self.sampler, "sampler").respacing(sample_steps)
        return create_diffusion(
            timestep_respacing=respacing,
            noise_schedule=self.noise_schedule,
            num_timesteps=self.num_timesteps,
            mean_type=mean_type,
            learn_sigma=self.learn_sigma,
            loss_type=loss_type,
            fixed_variance=self.fixed_variance,
        )


DDPM_DEFAULTS = {name: field.default for name, field in DiffusionConfig.model_fields.items()}
DDPM_DEFAULTS["learn_sigma"] = False  # flow and edm predict one output per channel


def sampler_mismatch(sampler: str, objective: str) -> str:
    """The error for a sampler of the DDPM chain asked of another objective."""
    others = ", ".join(name for name, entry in SAMPLERS.items() if not entry.discrete)
    return (f"model.diffusion.sampler={sampler} steps the discrete DDPM chain and does not work with "
            f"model.diffusion.objective={objective}; use one of {others}")
