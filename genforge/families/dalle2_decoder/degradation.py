"""BSR degradation (Zhang et al. 2021, "Designing a Practical Degradation Model for Deep Blind Image
Super-Resolution", BSRGAN §3) of an upsampler's low-resolution training input, as DALL·E 2 degrades its second
upsampler's (Ramesh et al. 2022, App. C: "a more diverse BSR degradation"): the target-size image is blurred by an
isotropic or anisotropic Gaussian, resized down by bilinear, bicubic or area interpolation, noised by colour, grey
or channel-correlated Gaussian noise and JPEG-compressed, each with its own parameters per row, all as batched torch
operations. Left out of BSRGAN's model: the random shuffle of the operations' order (fixed here: blur, resize,
noise, JPEG), its second blur and intermediate resize, and camera-sensor noise.

Every parameter is drawn from the batch's random stream (`draw_bsr`), so a resumed step degrades exactly as the
first run did. Shapes: B batch, C channels, S the target side, P the low-resolution side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from genforge.core.random import BatchRandom

NOISE_LEVELS = (2.0, 25.0)  # BSRGAN's Gaussian noise σ, in 8-bit levels
JPEG_QUALITIES = (30, 95)  # BSRGAN's JPEG quality range
RESIZE_MODES = ("bilinear", "bicubic", "area")

# JPEG's example quantisation tables (ITU-T T.81, Annex K.1), luminance and chrominance, for quality 50
LUMA_TABLE = torch.tensor([
    [16, 11, 10, 16, 24, 40, 51, 61], [12, 12, 14, 19, 26, 58, 60, 55], [14, 13, 16, 24, 40, 57, 69, 56],
    [14, 17, 22, 29, 51, 87, 80, 62], [18, 22, 37, 56, 68, 109, 103, 77], [24, 35, 55, 64, 81, 104, 113, 92],
    [49, 64, 78, 87, 103, 121, 120, 101], [72, 92, 95, 98, 112, 100, 103, 99]], dtype=torch.float32)
CHROMA_TABLE = torch.tensor([
    [17, 18, 24, 47, 99, 99, 99, 99], [18, 21, 26, 66, 99, 99, 99, 99], [24, 26, 56, 99, 99, 99, 99, 99],
    [47, 66, 99, 99, 99, 99, 99, 99]] + [[99] * 8] * 4, dtype=torch.float32)


@dataclass
class BSRDraws:
    """One BSR degradation's parameters per row."""

    blur_sigma: Tensor  # [B, 2] std (target-size pixels) along the kernel's two axes
    blur_angle: Tensor  # [B] rotation of the first axis (radians)
    resize_mode: Tensor  # [B] long, an index of RESIZE_MODES
    noise_sigma: Tensor  # [B] std of the noise in [-1, 1] units
    noise_kind: Tensor  # [B] long: 0 colour (independent channels), 1 grey (one for all), 2 channel-correlated
    noise_basis: Tensor  # [B, 3, 3] orthonormal: the correlated noise's principal axes
    noise_weights: Tensor  # [B, 3] in [0, 1): its variance along each axis, relative
    noise: Tensor  # [B, C, P, P] standard normal
    jpeg_quality: Tensor  # [B] long in JPEG_QUALITIES


