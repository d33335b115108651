"""Config of the `klvae` family: the continuous KL autoencoder of latent diffusion (Rombach et al. 2022, sec. 3;
diffusers' AutoencoderKL, the Stable Diffusion VAE that DiT trains on)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from genforge.tokenizers.config import ConvStackConfig


class KLVAEConfig(ConvStackConfig):
    """AutoencoderKL's architecture parameters, the KL weight, and the latent scale factor."""

    family: Literal["klvae"] = "klvae"
    block_out_channels: list[int] = Field([64, 128], min_length=1, max_length=6,
                                          description="channels per level; downsampling 2**(levels - 1)")
    latent_channels: int = Field(4, ge=1, le=64)
    kl_weight: float = Field(1e-6, ge=0.0, description="weight of KL(q(z|x) ‖ N(0, I)), summed over the latent, "
                                                       "against the reconstruction loss summed over pixels")
    scale_factor: float | None = Field(None, gt=0.0, description="latent = mean(q(z|x)) · scale_factor, fixed; "
                                                                 "null: with model.pretrained its config's "
                                                                 "scaling_factor (the SD VAE's 0.18215, fixed: what "
                                                                 "DiT uses), else 1 / std of the latents, estimated "
                                                                 "while training")
    pretrained: str | None = Field(None, description="a local diffusers AutoencoderKL directory (e.g. "
                                                     "sd-vae-ft-ema) to start from; its architecture is used")
