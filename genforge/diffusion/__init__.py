"""Gaussian diffusion shared by the diffusion families (dit, later dalle2_decoder)."""

from genforge.diffusion.gaussian import (GaussianDiffusion, LossType, MeanType, VarType,
                                         discretized_gaussian_log_likelihood, mean_flat, normal_kl)
from genforge.diffusion.guidance import classifier_free_guidance
from genforge.diffusion.respace import SpacedDiffusion, create_diffusion, space_timesteps
from genforge.diffusion.schedules import beta_schedule

__all__ = ["GaussianDiffusion", "LossType", "MeanType", "VarType", "SpacedDiffusion", "beta_schedule",
           "classifier_free_guidance", "create_diffusion", "discretized_gaussian_log_likelihood", "mean_flat",
           "normal_kl", "space_timesteps"]
