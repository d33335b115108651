"""Latent codecs: the encoder/decoder interface between pixels and the space a generator models.

A generator that trains "in latent space" (DiT as in the paper, on Stable-Diffusion VAE latents) calls
`encode` on its pixel batch and `decode` on its samples. Continuous tokenizers (klvae) implement
`LatentCodec`, discrete ones (dvae, vqgan) `TokenCodec`; a tokenizer family hands its codec out through
`Task.codec()`. `SpaceToDepthCodec` is an exact, parameter-free stand-in that turns an image into a
lower-resolution, many-channel tensor, so the latent path can be trained and tested without a tokenizer.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@runtime_checkable
class LatentCodec(Protocol):
    """image [B, 3, H, W] in [-1, 1]  <->  latent [B, latent_channels, H / downsample, W / downsample]."""

    latent_channels: int
    downsample: int

    def encode(self, image: Tensor) -> Tensor: ...

    def decode(self, latent: Tensor) -> Tensor: ...


@runtime_checkable
class TokenCodec(Protocol):
    """image [B, 3, H, W] in [-1, 1]  <->  token ids long [B, H / downsample, W / downsample] in [0, codebook_size)."""

    codebook_size: int
    downsample: int

    def encode(self, image: Tensor) -> Tensor: ...

    def decode(self, ids: Tensor) -> Tensor: ...


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
    channel, as one id in [0, levels³). Lets the token path (MaskGIT) be trained and tested without a
    trained VQ tokenizer; decoding paints each block its quantised colour."""

    def __init__(self, factor: int = 2, levels: int = 4) -> None:
        super().__init__()
        self.factor, self.levels = factor, levels
        self.codebook_size = levels**3
        self.downsample = factor

    @torch.no_grad()
    def encode(self, image: Tensor) -> Tensor:
        q = ((F.avg_pool2d(image, self.factor) + 1) / 2 * self.levels).long().clamp(0, self.levels - 1)  # [B,3,h,w]
        return (q[:, 0] * self.levels + q[:, 1]) * self.levels + q[:, 2]  # [B, h, w]

    @torch.no_grad()
    def decode(self, ids: Tensor) -> Tensor:
        n = self.levels
        q = torch.stack([ids // (n * n), ids // n % n, ids % n], dim=1).float()  # [B, 3, h, w] in 0..n-1
        colour = (q + 0.5) / n * 2 - 1  # level centres in [-1, 1]
        return F.interpolate(colour, scale_factor=self.factor, mode="nearest")  # [B, 3, H, W]
