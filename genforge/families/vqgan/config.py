"""Config of the `vqgan` family: the VQGAN of taming-transformers (Esser et al. 2021) as MUSE trains it
(lucidrains' muse-maskgit-pytorch `VQGanVAE`), with the quantizer as a choice: vector quantization (van den
Oord et al. 2017) with an EMA or a learnt codebook, optionally l2-normalised codes (ViT-VQGAN, Yu et al.
2022); lookup-free quantization (LFQ, MAGVIT-v2, Yu et al. 2023); finite scalar quantization (FSQ, Mentzer
et al. 2023)."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from genforge.core.config import StrictModel
from genforge.tokenizer_base.config import ConvStackConfig, GANConfig

QuantizerKind = Literal["vq", "lfq", "fsq"]

# which quantizer kinds each field applies to (setting it for another kind is an error)
APPLIES_TO: dict[str, tuple[str, ...]] = {
    "codebook_size": ("vq", "lfq"),
    "codebook_dim": ("vq",),
    "commitment_weight": ("vq", "lfq"),
    "ema_update": ("vq",),
    "decay": ("vq",),
    "use_cosine_sim": ("vq",),
    "kmeans_init": ("vq",),
    "threshold_ema_dead_code": ("vq",),
    "rotation_trick": ("vq",),
    "entropy_loss_weight": ("lfq",),
    "diversity_gamma": ("lfq",),
    "levels": ("fsq",),
}


class QuantizerConfig(StrictModel):
    """The bottleneck between encoder and decoder; each field names the kinds it applies to (changing a field
    of another kind is an error)."""

    kind: QuantizerKind = Field("vq", description="vq: nearest code of a codebook; lfq: the sign of each of "
                                                  "log2(codebook_size) channels; fsq: each channel rounded to "
                                                  "one of `levels[i]` values")
    codebook_size: int = Field(512, ge=2, le=2**20, description="vq, lfq (a power of 2); fsq: prod(levels)")
    codebook_dim: int | None = Field(None, ge=1, description="vq: code dimension (default: model.z_channels; "
                                                             "smaller: a linear projection in and out, as "
                                                             "ViT-VQGAN's 8-32-d codes)")
    commitment_weight: float = Field(0.25, ge=0.0, description="vq, lfq: β of β‖z − sg(e)‖²")
    ema_update: bool = Field(True, description="vq: codebook = EMA of the encodings assigned to each code "
                                               "(a buffer, no gradient); false: a learnt codebook (β‖z − e‖² "
                                               "trains both sides)")
    decay: float = Field(0.99, gt=0.0, lt=1.0, description="vq: decay of the codebook EMA")
    use_cosine_sim: bool = Field(False, description="vq: l2-normalised codes and encodings, nearest by cosine "
                                                    "(ViT-VQGAN); needs ema_update")
    kmeans_init: bool = Field(False, description="vq: initialise the codebook by 10 k-means iterations on the "
                                                 "first training batch")
    threshold_ema_dead_code: float = Field(0.0, ge=0.0, description="vq: a code whose EMA usage count falls "
                                                                    "below this is replaced by an encoding of "
                                                                    "the batch (0: never)")
    rotation_trick: bool = Field(True, description="vq: gradients through the quantizer by the rotation trick "
                                                   "(Fifty et al. 2024); false: the straight-through estimator")
    entropy_loss_weight: float = Field(0.1, ge=0.0, description="lfq: weight of the entropy loss (per-code "
                                                                "entropy − diversity_gamma · batch entropy)")
    diversity_gamma: float = Field(1.0, ge=0.0, description="lfq: weight of the batch-entropy (usage) term")
    levels: list[int] | None = Field(None, min_length=1, max_length=16,
                                     description="fsq: levels per channel, e.g. [8, 5, 5, 5] (1000 codes)")

    @field_validator("levels")
    @classmethod
    def _levels_at_least_two(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(level < 2 for level in value):
            raise ValueError(f"every level must be >= 2, got {value}")
        return value

    @model_validator(mode="after")
    def _fields_fit_the_kind(self) -> "QuantizerConfig":
        # a changed default, not merely a field present (a resolved config.yaml lists every field)
        wrong = [f for f, kinds in APPLIES_TO.items()
                 if self.kind not in kinds and getattr(self, f) != type(self).model_fields[f].default]
        if wrong:
            raise ValueError(", ".join(f"{f} applies to kind {' or '.join(APPLIES_TO[f])}" for f in wrong)
                             + f", not to kind={self.kind}")
        if self.kind == "lfq" and not math.log2(self.codebook_size).is_integer():
            raise ValueError(f"codebook_size={self.codebook_size} must be a power of 2 for kind=lfq (one bit per "
                             f"channel), e.g. {2 ** round(math.log2(self.codebook_size))}")
        if self.kind == "fsq" and self.levels is None:
            raise ValueError("levels must be set for kind=fsq, e.g. levels: [8, 5, 5, 5]")
        if self.kind == "vq" and self.use_cosine_sim and not self.ema_update:
            raise ValueError("use_cosine_sim=true needs ema_update=true (l2-normalised codes are not learnt by "
                             "gradient here)")
        return self

    def size(self) -> int:
        """The number of distinct token ids."""
        return math.prod(self.levels) if self.kind == "fsq" else self.codebook_size


class VQGANConfig(ConvStackConfig):
    """Encoder/decoder (diffusers' resnet + attention blocks), the quantizer, and the shared tokenizer losses
    (perceptual, patch GAN: on by default, as in VQGAN)."""

    family: Literal["vqgan"] = "vqgan"
    default_metrics: ClassVar[tuple[str, ...]] = ("psnr", "ssim", "codebook")
    roles: ClassVar[tuple[str, ...]] = ("tokenizer", "discrete")
    block_out_channels: list[int] = Field([64, 128, 128], min_length=1, max_length=6,
                                          description="channels per level; downsampling 2**(levels - 1)")
    z_channels: int = Field(64, ge=1, le=1024, description="channels of the encoder's output and the decoder's "
                                                            "input (the quantizer works on these)")
    quantizer: QuantizerConfig = QuantizerConfig()
    gan: GANConfig | None = GANConfig()
