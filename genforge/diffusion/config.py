"""Config section of a Gaussian-diffusion objective and its sampler (used by dit, later dalle2_decoder)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor

from genforge.core.config import StrictModel
from genforge.core.random import BatchRandom
from genforge.diffusion.gaussian import LossType, MeanType
from genforge.diffusion.respace import SpacedDiffusion, create_diffusion
from genforge.diffusion.samplers import SAMPLERS


class DiffusionConfig(StrictModel):
    """IDDPM formulation (Nichol & Dhariwal 2021); defaults are DiT's."""

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
    sampler: str = Field("ddpm", description="a registered sampler (genforge.diffusion.samplers): ddpm, ddim")
    sample_steps: int = Field(250, ge=1, description="respaced steps used for sampling")
    ddim_eta: float = Field(0.0, ge=0.0, le=1.0)
    cfg_scale: float = Field(4.0, ge=1.0, description="classifier-free guidance scale; 1 disables")

    @field_validator("sampler")
    @classmethod
    def _registered_sampler(cls, name: str) -> str:
        return SAMPLERS.get(name, "model.diffusion.sampler").name

    def draw_timesteps(self, rng: BatchRandom) -> Tensor:
        """Training timesteps long [B] in {0, …, T−1} from the batch's random stream."""
        if self.timestep_sampling == "uniform":
            return rng.randint(self.num_timesteps)
        u = torch.sigmoid(self.timestep_mean + self.timestep_std * rng.randn())  # (0, 1), logit-normal
        return (u * self.num_timesteps).long().clamp_(max=self.num_timesteps - 1)

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