def draw_bsr(rng: BatchRandom, channels: int, size: int, scale: float) -> BSRDraws:
    """The parameters of degrading each row to side `size` from `scale` times it, BSRGAN's ranges for that scale
    factor sf: half of the rows an anisotropic Gaussian whose variances are uniform in (0.1, 4 + sf), the others
    an isotropic one of σ uniform in (0.1, 2 + 0.2·sf); noise of σ uniform in 2..25 levels, colour 40 %, grey 40 %,
    correlated 20 %; JPEG quality uniform in 30..95."""
    u = rng.rand(8)  # [B, 8]
    anisotropic = u[:, 0] < 0.5
    variances = 0.1 + (4.0 + scale - 0.1) * u[:, 1:3]  # [B, 2]
    isotropic = 0.1 + (2.0 + 0.2 * scale - 0.1) * u[:, 3:4]  # [B, 1]
    sigma = torch.where(anisotropic[:, None], variances.sqrt(), isotropic.expand(-1, 2))
    lo, hi = NOISE_LEVELS
    basis, _ = torch.linalg.qr(rng.randn(3, 3))  # [B, 3, 3]: a random orthonormal basis
    return BSRDraws(blur_sigma=sigma, blur_angle=u[:, 4] * math.pi,
                    resize_mode=(u[:, 5] * len(RESIZE_MODES)).long().clamp_(max=len(RESIZE_MODES) - 1),
                    noise_sigma=(lo + (hi - lo) * u[:, 6]) * 2 / 255,
                    noise_kind=(u[:, 7] >= 0.4).long() + (u[:, 7] >= 0.8).long(),
                    noise_basis=basis, noise_weights=rng.rand(3), noise=rng.randn(channels, size, size),
                    jpeg_quality=(JPEG_QUALITIES[0] + rng.rand() * (JPEG_QUALITIES[1] - JPEG_QUALITIES[0] + 1))
                    .long().clamp_(max=JPEG_QUALITIES[1]))


def bsr_degrade(images: Tensor, size: int, draws: BSRDraws) -> Tensor:
    """[B, C, S, S] in [-1, 1] -> [B, C, size, size] in [-1, 1]: blurred (`anisotropic_blur`), resized down
    (each row by its mode), noised (`bsr_noise`), JPEG-compressed (`jpeg`)."""
    blurred = anisotropic_blur(images, draws.blur_sigma, draws.blur_angle)
    resized = torch.stack([F.interpolate(blurred, size=(size, size), mode=mode, antialias=mode != "area",
                                         **({} if mode == "area" else {"align_corners": False}))
                           for mode in RESIZE_MODES])  # [modes, B, C, P, P]
    low = resized[draws.resize_mode, torch.arange(len(images), device=images.device)]  # [B, C, P, P]
    low = (low + bsr_noise(draws)).clamp(-1, 1)
    return jpeg(low, draws.jpeg_quality)


def anisotropic_blur(images: Tensor, sigma: Tensor, angle: Tensor) -> Tensor:
    """Blur each image of [B, C, H, W] with its own Gaussian of stds σ [B, 2] along axes rotated by `angle` [B]
    (BSRGAN's anisotropic kernel; equal σ: isotropic): a k×k kernel, k = 2·⌈3·max σ⌉ + 1, replicate padding."""
    b, c, h, w = images.shape
    half = math.ceil(3 * float(sigma.max()))
    offsets = torch.arange(-half, half + 1, device=images.device, dtype=torch.float32)
    y, x = torch.meshgrid(offsets, offsets, indexing="ij")  # [k, k]
    cos, sin = angle.float().cos()[:, None, None], angle.float().sin()[:, None, None]
    along, across = x * cos + y * sin, -x * sin + y * cos  # [B, k, k]: coordinates on the kernel's axes
    s = sigma.float().clamp_min(1e-3)
    weights = torch.exp(-0.5 * ((along / s[:, 0, None, None]) ** 2 + (across / s[:, 1, None, None]) ** 2))
    weights = (weights / weights.sum((1, 2), keepdim=True)).to(images.dtype)  # [B, k, k]
    padded = F.pad(images.reshape(1, b * c, h, w), (half,) * 4, mode="replicate")
    kernels = weights.repeat_interleave(c, dim=0)[:, None]  # [B·C, 1, k, k]: one per (image, channel)
    return F.conv2d(padded, kernels, groups=b * c).view(b, c, h, w)


def bsr_noise(draws: BSRDraws) -> Tensor:
    """BSRGAN's additive Gaussian noise [B, C, P, P] of std `noise_sigma`: independent per channel (colour), one
    field for every channel (grey), or with channel covariance σ²·Uᵀ·diag(w)·U (correlated; RGB only, colour
    otherwise)."""
    z, sigma, kind = draws.noise, draws.noise_sigma[:, None, None, None], draws.noise_kind[:, None, None, None]
    grey = z[:, :1].expand_as(z)
    if z.shape[1] == 3:
        mixing = draws.noise_basis.transpose(1, 2) * draws.noise_weights.sqrt()[:, None, :]  # Uᵀ·diag(√w)
        correlated = torch.einsum("bij,bjhw->bihw", mixing, z)
    else:
        correlated = z
    return sigma * torch.where(kind == 0, z, torch.where(kind == 1, grey, correlated))


