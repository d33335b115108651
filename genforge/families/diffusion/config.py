"""Config of the `dit` family: class-conditional diffusion on pixels or latents with a DiT (Peebles & Xie 2023) or an
ADM U-Net (Dhariwal & Nichol 2021) backbone, on the shared diffusion objectives."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from genforge.core.codec import InputRun
from genforge.core.config import DataConfig, FamilyConfig
from genforge.diffusion.config import DiffusionConfig
from genforge.families.diffusion.dit import DIT_SIZES
from genforge.tokenizers.inputs import LatentInputConfig
from genforge.nn.unet import UNetConfig


class DiffusionModelConfig(FamilyConfig):
    """The backbone: a DiT size from the paper's zoo, optionally overridden dimension by dimension, or the ADM
    U-Net of `model.unet` (`backbone: unet`); the size fields belong to the DiT, `unet` to the U-Net."""

    family: Literal["diffusion"] = "diffusion"
    default_metrics: ClassVar[tuple[str, ...]] = ("judge",)
    backbone: Literal["dit", "unet"] = Field("dit", description="dit: the transformer of `size`; unet: `model.unet`")
    unet: UNetConfig = UNetConfig()
    size: str = Field("S/2", description="one of S|B|L|XL / 2|4|8")
    depth: int | None = Field(None, gt=0)
    hidden_size: int | None = Field(None, gt=0)
    num_heads: int | None = Field(None, gt=0)
    patch_size: int | None = Field(None, gt=0)
    mlp_ratio: float = Field(4.0, gt=0.0)
    conditioning: Literal["class", "none"] = "class"
    num_classes: int | None = Field(None, gt=0, description="default: from the data set")
    class_dropout_prob: float = Field(0.1, ge=0.0, lt=1.0)
    latent: LatentInputConfig | None = None
    diffusion: DiffusionConfig = DiffusionConfig()

    @field_validator("size")
    @classmethod
    def _known_size(cls, value: str) -> str:
        if value not in DIT_SIZES:
            raise ValueError(f"unknown DiT size {value!r}; allowed: {', '.join(DIT_SIZES)}")
        return value

    def dims(self) -> dict[str, int]:
        """depth, hidden_size, num_heads, patch_size after applying the overrides to the named size."""
        dims = dict(DIT_SIZES[self.size])
        for key in dims:
            if getattr(self, key, None) is not None:
                dims[key] = getattr(self, key)
        return dims

    def check_data(self, data: DataConfig) -> None:
        dims = self.dims()
        if self.backbone == "dit" and dims["hidden_size"] % dims["num_heads"]:
            raise ValueError(
                f"model.hidden_size={dims['hidden_size']} must be divisible by model.num_heads={dims['num_heads']}"
            )
        tokenizer = self.latent is not None and self.latent.loaded
        if data.source == "cache" and not tokenizer:
            raise ValueError("data.source=cache needs model.latent.codec=tokenizer (model.latent.tokenizer: the run) "
                             "or diffusers (model.latent.pretrained: the folder), the codec that wrote the cache "
                             "(it decodes the samples)")
        if data.source == "cache" and self.latent is not None and self.latent.sample_posterior:
            raise ValueError("model.latent.sample_posterior needs the images: a cache (genforge encode) holds each "
                             "image's posterior mean, not the posterior; train on the images the cache was made "
                             "from, or set model.latent.sample_posterior=false to train on the cached means")
        if not tokenizer:  # a tokenizer's downsampling is known once it is loaded (DiffusionTask checks it then)
            self.check_grid(data.image_size, self.latent.factor if self.latent else 1, "model.latent.factor")
        if self.diffusion.objective == "ddpm" and self.diffusion.sample_steps > self.diffusion.num_timesteps:
            raise ValueError(
                f"model.diffusion.sample_steps={self.diffusion.sample_steps} must be <= "
                f"model.diffusion.num_timesteps={self.diffusion.num_timesteps}"
            )

    def input_runs(self) -> dict[str, InputRun]:
        return self.latent.input_runs() if self.latent is not None else {}

    def check_grid(self, image_size: int, downsample: int, source: str) -> None:
        """The model input (image_size / downsample) must tile into patches, or halve through every U-Net level
        (ValueError naming `source`)."""
        if image_size % downsample:
            raise ValueError(f"data.image_size={image_size} must be divisible by {source}={downsample}")
        side = image_size // downsample
        if self.backbone == "unet":
            if side % self.unet.downsample:
                raise ValueError(f"data.image_size={image_size} (model input {side}) must be divisible by "
                                 f"{self.unet.downsample}, the downsampling of model.unet.dim_mults="
                                 f"{list(self.unet.dim_mults)}")
            return
        patch = self.dims()["patch_size"]
        if side % patch:
            raise ValueError(f"data.image_size={image_size} (model input {side}) must be "
                             f"divisible by model.patch_size={patch} (size {self.size})")
