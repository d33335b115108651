"""Config of the `clip` family: a contrastive image-text model (Radford et al. 2021), small enough for a CPU."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from genforge.core.config import DataConfig, FamilyConfig
from genforge.text.config import TextEncoderConfig


class ClipConfig(FamilyConfig):
    """A ViT image tower and a text tower (any genforge text encoder: `tiny` trains with the model, a frozen one gets
    a trained projection), both projected to `embed_dim` and compared by cosine similarity."""

    family: Literal["clip"] = "clip"
    width: int = Field(128, gt=0, description="image tower: transformer width")
    depth: int = Field(4, gt=0, description="image tower: transformer blocks")
    num_heads: int = Field(4, gt=0)
    patch_size: int = Field(4, gt=0, description="image tower: pixels per patch side")
    embed_dim: int = Field(64, gt=0, description="the shared embedding space's width D")
    text: TextEncoderConfig = TextEncoderConfig(kind="tiny", dim=128, depth=2, heads=4, max_length=48)
    init_temperature: float = Field(0.07, gt=0.0, description="τ at initialisation: logit scale = 1/τ (CLIP §2.5)")
    max_logit_scale: float = Field(100.0, gt=1.0, description="the logit scale is clipped here (CLIP §2.5)")

    @model_validator(mode="after")
    def _widths(self) -> "ClipConfig":
        if self.width % self.num_heads:
            raise ValueError(f"model.width={self.width} must be divisible by model.num_heads={self.num_heads}")
        if self.width % 4:
            raise ValueError(f"model.width={self.width} must be divisible by 4 (2-D sin-cos positions)")
        if 1 / self.init_temperature > self.max_logit_scale:
            raise ValueError(f"model.init_temperature={self.init_temperature} gives a logit scale above "
                             f"model.max_logit_scale={self.max_logit_scale}")
        return self

    @property
    def log_max_logit_scale(self) -> float:
        return math.log(self.max_logit_scale)

    def check_data(self, data: DataConfig) -> None:
        if data.image_size % self.patch_size:
            raise ValueError(f"data.image_size={data.image_size} must be divisible by model.patch_size="
                             f"{self.patch_size}")