def jpeg_table(base: Tensor, quality: Tensor) -> Tensor:
    """Per-row quantisation tables [B, 8, 8] for qualities [B] in 1..100 (the IJG scaling of the Annex K tables)."""
    q = quality.float().clamp(1, 100)
    scale = torch.where(q < 50, 5000 / q, 200 - 2 * q)[:, None, None]  # [B, 1, 1]
    return ((base.to(q.device) * scale + 50) / 100).floor().clamp(1, 255)


def dct_matrix(device: torch.device) -> Tensor:
    """The orthonormal 8-point DCT-II matrix [8, 8] (rows: frequencies)."""
    k, n = torch.arange(8, device=device, dtype=torch.float32)[:, None], torch.arange(8, device=device)
    m = torch.cos(math.pi * (2 * n + 1) * k / 16) * math.sqrt(2 / 8)
    m[0] /= math.sqrt(2)
    return m


def quantise_blocks(plane: Tensor, table: Tensor) -> Tensor:
    """A level-shifted plane [B, H, W] through JPEG's lossy step: 8×8 blocks (edge-replicated to whole blocks),
    DCT, quantised by `table` [B, 8, 8], dequantised, inverse DCT."""
    b, h, w = plane.shape
    hp, wp = -(-h // 8) * 8, -(-w // 8) * 8
    x = F.pad(plane[:, None], (0, wp - w, 0, hp - h), mode="replicate")[:, 0]
    blocks = x.view(b, hp // 8, 8, wp // 8, 8).transpose(2, 3)  # [B, h/8, w/8, 8, 8]
    d = dct_matrix(plane.device)
    coefs = d @ blocks @ d.T
    q = table[:, None, None]  # [B, 1, 1, 8, 8]
    restored = d.T @ ((coefs / q).round() * q) @ d
    return restored.transpose(2, 3).reshape(b, hp, wp)[:, :h, :w]


def jpeg(images: Tensor, quality: Tensor) -> Tensor:
    """JPEG compression and decompression (ITU-T T.81, baseline, as libjpeg / PIL at `quality`) of [B, C, H, W] in
    [-1, 1], each row at its quality [B]: 8-bit levels, RGB -> YCbCr (JFIF) with 4:2:0 chroma (2×2 means,
    upsampled bilinearly back), the lossy 8×8 DCT quantisation (`quantise_blocks`), back to RGB and 8 bits. One
    channel: the luminance alone."""
    x = ((images.float() + 1) * 127.5).round().clamp(0, 255)
    luma_table, chroma_table = jpeg_table(LUMA_TABLE, quality), jpeg_table(CHROMA_TABLE, quality)
    if x.shape[1] == 1:
        out = quantise_blocks(x[:, 0] - 128, luma_table)[:, None] + 128
    else:
        r, g, bl = x.unbind(1)
        y = 0.299 * r + 0.587 * g + 0.114 * bl
        cb = -0.168736 * r - 0.331264 * g + 0.5 * bl + 128
        cr = 0.5 * r - 0.418688 * g - 0.081312 * bl + 128
        h, w = y.shape[-2:]
        chroma = F.avg_pool2d(F.pad(torch.stack([cb, cr], 1), (0, w % 2, 0, h % 2), mode="replicate"), 2)  # 4:2:0
        chroma = torch.stack([quantise_blocks(c - 128, chroma_table) + 128 for c in chroma.unbind(1)], 1)
        chroma = F.interpolate(chroma, scale_factor=2, mode="bilinear", align_corners=False)[..., :h, :w]
        y = quantise_blocks(y - 128, luma_table) + 128
        cb, cr = chroma.unbind(1)
        out = torch.stack([y + 1.402 * (cr - 128), y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128),
                           y + 1.772 * (cb - 128)], 1)
    return (out.round().clamp(0, 255) / 127.5 - 1).to(images.dtype)
