"""Builders of what a `DiffusionConfig` describes (the config holds data; these build): the training timesteps, the
diffusion chain, the training objective, the sampling process, and `sample_diffusion`, the one sampling call the
diffusion families make (the diffusion family; each stage of dalle2_decoder)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from genforge.core.config import SampleOptions
from genforge.core.random import BatchRandom
from genforge.diffusion.config import DiffusionConfig, sampler_mismatch
from genforge.diffusion.gaussian import LossType, MeanType, Model
from genforge.diffusion.guidance import classifier_free_guidance
from genforge.diffusion.objectives import DDPMObjective, EDMObjective, FlowObjective, Objective
from genforge.diffusion.respace import SpacedDiffusion, create_diffusion
from genforge.diffusion.samplers import SAMPLERS, SamplingProcess


def draw_timesteps(cfg: DiffusionConfig, rng: BatchRandom) -> Tensor:
    """Training timesteps long [B] in {0, …, T−1} from the batch's random stream: uniform (DDPM Algorithm 1) or
    t/T ~ logit-normal (SD3 §3.1)."""
    if cfg.timestep_sampling == "uniform":
        return rng.randint(cfg.num_timesteps)
    u = torch.sigmoid(cfg.timestep_mean + cfg.timestep_std * rng.randn())  # (0, 1), logit-normal
    return (u * cfg.num_timesteps).long().clamp_(max=cfg.num_timesteps - 1)


def build_diffusion(cfg: DiffusionConfig, *, sample_steps: int | None = None) -> SpacedDiffusion:
    """The IDDPM chain; for sampling pass `sample_steps` (respaced for cfg.sampler), for training leave None."""
    mean_type = {"eps": MeanType.EPSILON, "x0": MeanType.START_X, "v": MeanType.VELOCITY}[cfg.prediction]
    loss_type = {"mse": LossType.MSE, "rescaled_mse": LossType.RESCALED_MSE, "kl": LossType.KL,
                 "rescaled_kl": LossType.RESCALED_KL}[cfg.loss]
    respacing = "" if sample_steps is None else SAMPLERS.get(cfg.sampler, "sampler").respacing(sample_steps)
    return create_diffusion(timestep_respacing=respacing, noise_schedule=cfg.noise_schedule,
                            num_timesteps=cfg.num_timesteps, mean_type=mean_type, learn_sigma=cfg.learn_sigma,
                            loss_type=loss_type, fixed_variance=cfg.fixed_variance)


def build_objective(cfg: DiffusionConfig) -> Objective:
    """The objective whose `training_losses` a family calls (DiT train.py's `diffusion.training_losses`)."""
    if cfg.objective == "flow":
        return FlowObjective(cfg.timestep_sampling, cfg.timestep_mean, cfg.timestep_std, cfg.flow_shift)
    if cfg.objective == "edm":
        return EDMObjective(cfg.sigma_data, cfg.p_mean, cfg.p_std)
    return DDPMObjective(build_diffusion(cfg), lambda rng: draw_timesteps(cfg, rng), cfg.min_snr_gamma)


def sampling_process(cfg: DiffusionConfig, *, model: Model, model_kwargs: dict[str, Any], channels: int, clip: bool,
                     sampler: str, steps: int, cfg_scale: float,
                     null_kwargs: dict[str, Tensor] | None) -> SamplingProcess:
    """What `SAMPLERS[sampler]` runs on for `steps` steps: the model, guided by `cfg_scale` against `null_kwargs`
    (within `guidance_interval`, on the first `guidance_channels` channels), on the respaced chain (ddpm, ddim)
    or as the objective's denoiser with its σ steps (σ-samplers); `clip`: the data lives in [-1, 1], so every
    sampler brings x̂₀ into it at each step (clipped, or with `cfg.dynamic_threshold` dynamically thresholded). ValueError for a sampler the objective cannot run."""
    entry = SAMPLERS.get(sampler, "--sampler")
    if entry.discrete and cfg.objective != "ddpm":
        raise ValueError(sampler_mismatch(sampler, cfg.objective))
    objective = build_objective(cfg)
    if cfg_scale > 1.0 and null_kwargs is not None:
        active = None
        if cfg.guidance_interval is not None:  # σ of the model's time input (the chain's: the timestep index)
            lo, hi = cfg.guidance_interval

            def active(t: Tensor) -> bool:
                return lo < objective.sigma_of_time(t[:1].float()).item() <= hi

        guided = cfg.guidance_channels or channels
        if guided > channels:
            raise ValueError(f"model.diffusion.guidance_channels={guided}: the data has only {channels} channels")
        model = classifier_free_guidance(model, cfg_scale, null_kwargs, out_channels=guided, active=active)
    if entry.discrete:
        chain = build_diffusion(cfg.model_copy(update={"sampler": sampler}), sample_steps=steps)
        return SamplingProcess(model, model_kwargs, clip, dynamic_threshold=cfg.dynamic_threshold, diffusion=chain)
    denoise = objective.denoiser(model, model_kwargs, channels, clip, cfg.dynamic_threshold)
    return SamplingProcess(model, model_kwargs, clip, dynamic_threshold=cfg.dynamic_threshold, denoise=denoise,
                           sigmas=objective.sigmas(steps, cfg.rho))


def with_diffusion_defaults(options: SampleOptions | None, cfg: DiffusionConfig) -> SampleOptions:
    """`options` (None: none given) with the unset sampler, steps and guidance scale of the diffusion section."""
    return SampleOptions.of(options).filled(sampler=cfg.sampler, steps=cfg.sample_steps, cfg_scale=cfg.cfg_scale)


@torch.no_grad()
def sample_diffusion(cfg: DiffusionConfig, *, model: Model, shape: tuple[int, ...], model_kwargs: dict[str, Any],
                     null_kwargs: dict[str, Tensor] | None, clip: bool, sampler: str, steps: int, cfg_scale: float,
                     generator: torch.Generator, device: torch.device, progress: bool = False) -> Tensor:
    """Samples [shape] from x_T ~ N(0, I) drawn on the generator's device: the sampler of `sampler` (k-diffusion's
    one signature, genforge.diffusion.samplers) run on `sampling_process`, guided against `null_kwargs`."""
    process = sampling_process(cfg, model=model, model_kwargs=model_kwargs, channels=shape[1], clip=clip,
                               sampler=sampler, steps=steps, cfg_scale=cfg_scale, null_kwargs=null_kwargs)
    x_T = torch.randn(shape, generator=generator, device=generator.device).to(device)
    return SAMPLERS.get(sampler).run(process, x_T, generator=generator, progress=progress, eta=cfg.ddim_eta)
