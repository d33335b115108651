"""Parameter-free stand-in codecs, and `build_standin`, which makes the one a generator's codec input section names.

`SpaceToDepthCodec` (a LatentCodec) turns an image into a lower-resolution, many-channel tensor and back exactly;
`ColourQuantizerCodec` (a TokenCodec) paints blocks in quantised colours. They let the latent path (DiT) and the
token path (MaskGIT) be trained and tested without a trained tokenizer. The protocols are genforge.core.codec's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genforge.tokenizers.inputs import CodecInputConfig, VideoTokenInputConfig


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


def build_standin(cfg: CodecInputConfig, *, image_channels: int = 3) -> nn.Module:
    """The stand-in codec `cfg.codec` names (not for codec=tokenizer, whose codec the application loads)."""
    if cfg.codec == "space_to_depth":
        return SpaceToDepthCodec(image_channels, cfg.factor, cfg.scale)
    if cfg.codec == "colour":
        temporal = cfg.temporal_factor if isinstance(cfg, VideoTokenInputConfig) else 1
        return ColourQuantizerCodec(cfg.factor, cfg.levels, temporal)
    raise ValueError(f"{cfg.field}.codec={cfg.codec} is not a stand-in codec")
