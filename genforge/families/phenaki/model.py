"""Phenaki's masked-token transformer (Villegas et al. 2022, §2.2): the shared bidirectional MaskTransformer
(genforge.masked.transformer) over a clip's flattened video ids, with factorised position embeddings so one model
takes any number of token frames (an image is one token frame; a longer clip more).

position(frame f, token j) = spatial[j] (learned, one per token of a frame) + W · sincos(f) (fixed sin-cos of the
token frame, through a learned linear map, so its scale starts at the embeddings' N(0, 0.02)).

`positions: rotary` adds relative positions where motion needs them: every self-attention turns its queries and keys
by a 3-D rotary embedding (RoPE, Su et al. 2021) of (token frame, row, column), so q·k depends on the offset between
two tokens, and a query whose content says "moving left" can pick "the token one to the right in the frame before"
at every place. Absolute positions alone cannot: a condition added to the query only shifts which absolute places it
prefers (docs/phenaki.md, "Why the clips stood still").

Shapes: B batch, t token frames, h·w tokens per frame, N = t·h·w, D width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from genforge.nn.embeddings import rotary_tables, sincos_pos_embed_1d
from genforge.masked.transformer import MaskTransformer


class VideoMaskTransformer(MaskTransformer):
    """A MaskTransformer whose `pos_embed` [1, h·w, D] covers one token frame; token frames are told apart by a
    projected 1-D sin-cos embedding of their index."""

    def __init__(self, codebook_size: int, tokens_per_frame: int, width: int, depth: int, num_heads: int,
                 mlp_ratio: float = 4.0, dropout: float = 0.0, text_dim: int = 0, num_classes: int = 0,
                 positions: str = "absolute", modulation: bool = False) -> None:
        super().__init__(codebook_size, tokens_per_frame, width, depth, num_heads, mlp_ratio, dropout, text_dim,
                         num_classes, modulation)
        self.tokens_per_frame = tokens_per_frame
        self.side = math.isqrt(tokens_per_frame)
        if positions == "rotary" and self.side**2 != tokens_per_frame:
            raise ValueError(f"positions=rotary needs a square token grid, got {tokens_per_frame} tokens a frame")
        self.positions = positions
        self.rotary_cache: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}  # (N, device) -> tables: not per call
        self.frame_proj = nn.Linear(width, width, bias=False)  # sin-cos of the token frame -> width
        self.initialize_weights()  # again, now that frame_proj exists

    def rotary(self, n: int) -> tuple[Tensor, Tensor] | None:
        """positions=rotary: (cos, sin) [N, d] of each token's (token frame, row, column), frame-major; else None."""
        if self.positions != "rotary":
            return None
        device = self.pos_embed.device
        key = (n, str(device))
        if key not in self.rotary_cache:
            index = torch.arange(n)
            frame, place = index // self.tokens_per_frame, index % self.tokens_per_frame
            grid = torch.stack([frame, place // self.side, place % self.side], dim=1)  # [N, 3]
            cos, sin = rotary_tables(grid, self.blocks[0].attn.head_dim)  # float64 maths on the CPU, once
            self.rotary_cache[key] = (cos.to(device), sin.to(device))
        return self.rotary_cache[key]

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """ids long [B, t·h·w] (frame-major) -> token + factorised position embeddings [B, N, D]."""
        b, n = ids.shape
        if n % self.tokens_per_frame:
            raise ValueError(f"{n} tokens are not whole frames of {self.tokens_per_frame} tokens")
        t = n // self.tokens_per_frame
        frames = self.frame_proj(sincos_pos_embed_1d(self.pos_embed.shape[-1], t).to(self.pos_embed))  # [t, D]
        pos = self.pos_embed[:, None] + frames[None, :, None]  # [1, t, h·w, D]
        return self.token_embed(ids) + pos.flatten(1, 2)  # [B, N, D]
