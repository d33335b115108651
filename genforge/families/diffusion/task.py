"""The diffusion family as a Task: a diffusion objective on pixels or codec latents, class-conditional with CFG dropout,
on a DiT or an ADM U-Net backbone."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from genforge.core.codec import GaussianLatentCodec
from genforge.core.config import SampleOptions
from genforge.core.family import BuildContext
from genforge.core.task import Batch, Task, class_conditions, class_count
from genforge.diffusion.build import build_objective, sample_diffusion, with_diffusion_defaults
from genforge.families.diffusion.config import DiffusionModelConfig, UNetBackboneConfig
from genforge.families.diffusion.dit import DiT
from genforge.nn.frozen import held_on
from genforge.nn.mp_unet import MPUNet, project_weights_
from genforge.nn.unet import UNet, build_unet
from genforge.tokenizers.standins import build_standin


class DiffusionTask(Task):
    """Trains the backbone with the objective's `training_losses` (DiT train.py's loop) and samples with the
    configured sampler."""


    def __init__(self, cfg: DiffusionModelConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.cfg = cfg
        data = ctx.info
        self.latent_codec = self._build_codec(cfg, ctx)  # frozen; None: DiT models pixels
        self.channels = self.latent_codec.latent_channels if self.latent_codec else data.channels
        self.input_size = data.image_size // (self.latent_codec.downsample if self.latent_codec else 1)
        self.num_classes = class_count(cfg.conditioning, cfg.num_classes, data.num_classes, "none")
        self.model = self._build_backbone(cfg)
        # the label of the null class for classifier-free guidance: one past the real classes in both backbones
        self.null_label = self.num_classes
        self.objective = build_objective(cfg.diffusion)

    def _build_backbone(self, cfg: DiffusionModelConfig) -> DiT | UNet | MPUNet:
        """The DiT, ADM U-Net or EDM2 magnitude-preserving U-Net of `model.backbone`: (x_t [B, C, h, w], t [B],
        y [B]) -> [B, C or 2C (learned variance), h, w]."""
        backbone = cfg.backbone
        if isinstance(backbone, UNetBackboneConfig):
            out_channels = self.channels * (2 if cfg.diffusion.learn_sigma else 1)
            if backbone.magnitude_preserving:
                return MPUNet(in_channels=self.channels, out_channels=out_channels, dim=backbone.dim,
                              dim_mults=backbone.dim_mults, num_res_blocks=backbone.num_res_blocks,
                              attention_levels=backbone.attention_levels, head_dim=backbone.head_dim,
                              dropout=backbone.dropout, mid_attention=backbone.mid_attention,
                              num_classes=self.num_classes)
            return build_unet(backbone, in_channels=self.channels, out_channels=out_channels,
                              num_classes=self.num_classes)
        return DiT(
            input_size=self.input_size,
            in_channels=self.channels,
            mlp_ratio=backbone.mlp_ratio,
            num_classes=self.num_classes,
            class_dropout_prob=0.0,  # the task drops labels itself, from the reproducible batch rng
            learn_sigma=cfg.diffusion.learn_sigma,
            **backbone.dims(),
        )

    @staticmethod
    def _build_codec(cfg: DiffusionModelConfig, ctx: BuildContext) -> torch.nn.Module | None:
        """The latent codec of `model.latent`: the stand-in, or the tokenizer run's or diffusers folder's, loaded by
        the application (as a submodule, or held outside the module tree: `held_on`)."""
        if cfg.latent is None:
            return None
        if not cfg.latent.loaded:
            return build_standin(cfg.latent, image_channels=ctx.info.channels)
        codec, info = ctx.codecs[cfg.latent.source_field]
        cfg.check_grid(ctx.info.image_size, info.downsample, f"the downsampling of {cfg.latent.source_path}")
        if cfg.latent.sample_posterior and not isinstance(codec, GaussianLatentCodec):
            raise ValueError(f"model.latent.sample_posterior: the codec of {cfg.latent.source_path} (a {info.family}"
                             ") has no Gaussian posterior to sample; a klvae run or an AutoencoderKL has")
        return codec

    def ema_module(self) -> torch.nn.Module:
        return self.model

    def end_step(self, step: int) -> None:
        """The magnitude-preserving U-Net's forced weight normalisation (EDM2 eq. 66), on every rank after the
        optimizer step."""
        if isinstance(self.model, MPUNet):
            project_weights_(self.model)

    def train(self, mode: bool = True) -> "DiffusionTask":
        """Train mode for the DiT; the codec stays frozen in eval mode."""
        super().train(mode)
        if self.latent_codec is not None:
            self.latent_codec.eval()
        return self

    def to_model_space(self, batch: Batch) -> Tensor:
        """The tensor diffusion runs on: cached latents, codec latents (the posterior mean, or with
        model.latent.sample_posterior a sample mean + std · ε, ε from batch["rng"]: DiT's
        `vae.encode(x).latent_dist.sample()`), or pixels."""
        if "latent" in batch:
            return batch["latent"]
        if self.latent_codec is None:
            return batch["image"]
        codec = held_on(self.latent_codec, batch["image"].device)
        with torch.no_grad():
            if not self.cfg.latent.sample_posterior:
                return codec.encode(batch["image"])
            mean, std = codec.encode_moments(batch["image"])  # [B, C, h, w] each
            return mean + std * batch["rng"].randn(*mean.shape[1:]).to(mean)

    def loss(self, batch: Batch, phase: str, step: int) -> tuple[Tensor, dict[str, Tensor]]:
        x = self.to_model_space(batch)  # [B, C, h, w]
        rng = batch["rng"]
        time, noise = self.objective.draw(rng, x)  # [B], [B, C, h, w]
        kwargs = {}
        if self.num_classes:
            drop = rng.rand() < self.cfg.class_dropout_prob  # label dropout for classifier-free guidance
            kwargs["y"] = batch["label"].masked_fill(drop.bool(), self.null_label)
        terms = self.objective.training_losses(self.model, x, time, noise, model_kwargs=kwargs)
        logs = {k: terms[k].mean().detach() for k in ("mse", "vb") if k in terms}
        return terms["loss"].mean(), logs

    def resolve(self, options: SampleOptions | None = None) -> SampleOptions:
        """Unset sampler, steps and guidance scale from model.diffusion."""
        return with_diffusion_defaults(super().resolve(options), self.cfg.diffusion)

    def sample_conditions(self, n: int, generator: torch.Generator, options: SampleOptions) -> Batch:
        if not self.num_classes:
            return Batch()
        return class_conditions(n, self.num_classes, options.label, generator.device)

    def guidance_scale(self, options: SampleOptions) -> float:
        """The guidance scale the sampler runs at: the resolved one, 1 (none) for an unconditional model."""
        return options.cfg_scale if self.num_classes else 1.0

    def sampler_settings(self, options: SampleOptions) -> dict[str, Any]:
        return {"sampler": options.sampler, "steps": options.steps, "cfg_scale": self.guidance_scale(options),
                "ddim_eta": self.cfg.diffusion.ddim_eta}

    @torch.no_grad()
    def sample(self, cond: Batch, generator: torch.Generator, n: int, options: SampleOptions,
               progress: bool = False) -> Tensor:
        """A sampler of `genforge.diffusion.SAMPLERS` (model.diffusion.sampler, or --sampler) with classifier-free
        guidance, from x_T drawn on the generator's device; images in [-1, 1]."""
        device = next(self.model.parameters()).device
        shape = (n, self.channels, self.input_size, self.input_size)
        kwargs, null = {}, None
        if self.num_classes:
            kwargs = {"y": cond["label"].to(device)}
            null = {"y": torch.full_like(kwargs["y"], self.null_label)}
        x = sample_diffusion(self.cfg.diffusion, model=self.model, shape=shape, model_kwargs=kwargs, null_kwargs=null,
                             clip=self.latent_codec is None,  # pixels live in [-1, 1]; latents have no fixed range
                             sampler=options.sampler, steps=options.steps, cfg_scale=self.guidance_scale(options),
                             generator=generator, device=device, progress=progress)
        images = held_on(self.latent_codec, x.device).decode(x) if self.latent_codec else x
        return images.clamp(-1, 1)
