"""Gaussian diffusion (IDDPM formulation) shared by the diffusion families: dit, later dalle2_decoder."""

from genforge.diffusion.gaussian import (GaussianDiffusion, LossType, MeanType, Model, VarType, clip_x0,
                                         discretized_gaussian_log_likelihood, mean_flat, normal_kl)
from genforge.diffusion.guidance import classifier_free_guidance
from genforge.diffusion.respace import SpacedDiffusion, create_diffusion, space_timesteps
from genforge.diffusion.objectives import (DDPMObjective, Denoiser, EDMObjective, FlowObjective, Objective,
                                           karras_sigmas)
from genforge.diffusion.samplers import (SAMPLERS, Sampler, SamplerFn, SamplingProcess, sample_ddim, sample_ddpm,
                                         sample_dpmpp_2m, sample_euler, sample_euler_ancestral, sample_heun)
from genforge.diffusion.schedules import SCHEDULES, beta_schedule

__all__ = ["SAMPLERS", "SCHEDULES", "DDPMObjective", "Denoiser", "EDMObjective", "FlowObjective", "GaussianDiffusion",
           "LossType", "MeanType", "Model", "Objective", "Sampler", "SamplerFn", "SamplingProcess", "SpacedDiffusion",
           "VarType", "beta_schedule", "classifier_free_guidance", "clip_x0", "create_diffusion",
           "discretized_gaussian_log_likelihood", "karras_sigmas", "mean_flat", "normal_kl", "sample_ddim",
           "sample_ddpm", "sample_dpmpp_2m", "sample_euler", "sample_euler_ancestral", "sample_heun",
           "space_timesteps"]
