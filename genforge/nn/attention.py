"""Transformer building blocks shared by the transformer families (DiT, MaskGIT, Phenaki, ...)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class Attention(nn.Module):
    """Multi-head self-attention: one fused qkv projection and `scaled_dot_product_attention`
    (flash / memory-efficient kernels where the device has them)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"attention width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        b, n, d = x.shape  # [B, N, D]
        qkv = self.qkv(x).view(b, n, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, N, D/heads]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, heads, N, D/heads]
        return self.proj(out.transpose(1, 2).reshape(b, n, d))  # [B, N, D]


class Mlp(nn.Module):
    """Linear -> GELU (tanh approximation, as DiT/ViT use) -> Linear."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
