"""Config of the `dit` family: Diffusion Transformer (Peebles & Xie 2023) + IDDPM diffusion."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from genforge.config.base import StrictModel
from genforge.diffusion.config import DiffusionConfig

if TYPE_CHECKING:
    from genforge.config.run import RunConfig
    from genforge.data.loader import DataInfo
    from genforge.engine.task import Task

DIT_SIZE_NAMES = tuple(f"{s}/{p}" for s in ("S", "B", "L", "XL") for p in (2, 4, 8))


class LatentConfig(StrictModel):
    """How pixels become the tensor DiT models. `space_to_depth` is the parameter-free stand-in codec."""

    codec: Literal["space_to_depth"] = "space_to_depth"
    factor: int = Field(2, ge=1, le=16)
    scale: float = Field(1.0, gt=0.0, description="latent = encode(x) * scale (the VAE's scale factor)")


class DiTConfig(StrictModel):
    """DiT size from the paper's zoo, optionally overridden dimension by dimension."""

    family: Literal["dit"] = "dit"
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
        factor = self.latent.factor if self.latent else 1
        if run.data.image_size % factor:
            raise ValueError(
                f"data.image_size={run.data.image_size} must be divisible by model.latent.factor={factor}"
            )
        grid = run.data.image_size // factor
        if grid % dims["patch_size"]:
            raise ValueError(
                f"data.image_size={run.data.image_size} (model input {grid}) must be divisible by "
                f"model.patch_size={dims['patch_size']} (size {self.size})"
            )
        if self.diffusion.sample_steps > self.diffusion.num_timesteps:
            raise ValueError(
                f"model.diffusion.sample_steps={self.diffusion.sample_steps} must be <= "
                f"model.diffusion.num_timesteps={self.diffusion.num_timesteps}"
            )

    def build_task(self, run: "RunConfig", data: "DataInfo") -> "Task":
        from genforge.families.dit.task import DiTTask

        return DiTTask(self, run, data)
