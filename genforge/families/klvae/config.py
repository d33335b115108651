"""Config of the `klvae` family: the continuous KL autoencoder of latent diffusion (Rombach et al. 2022, sec. 3;
diffusers' AutoencoderKL, the Stable Diffusion VAE that DiT trains on)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from genforge.families.tokenizer.config import ConvStackConfig

if TYPE_CHECKING:
    from genforge.config.run import RunConfig
    from genforge.data.loader import DataInfo
    from genforge.engine.task import Task


class KLVAEConfig(ConvStackConfig):
    """AutoencoderKL's architecture parameters, the KL weight, and the latent scale factor."""

    family: Literal["klvae"] = "klvae"
    block_out_channels: list[int] = Field([64, 128], min_length=1, max_length=6,
                                          description="channels per level; downsampling 2**(levels - 1)")
    latent_channels: int = Field(4, ge=1, le=64)
    kl_weight: float = Field(1e-6, ge=0.0, description="weight of KL(q(z|x) ‖ N(0, I)), summed over the latent, "
                                                       "against the reconstruction loss summed over pixels")
    scale_factor: float | None = Field(None, gt=0.0, description="latent = mean(q(z|x)) · scale_factor; default: "
                                                                 "1 / std of the latents, estimated while training")
    pretrained: str | None = Field(None, description="a local diffusers AutoencoderKL directory (e.g. "
                                                     "sd-vae-ft-ema) to start from; its architecture is used")

    def check_run(self, run: "RunConfig") -> None:
        super().check_run(run)
        if "codebook" in (run.eval.metrics or ()):
            raise ValueError("eval.metrics: 'codebook' needs a discrete tokenizer (dvae, vqgan); klvae has "
                             "continuous latents")

    def build_task(self, run: "RunConfig", data: "DataInfo") -> "Task":
        from genforge.families.klvae.task import KLVAETask

        return KLVAETask(self, run, data)
