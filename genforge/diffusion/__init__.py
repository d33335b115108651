"""Gaussian diffusion (IDDPM formulation) shared by the diffusion families: dit, later dalle2_decoder."""

from genforge.diffusion.gaussian import (GaussianDiffusion, LossType, MeanType, Model, VarType,
                                         discretized_gaussian_log_likelihood, mean_flat, normal_kl)
from genforge.diffusion.guidance import classifier_free_guidance
from genforge.diffusion.respace import SpacedDiffusion, create_diffusion, space_timesteps
from genforge.diffusion.samplers import SAMPLERS, Sampler, SamplerFn, sample_ddim, sample_ddpm
from genforge.diffusion.schedules import SCHEDULES, beta_schedule

__all__ = ["SAMPLERS", "SCHEDULES", "GaussianDiffusion", "LossType", "MeanType", "Model", "Sampler", "SamplerFn",
           "SpacedDiffusion", "VarType", "beta_schedule", "classifier_free_guidance", "create_diffusion",
           "discretized_gaussian_log_likelihood", "mean_flat", "normal_kl", "sample_ddim", "sample_ddpm",
           "space_timesteps"]
