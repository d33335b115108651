"""Config of the `diffusion` family: class-conditional diffusion on pixels or latents with a DiT (Peebles & Xie
2023) or an ADM U-Net (Dhariwal & Nichol 2021) backbone, on the shared diffusion objectives."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from genforge.core.codec import InputRun
from genforge.core.config import DataConfig, FamilyConfig, StrictModel
from genforge.diffusion.config import DiffusionConfig
from genforge.families.diffusion.dit import DIT_SIZES
from genforge.tokenizers.inputs import LatentInputConfig
from genforge.nn.unet import UNetConfig


class DiTConfig(StrictModel):
    """A Diffusion Transformer (`model.backbone.kind: dit`): a size of the paper's zoo (§3.2, Table 1), any of whose
    dimensions may be set apart."""

    kind: Literal["dit"] = "dit"
    size: str = Field("S/2", description="one of S|B|L|XL / 2|4|8")
    depth: int | None = Field(None, gt=0, description="default: the size's")
    hidden_size: int | None = Field(None, gt=0, description="default: the size's")
    num_heads: int | None = Field(None, gt=0, description="default: the size's")
    patch_size: int | None = Field(None, gt=0, description="default: the size's")
    mlp_ratio: float = Field(4.0, gt=0.0)

    @field_validator("size")
    @classmethod
    def _known_size(cls, value: str) -> str:
        if value not in DIT_SIZES:
            raise ValueError(f"unknown DiT size {value!r}; allowed: {', '.join(DIT_SIZES)}")
        return value

    @model_validator(mode="after")
    def _heads_divide_the_width(self) -> "DiTConfig":
        dims = self.dims()
        if dims["hidden_size"] % dims["num_heads"]:
            raise ValueError(f"model.backbone.hidden_size={dims['hidden_size']} must be divisible by "
                             f"model.backbone.num_heads={dims['num_heads']}")
        return self

    def dims(self) -> dict[str, int]:
        """depth, hidden_size, num_heads, patch_size: the size's, with the ones set here in their place."""
        return {key: getattr(self, key) or value for key, value in DIT_SIZES[self.size].items()}


class UNetBackboneConfig(UNetConfig):
    """The ADM U-Net (Dhariwal & Nichol 2021) of genforge.nn.unet (`model.backbone.kind: unet`)."""

    kind: Literal["unet"] = "unet"
    magnitude_preserving: bool = Field(
        False, description="EDM2's magnitude-preserving layers in the same layout (Karras et al. 2024: normalised "
                           "weights without biases or group norms, forced weight normalisation after each step, "
                           "mp_silu/mp_sum/mp_cat, cosine attention; genforge.nn.mp_unet); EDM2 trains it at a "
                           "higher learning rate (1e-2 for its small models). No diffusers export")


def _backbone_kind(value: Any) -> str:
    """The `kind` of a backbone section; dit when it does not say."""
    return value.get("kind", "dit") if isinstance(value, dict) else getattr(value, "kind", "dit")


Backbone = Annotated[Annotated[DiTConfig, Tag("dit")] | Annotated[UNetBackboneConfig, Tag("unet")],
                     Discriminator(_backbone_kind)]


class DiffusionModelConfig(FamilyConfig):
    """The backbone (`model.backbone`, a DiT or a U-Net by its `kind`), the conditioning, an optional latent codec,
    and the diffusion objective and sampler."""

    family: Literal["diffusion"] = "diffusion"
    backbone: Backbone = Field(DiTConfig(), description="kind: dit (the transformer of a zoo size) or unet")
    conditioning: Literal["class", "none"] = "class"
    num_classes: int | None = Field(None, gt=0, description="default: from the data set")
    class_dropout_prob: float = Field(0.1, ge=0.0, lt=1.0)
    latent: LatentInputConfig | None = None
    diffusion: DiffusionConfig = DiffusionConfig()

    def check_data(self, data: DataConfig) -> None:
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
        backbone = self.backbone
        if isinstance(backbone, UNetBackboneConfig):
            if side % backbone.downsample:
                raise ValueError(f"data.image_size={image_size} (model input {side}) must be divisible by "
                                 f"{backbone.downsample}, the downsampling of model.backbone.dim_mults="
                                 f"{list(backbone.dim_mults)}")
            return
        patch = backbone.dims()["patch_size"]
        if side % patch:
            raise ValueError(f"data.image_size={image_size} (model input {side}) must be "
                             f"divisible by model.backbone.patch_size={patch} (size {backbone.size})")
