"""Config of the `klvae` family: the continuous KL autoencoder of latent diffusion (Rombach et al. 2022, sec. 3;
diffusers' AutoencoderKL, the Stable Diffusion VAE that DiT trains on)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from genforge.families.tokenizer.config import TokenizerConfig

if TYPE_CHECKING:
    from genforge.config.run import RunConfig
    from genforge.data.loader import DataInfo
    from genforge.engine.task import Task


class KLVAEConfig(TokenizerConfig):
    """AutoencoderKL's architecture parameters, the KL weight, and the latent scale factor."""

    family: Literal["klvae"] = "klvae"
    block_out_channels: list[int] = Field([64, 128], min_length=1, max_length=6,
                                          description="channels per level; downsampling 2**(levels - 1)")
    layers_per_block: int = Field(1, ge=1, le=4)
    latent_channels: int = Field(4, ge=1, le=64)
    norm_num_groups: int = Field(32, ge=1)
    mid_block_attention: bool = True
    kl_weight: float = Field(1e-6, ge=0.0, description="weight of KL(q(z|x) ‖ N(0, I)), summed over the latent, "
                                                       "against the reconstruction loss summed over pixels")
    scale_factor: float | None = Field(None, gt=0.0, description="latent = mean(q(z|x)) · scale_factor; default: "
                                                                 "1 / std of the latents, estimated while training")
    pretrained: str | None = Field(None, description="a local diffusers AutoencoderKL directory (e.g. "
                                                     "sd-vae-ft-ema) to start from; its architecture is used")

    @field_validator("block_out_channels")
    @classmethod
    def _groups_divide(cls, value: list[int]) -> list[int]:
        if any(c <= 0 for c in value):
            raise ValueError(f"channels must be positive, got {value}")
        return value

    def downsample(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)

    def check_run(self, run: "RunConfig") -> None:
        super().check_run(run)
        bad = [c for c in self.block_out_channels if c % self.norm_num_groups]
        if bad:
            raise ValueError(f"model.block_out_channels {bad} must be divisible by model.norm_num_groups="
                             f"{self.norm_num_groups}")
        if "codebook" in (run.eval.metrics or ()):
            raise ValueError("eval.metrics: 'codebook' needs a discrete tokenizer (dvae, vqgan); klvae has "
                             "continuous latents")

    def build_task(self, run: "RunConfig", data: "DataInfo") -> "Task":
        from genforge.families.klvae.task import KLVAETask

        return KLVAETask(self, run, data)
