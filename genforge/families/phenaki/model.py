"""Phenaki's masked-token transformer (Villegas et al. 2022, §2.2): the shared bidirectional MaskTransformer
(genforge.masked.transformer) over a clip's flattened video ids, with factorised position embeddings so one model
takes any number of token frames (an image is one token frame; a longer clip more).

position(frame f, token j) = spatial[j] (learned, one per token of a frame) + W · sincos(f) (fixed sin-cos of the
token frame, through a learned linear map, so its scale starts at the embeddings' N(0, 0.02)). `position_init`
sincos starts spatial[j] as the 2-D sin-cos of token j's (column, row), scaled to std 0.02, instead of N(0, 0.02): a
neighbour's position then starts similar and a shift (motion) is a linear map of it, which random positions must
first learn (docs/phenaki.md, "Why the clips stood still").

Shapes: B batch, t token frames, h·w tokens per frame, N = t·h·w, D width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from genforge.nn.embeddings import sincos_pos_embed_1d, sincos_pos_embed_2d
from genforge.masked.transformer import MaskTransformer


class VideoMaskTransformer(MaskTransformer):
    """A MaskTransformer whose `pos_embed` [1, h·w, D] covers one token frame; token frames are told apart by a
    projected 1-D sin-cos embedding of their index."""

    def __init__(self, codebook_size: int, tokens_per_frame: int, width: int, depth: int, num_heads: int,
                 mlp_ratio: float = 4.0, dropout: float = 0.0, text_dim: int = 0, num_classes: int = 0,
                 position_init: str = "normal") -> None:
        super().__init__(codebook_size, tokens_per_frame, width, depth, num_heads, mlp_ratio, dropout, text_dim,
                         num_classes)
        self.tokens_per_frame, self.position_init = tokens_per_frame, position_init
        self.frame_proj = nn.Linear(width, width, bias=False)  # sin-cos of the token frame -> width
        self.initialize_weights()  # again, now that frame_proj exists

    def initialize_weights(self) -> None:
        """MaskTransformer's initialisation; with position_init=sincos, the spatial positions [1, h·w, D] from the 2-D
        sin-cos of the (square) token grid, scaled to std 0.02."""
        super().initialize_weights()
        if getattr(self, "position_init", "normal") == "sincos":
            side = math.isqrt(self.tokens_per_frame)
            if side * side != self.tokens_per_frame:
                raise ValueError(f"position_init=sincos needs a square token grid, got {self.tokens_per_frame} tokens")
            grid = sincos_pos_embed_2d(self.pos_embed.shape[-1], side, side)  # [h·w, D]
            with torch.no_grad():
                self.pos_embed.copy_(grid[None] * (0.02 / grid.std()))

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """ids long [B, t·h·w] (frame-major) -> token + factorised position embeddings [B, N, D]."""
        b, n = ids.shape
        if n % self.tokens_per_frame:
            raise ValueError(f"{n} tokens are not whole frames of {self.tokens_per_frame} tokens")
        t = n // self.tokens_per_frame
        frames = self.frame_proj(sincos_pos_embed_1d(self.pos_embed.shape[-1], t).to(self.pos_embed))  # [t, D]
        pos = self.pos_embed[:, None] + frames[None, :, None]  # [1, t, h·w, D]
        return self.token_embed(ids) + pos.flatten(1, 2)  # [B, N, D]
