"""Parameter-free stand-in codecs, and the config section through which a generator names its codec.

`SpaceToDepthCodec` (a LatentCodec) turns an image into a lower-resolution, many-channel tensor and back exactly;
`ColourQuantizerCodec` (a TokenCodec) paints blocks in quantised colours. They let the latent path (DiT) and the
token path (MaskGIT) be trained and tested without a trained tokenizer. The protocols are genforge.core.codec's.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from genforge.core.codec import InputRun
from genforge.core.config import StrictModel


class SpaceToDepthCodec(nn.Module):
    """Lossless stand-in codec: pixel-unshuffle by `factor`, times `scale` (3 -> 3·factor² channels)."""

    def __init__(self, image_channels: int = 3, factor: int = 2, scale: float = 1.0) -> None:
        super().__init__()
        self.factor = factor
        self.scale = scale
        self.latent_channels = image_channels * factor * factor
        self.downsample = factor

    @torch.no_grad()
    def encode(self, image: Tensor) -> Tensor:
        return F.pixel_unshuffle(image, self.factor) * self.scale  # [B, C·f², H/f, W/f]

    @torch.no_grad()
    def decode(self, latent: Tensor) -> Tensor:
        return F.pixel_shuffle(latent / self.scale, self.factor)  # [B, C, H, W]


class ColourQuantizerCodec(nn.Module):
    """Parameter-free stand-in token codec: each factor×factor block's mean colour, `levels` levels per RGB
    channel, as one id in [0, levels³). Lets the token path (MaskGIT, Phenaki) be trained and tested without a
    trained tokenizer; decoding paints each block its quantised colour.

    Clips [B, C, T, H, W] are tokenized in C-ViViT's causal layout (Phenaki §2.1): the first frame on its own, then
    blocks of `temporal_factor` frames (their mean colour), so ids are [B, 1 + (T − 1) / temporal_factor, h, w];
    decoding repeats each block's colour over its frames."""

    def __init__(self, factor: int = 2, levels: int = 4, temporal_factor: int = 1) -> None:
        super().__init__()
        self.factor, self.levels, self.temporal_downsample = factor, levels, temporal_factor
        self.codebook_size = levels**3
        self.downsample = factor

    def _ids(self, colour: Tensor) -> Tensor:
        """Mean colours [B, 3, ...] in [-1, 1] -> ids [B, ...]."""
        q = ((colour + 1) / 2 * self.levels).long().clamp(0, self.levels - 1)
        return (q[:, 0] * self.levels + q[:, 1]) * self.levels + q[:, 2]

    def _colour(self, ids: Tensor) -> Tensor:
        """ids [B, ...] -> level-centre colours [B, 3, ...] in [-1, 1]."""
        n = self.levels
        q = torch.stack([ids // (n * n), ids // n % n, ids % n], dim=1).float()  # in 0..n-1
        return (q + 0.5) / n * 2 - 1

    @torch.no_grad()
    def encode(self, image: Tensor) -> Tensor:
        """image [B, 3, H, W] -> ids [B, h, w]; clip [B, 3, T, H, W] -> ids [B, t, h, w]."""
        if image.ndim == 4:
            return self._ids(F.avg_pool2d(image, self.factor))  # [B, h, w]
        f, ft = self.factor, self.temporal_downsample
        if (image.shape[2] - 1) % ft:
            raise ValueError(f"the colour codec with temporal factor {ft} needs 1 + k·{ft} frames, got "
                             f"{image.shape[2]}")
        first = F.avg_pool3d(image[:, :, :1], (1, f, f))  # [B, 3, 1, h, w]
        if image.shape[2] == 1:  # a 1-frame clip: the first frame's tokens only
            return self._ids(first)  # [B, 1, h, w]
        rest = F.avg_pool3d(image[:, :, 1:], (ft, f, f))  # [B, 3, (T − 1) / ft, h, w]
        return self._ids(torch.cat([first, rest], dim=2))  # [B, t, h, w]

    @torch.no_grad()
    def decode(self, ids: Tensor) -> Tensor:
        """ids [B, h, w] -> image [B, 3, H, W]; ids [B, t, h, w] -> clip [B, 3, 1 + (t − 1)·ft, H, W]."""
        colour = self._colour(ids)
        if ids.ndim == 3:
            return F.interpolate(colour, scale_factor=self.factor, mode="nearest")  # [B, 3, H, W]
        frames = torch.cat([colour[:, :, :1], colour[:, :, 1:].repeat_interleave(self.temporal_downsample, dim=2)],
                           dim=2)  # [B, 3, T, h, w]
        return frames.repeat_interleave(self.factor, dim=3).repeat_interleave(self.factor, dim=4)


class PooledPixelEmbedder(nn.Module):
    """Parameter-free stand-in ImageEmbedder: each image average-pooled to `grid`×`grid` colours, flattened and
    L2-normalised (3·grid² dimensions). Lets the image-embedding path (dalle2_decoder) be trained and tested without a
    trained CLIP; it has no text tower."""

    has_text = False

    def __init__(self, grid: int = 4, image_size: int = 32, channels: int = 3) -> None:
        super().__init__()
        self.grid, self.image_size = grid, image_size
        self.embed_dim = channels * grid * grid

    @torch.no_grad()
    def embed_images(self, image: Tensor) -> Tensor:
        pooled = F.adaptive_avg_pool2d(image.float(), self.grid).flatten(1)  # [B, C·grid²]
        return F.normalize(pooled, dim=-1)

    def embed_texts(self, texts: list[str]) -> Tensor:
        raise ValueError("the pooled-pixel stand-in embedder has no text tower")


STANDINS = {"space_to_depth": "latent", "colour": "tokens"}  # stand-in codec -> the kind of codes it makes


class CodecInputConfig(StrictModel):
    """Where a generator's codes come from (`model.latent` of dit, `model.tokens` of maskgit): a trained tokenizer
    run (its latest checkpoint's EMA weights encode and decode), or a parameter-free stand-in. A subclass narrows
    `codec` to the stand-in of its kind and sets `kind` and `field`."""

    kind: ClassVar[str]  # "latent" or "tokens": what the generator models
    field: ClassVar[str]  # the config field, for messages: "model.latent"
    codec: str
    tokenizer: str | None = Field(None, description="codec=tokenizer: run directory of a trained tokenizer")
    factor: int = Field(2, ge=1, le=16, description="a stand-in's downsampling: pixels per position along each side")
    scale: float = Field(1.0, gt=0.0, description="codec=space_to_depth: latent = encode(x) * scale (a tokenizer "
                                                   "brings its own scale factor)")
    levels: int = Field(4, ge=2, le=16, description="codec=colour: levels per RGB channel (levels³ codes)")

    @model_validator(mode="after")
    def _fields_fit_the_codec(self) -> "CodecInputConfig":
        f = self.field
        if self.codec == "tokenizer" and not self.tokenizer:
            raise ValueError(f"{f}.tokenizer (a tokenizer run directory) is required when {f}.codec is 'tokenizer'")
        if self.codec != "tokenizer" and self.tokenizer:
            raise ValueError(f"{f}.tokenizer applies to {f}.codec=tokenizer")
        own = {"space_to_depth": ("factor", "scale"), "colour": ("factor", "levels")}.get(self.codec, ())
        for name in ("factor", "scale", "levels"):
            if name not in own and getattr(self, name) != type(self).model_fields[name].default:
                where = "a tokenizer's downsampling and scale come from its checkpoint" if self.codec == "tokenizer" \
                    else f"it applies to codec={'colour' if name == 'levels' else 'space_to_depth'}"
                raise ValueError(f"{f}.{name} does not apply to {f}.codec={self.codec} ({where})")
        return self

    def input_runs(self) -> dict[str, InputRun]:
        """The tokenizer run, when the codes come from one."""
        if self.codec != "tokenizer":
            return {}
        return {f"{self.field}.tokenizer": InputRun(self.tokenizer, self.kind)}

    def standin(self, image_channels: int = 3) -> nn.Module:
        """The stand-in codec of `codec` (not for codec=tokenizer)."""
        if self.codec == "space_to_depth":
            return SpaceToDepthCodec(image_channels, self.factor, self.scale)
        if self.codec == "colour":
            return ColourQuantizerCodec(self.factor, self.levels)
        raise ValueError(f"{self.field}.codec={self.codec} is not a stand-in codec")


class LatentInputConfig(CodecInputConfig):
    """DiT's latents: a trained continuous tokenizer (a klvae run), or `space_to_depth`."""

    kind: ClassVar[str] = "latent"
    field: ClassVar[str] = "model.latent"
    codec: Literal["space_to_depth", "tokenizer"] = "space_to_depth"


class TokenInputConfig(CodecInputConfig):
    """MaskGIT's token ids: a trained discrete tokenizer (a vqgan or dvae run), or `colour` (tests)."""

    kind: ClassVar[str] = "tokens"
    field: ClassVar[str] = "model.tokens"
    codec: Literal["tokenizer", "colour"] = "tokenizer"


class VideoTokenInputConfig(TokenInputConfig):
    """Phenaki's token ids [B, t, h, w]: a trained video tokenizer (a cvivit run), or `colour` in C-ViViT's causal
    layout (the first frame, then blocks of `temporal_factor` frames; tests)."""

    temporal_factor: int = Field(2, ge=1, le=8, description="codec=colour: frames per token frame after the first "
                                                            "(a tokenizer's comes from its checkpoint)")

    @model_validator(mode="after")
    def _temporal_factor_is_the_standins(self) -> "VideoTokenInputConfig":
        if self.codec == "tokenizer" and self.temporal_factor != type(self).model_fields["temporal_factor"].default:
            raise ValueError(f"{self.field}.temporal_factor does not apply to {self.field}.codec=tokenizer (a "
                             "tokenizer's temporal patch comes from its checkpoint)")
        return self

    def standin(self, image_channels: int = 3) -> nn.Module:
        return ColourQuantizerCodec(self.factor, self.levels, self.temporal_factor)

