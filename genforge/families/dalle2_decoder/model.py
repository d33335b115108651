"""DALL·E 2's decoder (Ramesh et al. 2022, §2.1 and App. C): a cascade of diffusion U-Nets, the first generating a
small image from a CLIP image embedding, each next one upsampling the previous stage's output: in the paper an
unconditional ADMNet (no embedding, no caption, no guidance), here too unless `model.stages[i].conditioned` says
otherwise.

Shapes: B batch, C = 3 channels, S_i the side of stage i, D the image-embedding width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genforge.families.dalle2_decoder.config import Dalle2DecoderConfig
from genforge.nn.unet import UNet, build_unet


def resize(images: Tensor, size: int) -> Tensor:
    """[B, C, H, W] -> [B, C, size, size]: antialiased bilinear when shrinking (no aliasing in the low-res
    conditioning), bilinear when growing."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False,
                         antialias=size < images.shape[-1])


def gaussian_blur(images: Tensor, sigma: Tensor, kernel: int) -> Tensor:
    """Blur each image of [B, C, H, W] with its own σ [B] (pixels): a separable `kernel`-tap Gaussian, reflect
    padding. σ = 0 leaves an image unchanged."""
    b, c, h, w = images.shape
    offsets = torch.arange(kernel, device=images.device, dtype=torch.float32) - kernel // 2  # [k]
    weights = torch.exp(-offsets**2 / (2 * sigma.float().clamp_min(1e-6)[:, None] ** 2))  # [B, k]
    weights = (weights / weights.sum(1, keepdim=True)).to(images.dtype)
    weights = weights.repeat_interleave(c, dim=0)  # [B·C, k]: one filter per (image, channel)
    x = images.reshape(1, b * c, h, w)
    pad = kernel // 2
    x = F.conv2d(F.pad(x, (pad, pad, 0, 0), mode="reflect"), weights[:, None, None, :], groups=b * c)  # along W
    x = F.conv2d(F.pad(x, (0, 0, pad, pad), mode="reflect"), weights[:, None, :, None], groups=b * c)  # along H
    return x.view(b, c, h, w)


def crop_rows(images: Tensor, top: Tensor, left: Tensor, side: int) -> Tensor:
    """[B, C, H, W] -> [B, C, side, side]: row b's square at (top[b], left[b]) (long [B] each, in pixels)."""
    span = torch.arange(side, device=images.device)
    rows = (top.to(images.device)[:, None] + span)[:, :, None]  # [B, side, 1]
    cols = (left.to(images.device)[:, None] + span)[:, None, :]  # [B, 1, side]
    batch = torch.arange(len(images), device=images.device)[:, None, None]
    return images.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)  # [B, side, side, C] -> [B, C, ...]


class DecoderCascade(nn.Module):
    """The U-Nets of the cascade, base first. A conditioned U-Net takes the image embedding (added to its timestep
    embedding and as four context tokens, §2.1), optionally text encodings; an unconditioned one has no layers for
    either. Each upsampler also takes the previous stage's image. Learned-variance stages output 2·C channels
    (IDDPM)."""

    def __init__(self, cfg: Dalle2DecoderConfig, image_embed_dim: int, text_dim: int = 0, channels: int = 3) -> None:
        super().__init__()
        self.unets = nn.ModuleList(
            build_unet(stage.unet, in_channels=channels, out_channels=channels * (2 if stage.diffusion.learn_sigma else 1),
                       image_embed_dim=image_embed_dim if stage.conditioned else 0,
                       text_dim=text_dim if stage.conditioned else 0, lowres=i > 0)
            for i, stage in enumerate(cfg.stages))

    def __getitem__(self, index: int) -> UNet:
        return self.unets[index]

    def __len__(self) -> int:
        return len(self.unets)
