"""Transformer building blocks shared by the transformer families (DiT, MaskGIT, Phenaki, ...).

Shapes: B batch, N tokens, D width, h heads, d = D / h head width.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from genforge.nn.embeddings import apply_rotary


class Attention(nn.Module):
    """Multi-head self-attention (the ViT block that DiT keeps, Peebles & Xie 2023 §3.2): one fused qkv
    projection, `scaled_dot_product_attention` (flash / memory-efficient kernels where the device has
    them), output projection. `causal`: token i attends to tokens <= i through SDPA's `is_causal`, with no
    [N, N] mask built (a materialised mask rules the flash kernels out)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, proj_bias: bool = True,
                 causal: bool = False) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"attention width {dim} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.causal = causal
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def forward(self, x: Tensor, mask: Tensor | None = None, rotary: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """x [B, N, D] -> [B, N, D].

        `mask` goes to SDPA unchanged: broadcastable to [B, h, N, N]; bool (True = may attend) or
        float (added to the logits). For key padding pass `keep[:, None, None, :]`. A causal Attention takes
        no mask. `rotary`: (cos, sin) [N, d] of `rotary_tables`, applied to queries and keys (RoPE).
        """
        if self.causal and mask is not None:
            raise ValueError("a causal Attention takes no mask (SDPA's is_causal); build it with causal=False "
                             "and pass the combined mask instead")
        b, n, dim = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim)  # [B, N, 3, h, d]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, h, N, d]
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        # softmax(q kᵀ / √d) v, keys masked by `mask` or, causal, keys after the query: [B, h, N, d]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(b, n, dim))  # [B, N, D]


class CrossAttention(nn.Module):
    """Multi-head attention from x to a context (MUSE's cross-attention to text embeddings, Chang et al. 2023
    §2.2): queries from x [B, N, D], keys and values from context [B, L, D_ctx], through SDPA."""

    def __init__(self, dim: int, context_dim: int, num_heads: int, bias: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"attention width {dim} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim, bias=bias)
        self.kv = nn.Linear(context_dim, 2 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: Tensor, context: Tensor, context_mask: Tensor | None = None) -> Tensor:
        """x [B, N, D], context [B, L, D_ctx], context_mask bool [B, L] (True = attend; every row needs one)
        -> [B, N, D]."""
        b, n, dim = x.shape
        q = self.q(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # [B, h, N, d]
        kv = self.kv(context).view(b, context.shape[1], 2, self.num_heads, self.head_dim)  # [B, L, 2, h, d]
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, h, L, d]
        mask = None if context_mask is None else context_mask[:, None, None, :]  # [B, 1, 1, L]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, h, N, d]
        return self.proj(out.transpose(1, 2).reshape(b, n, dim))  # [B, N, D]


class Mlp(nn.Module):
    """Transformer feed-forward: Linear -> GELU (tanh approximation, as ViT / DiT) -> Linear."""

    def __init__(self, dim: int, hidden_dim: int, out_dim: int | None = None, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.fc2 = nn.Linear(hidden_dim, dim if out_dim is None else out_dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., dim] -> [..., out_dim]."""
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class PreNormBlock(nn.Module):
    """Pre-norm transformer encoder block: x + Attn(LN(x)), then x + MLP(LN(x)) (Xiong et al. 2020; the ViT and
    CLIP towers, the tiny text encoder); `causal` makes its attention causal (C-ViViT's temporal blocks)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, causal: bool = False) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal=causal)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: Tensor, keep: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """x [B, L, D], keep bool [B, L] (True = a real token, attended to; None: every token) -> [B, L, D];
        or `mask` bool [L, L] (True = may attend); a causal block takes neither."""
        if keep is not None:
            mask = keep[:, None, None, :]  # key padding [B, 1, 1, L]
        x = x + self.attn(self.norm1(x), mask)
        return x + self.mlp(self.norm2(x))
