"""Embeddings: sinusoidal timesteps, class labels with a null class, 2-D sin-cos positions, patches."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10_000.0) -> Tensor:
    """Sinusoidal embedding of (possibly fractional) timesteps [B] -> [B, dim] (Transformer / DDPM)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]  # [B, half]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return torch.nn.functional.pad(emb, (0, dim % 2))  # [B, dim]


class TimestepEmbedder(nn.Module):
    """Sinusoid -> MLP (SiLU), DiT §3.2."""

    def __init__(self, hidden: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_embedding(t, self.freq_dim))  # [B, hidden]


class LabelEmbedder(nn.Module):
    """Class-label table with one extra "null" class (index num_classes) for classifier-free guidance.

    Dropout to the null class is the caller's (the task draws it from the batch's reproducible rng);
    `drop` applies a given mask.
    """

    def __init__(self, num_classes: int, hidden: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.table = nn.Embedding(num_classes + 1, hidden)

    def drop(self, labels: Tensor, drop_mask: Tensor) -> Tensor:
        """Replace labels where `drop_mask` is True by the null class."""
        return torch.where(drop_mask, torch.full_like(labels, self.num_classes), labels)

    def forward(self, labels: Tensor) -> Tensor:
        return self.table(labels)  # [B, hidden]


def sincos_pos_embed_2d(dim: int, grid_h: int, grid_w: int) -> Tensor:
    """Fixed 2-D sin-cos position embedding [grid_h·grid_w, dim] (MAE / DiT): half the channels
    encode the row, half the column, each as sin/cos of the position at geometric frequencies."""
    if dim % 4:
        raise ValueError(f"sin-cos position embedding needs a width divisible by 4, got {dim}")
    quarter = dim // 4
    omega = 1.0 / 10_000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # [dim/4]
    rows, cols = torch.meshgrid(torch.arange(grid_h, dtype=torch.float64),
                                torch.arange(grid_w, dtype=torch.float64), indexing="ij")

    def encode(pos: Tensor) -> Tensor:  # [N] -> [N, dim/2]
        angles = pos.reshape(-1, 1) * omega[None]
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)

    return torch.cat([encode(cols), encode(rows)], dim=1).float()  # [N, dim]


class PatchEmbed(nn.Module):
    """Non-overlapping p×p patches -> tokens: [B, C, H, W] -> [B, (H/p)·(W/p), dim]."""

    def __init__(self, in_channels: int, dim: int, patch: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch, stride=patch)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)
