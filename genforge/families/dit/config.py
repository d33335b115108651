"""Config of the `dit` family: Diffusion Transformer (Peebles & Xie 2023) + IDDPM diffusion."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from genforge.config.base import StrictModel
from genforge.diffusion.config import DiffusionConfig

if TYPE_CHECKING:
    from genforge.config.run import RunConfig
    from genforge.data.loader import DataInfo
    from genforge.engine.task import Task

DIT_SIZE_NAMES = tuple(f"{s}/{p}" for s in ("S", "B", "L", "XL") for p in (2, 4, 8))


class LatentConfig(StrictModel):
    """How pixels become the tensor DiT models: a trained continuous tokenizer (a klvae run), or
    `space_to_depth`, the parameter-free stand-in codec."""

    codec: Literal["space_to_depth", "tokenizer"] = "space_to_depth"
    tokenizer: str | None = Field(None, description="codec=tokenizer: run directory of a trained tokenizer (its "
                                                    "latest checkpoint's EMA weights encode and decode)")
    factor: int = Field(2, ge=1, le=16, description="codec=space_to_depth: downsampling factor")
    scale: float = Field(1.0, gt=0.0, description="codec=space_to_depth: latent = encode(x) * scale "
                                                   "(a tokenizer brings its own scale factor)")

    @model_validator(mode="after")
    def _tokenizer_for_tokenizer_codec(self) -> "LatentConfig":
        if self.codec == "tokenizer" and not self.tokenizer:
            raise ValueError("model.latent.tokenizer (a tokenizer run directory) is required when "
                             "model.latent.codec is 'tokenizer'")
        if self.codec == "space_to_depth" and self.tokenizer:
            raise ValueError("model.latent.tokenizer applies to model.latent.codec=tokenizer")
        if self.codec == "tokenizer" and (self.factor, self.scale) != (2, 1.0):
            raise ValueError("model.latent.factor and scale apply to codec=space_to_depth; a tokenizer's downsampling "
                             "and scale factor come from its checkpoint")
        return self


class DiTConfig(StrictModel):
    """DiT size from the paper's zoo, optionally overridden dimension by dimension."""

    family: Literal["dit"] = "dit"
    default_metrics: ClassVar[tuple[str, ...]] = ("judge",)
    size: str = Field("S/2", description="one of S|B|L|XL / 2|4|8")
    depth: int | None = Field(None, gt=0)
    hidden_size: int | None = Field(None, gt=0)
    num_heads: int | None = Field(None, gt=0)
    patch_size: int | None = Field(None, gt=0)
    mlp_ratio: float = Field(4.0, gt=0.0)
    conditioning: Literal["class", "none"] = "class"
    num_classes: int | None = Field(None, gt=0, description="default: from the data set")
    class_dropout_prob: float = Field(0.1, ge=0.0, lt=1.0)
    latent: LatentConfig | None = None
    diffusion: DiffusionConfig = DiffusionConfig()

    @field_validator("size")
    @classmethod
    def _known_size(cls, value: str) -> str:
        if value not in DIT_SIZE_NAMES:
            raise ValueError(f"unknown DiT size {value!r}; allowed: {', '.join(DIT_SIZE_NAMES)}")
        return value

    def dims(self) -> dict[str, int]:
        """depth, hidden_size, num_heads, patch_size after applying the overrides to the named size."""
        from genforge.families.dit.model import DIT_SIZES

        dims = dict(DIT_SIZES[self.size])
        for key in dims:
            if getattr(self, key, None) is not None:
                dims[key] = getattr(self, key)
        return dims

    def check_run(self, run: "RunConfig") -> None:
        """Cross-field checks against the data section (raise ValueError naming the fields)."""
        dims = self.dims()
        if dims["hidden_size"] % dims["num_heads"]:
            raise ValueError(
                f"model.hidden_size={dims['hidden_size']} must be divisible by model.num_heads={dims['num_heads']}"
            )
        tokenizer = self.latent is not None and self.latent.codec == "tokenizer"
        if run.data.source == "cache" and not tokenizer:
            raise ValueError("data.source=cache needs model.latent.codec=tokenizer and model.latent.tokenizer set "
                             "to the tokenizer run that wrote the cache (it decodes the samples)")
        if not tokenizer:  # a tokenizer's downsampling is known once it is loaded (DiTTask checks it then)
            self.check_grid(run.data.image_size, self.latent.factor if self.latent else 1, "model.latent.factor")
        if self.diffusion.sample_steps > self.diffusion.num_timesteps:
            raise ValueError(
                f"model.diffusion.sample_steps={self.diffusion.sample_steps} must be <= "
                f"model.diffusion.num_timesteps={self.diffusion.num_timesteps}"
            )

    def input_runs(self) -> dict[str, str]:
        """Run directories this model is built from, by config field."""
        if self.latent is not None and self.latent.codec == "tokenizer":
            return {"model.latent.tokenizer": self.latent.tokenizer}
        return {}

    def check_grid(self, image_size: int, downsample: int, source: str) -> None:
        """The model input (image_size / downsample) must tile into patches (ValueError naming `source`)."""
        patch = self.dims()["patch_size"]
        if image_size % downsample:
            raise ValueError(f"data.image_size={image_size} must be divisible by {source}={downsample}")
        if (image_size // downsample) % patch:
            raise ValueError(f"data.image_size={image_size} (model input {image_size // downsample}) must be "
                             f"divisible by model.patch_size={patch} (size {self.size})")

    def build_task(self, run: "RunConfig", data: "DataInfo") -> "Task":
        from genforge.families.dit.task import DiTTask

        return DiTTask(self, run, data)
