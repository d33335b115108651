"""Embeddings: sinusoidal timesteps, class labels with a null class, fixed 2-D sin-cos positions, patches.

Follows DiT (Peebles & Xie 2023): §3.2 "Patchify" (patch tokens + sin-cos positions) and the t / class
conditioning of §3.2, with the label dropout of classifier-free guidance (§3.1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10_000.0) -> Tensor:
    """Sinusoidal embedding of timesteps t [B] (integer or fractional) -> [B, dim] float32:
    [cos(t·f_0), ..., cos(t·f_{k-1}), sin(t·f_0), ..., sin(t·f_{k-1})] with f_i = max_period^(-i/k),
    k = dim // 2 (Transformer positional encoding); an odd dim gets one zero channel at the end."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) / half * torch.arange(half, dtype=torch.float32, device=t.device))
    args = t.to(torch.float32)[:, None] * freqs[None]  # [B, half]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # [B, 2·half]
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb  # [B, dim]


class TimestepEmbedder(nn.Module):
    """t [B] -> [B, hidden]: a `freq_dim`-wide sinusoid, then Linear -> SiLU -> Linear (DiT §3.2)."""

    def __init__(self, hidden: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: Tensor) -> Tensor:
        freq = timestep_embedding(t, self.freq_dim).to(self.mlp[0].weight.dtype)  # [B, freq_dim]
        return self.mlp(freq)  # [B, hidden]


class LabelEmbedder(nn.Module):
    """Class labels [B] -> [B, hidden] from a table with one extra "null" class at index `num_classes`.

    Classifier-free guidance (DiT §3.1) trains the null class by replacing each label with it with
    probability `dropout_prob` while training; `force_drop_ids` (bool or 0/1 [B]) picks the replaced
    labels instead, in any mode.
    """

    def __init__(self, num_classes: int, hidden: int, dropout_prob: float) -> None:
        super().__init__()
        if not 0.0 <= dropout_prob <= 1.0:
            raise ValueError(f"label dropout_prob must be in [0, 1], got {dropout_prob}")
        self.num_classes = num_classes
        self.null_id = num_classes
        self.dropout_prob = dropout_prob
        self.embedding_table = nn.Embedding(num_classes + 1, hidden)

    def drop(self, labels: Tensor, drop_mask: Tensor) -> Tensor:
        """Labels with the null class where `drop_mask` is true."""
        return labels.masked_fill(drop_mask.bool(), self.null_id)

    def forward(self, labels: Tensor, force_drop_ids: Tensor | None = None) -> Tensor:
        if force_drop_ids is not None:
            labels = self.drop(labels, force_drop_ids)
        elif self.training and self.dropout_prob > 0:
            labels = self.drop(labels, torch.rand(labels.shape, device=labels.device) < self.dropout_prob)
        return self.embedding_table(labels)  # [B, hidden]


def sincos_pos_embed_1d(dim: int, length: int) -> Tensor:
    """Fixed 1-D sin-cos position embedding [length, dim] (Vaswani et al. 2017): position p as
    [sin(p·ω_0..ω_{k-1}), cos(p·ω_0..ω_{k-1})], ω_i = 10000^(-i/k), k = dim/2; any length (videos of any
    number of frames)."""
    if dim % 2:
        raise ValueError(f"1-D sin-cos position embedding needs an even width, got {dim}")
    k = dim // 2
    omega = 1.0 / 10_000 ** (torch.arange(k, dtype=torch.float64) / k)  # [k]
    args = torch.arange(length, dtype=torch.float64)[:, None] * omega[None]  # [length, k]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=1).float()


def sincos_pos_embed_2d(dim: int, grid_h: int, grid_w: int) -> Tensor:
    """Fixed 2-D sin-cos position embedding [grid_h·grid_w, dim] (MAE; DiT §3.2 "Patchify").

    Tokens in row-major order. Channels [0, dim/2) encode the column x, [dim/2, dim) the row y, each
    as [sin(p·ω_0..ω_{k-1}), cos(p·ω_0..ω_{k-1})] with ω_i = 10000^(-i/k), k = dim/4. Computed in
    float64, returned as float32.
    """
    if dim % 4:
        raise ValueError(f"2-D sin-cos position embedding needs a width divisible by 4, got {dim}")
    k = dim // 4
    omega = 1.0 / 10_000 ** (torch.arange(k, dtype=torch.float64) / k)  # [k]
    y, x = torch.meshgrid(torch.arange(grid_h, dtype=torch.float64),
                          torch.arange(grid_w, dtype=torch.float64), indexing="ij")  # [h, w] each
    pos = torch.stack([x.flatten(), y.flatten()], dim=1)  # [N, 2]: (column, row)
    angles = pos[:, :, None] * omega  # [N, 2, k]
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=2)  # [N, 2, 2k]
    return emb.reshape(grid_h * grid_w, dim).to(torch.float32)  # [N, dim]


def rotary_tables(positions: Tensor, head_dim: int, base: float = 100.0) -> tuple[Tensor, Tensor]:
    """cos and sin [N, head_dim] of a multi-axis rotary embedding (RoPE, Su et al. 2021) for token positions [N, A]
    (e.g. A = 3: token frame, row, column): the head's d/2 channel pairs are split among the A axes (the first axes
    get d/2 // A pairs each, the last the rest); pair i of an axis turns by position · base^(-i / pairs of the axis).
    Channels in the rotate-half layout of `apply_rotary` (pair i = channels i and i + d/2)."""
    n, axes = positions.shape
    if head_dim % 2 or head_dim // 2 < axes:
        raise ValueError(f"rotary positions over {axes} axes need an even head width of at least {2 * axes}, got "
                         f"{head_dim}")
    pairs = head_dim // 2
    per_axis = [pairs // axes] * (axes - 1) + [pairs - (pairs // axes) * (axes - 1)]
    angles = []
    for axis, count in enumerate(per_axis):
        omega = base ** (-torch.arange(count, dtype=torch.float64) / count)  # [count]
        angles.append(positions[:, axis, None].double() * omega)  # [N, count]
    angle = torch.cat(angles, dim=1)  # [N, d/2]
    angle = torch.cat([angle, angle], dim=1)  # [N, d]: pair i at channels i and i + d/2
    return angle.cos().float(), angle.sin().float()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., N, d] rotated pairwise by the angles of `rotary_tables` (cos, sin [N, d]): q·k then depends on the
    positions only through their difference."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # rotate_half
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class PatchEmbed(nn.Module):
    """Non-overlapping p×p patches -> tokens (DiT §3.2 "Patchify"): [B, C, H, W] -> [B, (H/p)·(W/p), dim],
    tokens in row-major order. A stride-p convolution is one linear map per patch."""

    def __init__(self, in_channels: int, dim: int, patch: int, bias: bool = True) -> None:
        super().__init__()
        self.patch = patch
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch, stride=patch, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, D, H/p, W/p] -> [B, N, D]
