"""DALL·E 2's diffusion prior network (Ramesh et al. 2022, §2.2; DALLE2-pytorch's `DiffusionPriorNetwork`): "a
decoder-only Transformer with a causal attention mask on a sequence consisting of, in order: the encoded text, the
CLIP text embedding, an embedding for the diffusion timestep, the noised CLIP image embedding, and a final embedding
whose output from the Transformer is used to predict the unnoised CLIP image embedding."

Shapes: B batch, D the CLIP embedding width, W the transformer width, T the text encodings kept (max_text_tokens),
W_t the text encoder's width, N = T + 4 positions (T = 0 without text encodings).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from genforge.nn.attention import PreNormBlock
from genforge.nn.embeddings import TimestepEmbedder


class PriorNetwork(nn.Module):
    """x_t [B, D] (the noised √D-scaled image embedding), t [B], the caption's text embedding [B, D] and encodings
    [B, L, W_t] with mask [B, L], keep bool [B] (False: the null conditions, for guidance) -> x̂₀ [B, D]."""

    def __init__(self, embed_dim: int, width: int, depth: int, num_heads: int, text_dim: int = 0,
                 max_text_tokens: int = 32) -> None:
        super().__init__()
        self.text_tokens = max_text_tokens if text_dim else 0
        positions = self.text_tokens + 4  # [text encodings, text embedding, time, x_t, query]
        self.text_proj = nn.Linear(text_dim, width) if text_dim else None
        self.text_embed_in = nn.Linear(embed_dim, width)
        self.time_embed = TimestepEmbedder(width)
        self.x_in = nn.Linear(embed_dim, width)
        self.query = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        # learned null conditions (dropped rows) and padding (captions shorter than T tokens), DALLE2-pytorch's
        # null_text_embeds / null_text_encodings
        self.null_text_embed = nn.Parameter(torch.randn(1, width) * 0.02)
        self.null_text_tokens = nn.Parameter(torch.randn(1, max(self.text_tokens, 1), width) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, positions, width) * 0.02)
        # causal: position i attends to positions <= i (SDPA's is_causal, no materialised mask)
        self.blocks = nn.ModuleList(PreNormBlock(width, num_heads, causal=True) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, embed_dim)

    def text_encoding_tokens(self, text_tokens: Tensor, text_mask: Tensor, keep: Tensor) -> Tensor:
        """Encodings [B, L, W_t] -> T tokens [B, T, W]: the first T, projected; padding and dropped rows are the
        learned null tokens."""
        b, length = text_tokens.shape[:2]
        if length < self.text_tokens:  # pad to T: every caption has T positions
            text_tokens = torch.cat([text_tokens, text_tokens.new_zeros(b, self.text_tokens - length,
                                                                         text_tokens.shape[2])], dim=1)
            text_mask = torch.cat([text_mask, text_mask.new_zeros(b, self.text_tokens - length)], dim=1)
        tokens = self.text_proj(text_tokens[:, :self.text_tokens].to(self.query.dtype))  # [B, T, W]
        use = text_mask[:, :self.text_tokens] & keep[:, None]  # [B, T]
        return torch.where(use[..., None], tokens, self.null_text_tokens)

    def token_states(self, x: Tensor, t: Tensor, text_embed: Tensor, text_tokens: Tensor | None = None,
                     text_mask: Tensor | None = None, keep: Tensor | None = None) -> Tensor:
        """The transformer's output at every position [B, N, W] (before the final norm)."""
        b = x.shape[0]
        keep = torch.ones(b, dtype=torch.bool, device=x.device) if keep is None else keep.bool()
        embed = self.text_embed_in(text_embed.to(self.query.dtype))  # [B, W]
        embed = torch.where(keep[:, None], embed, self.null_text_embed)
        parts = []
        if self.text_proj is not None:
            parts.append(self.text_encoding_tokens(text_tokens, text_mask, keep))  # [B, T, W]
        parts += [embed[:, None], self.time_embed(t)[:, None], self.x_in(x.to(self.query.dtype))[:, None],
                  self.query.expand(b, -1, -1)]  # 4 × [B, 1, W]
        seq = torch.cat(parts, dim=1) + self.pos  # [B, N, W]
        for block in self.blocks:
            seq = block(seq)
        return seq

    def forward(self, x: Tensor, t: Tensor, text_embed: Tensor, text_tokens: Tensor | None = None,
                text_mask: Tensor | None = None, keep: Tensor | None = None) -> Tensor:
        states = self.token_states(x, t, text_embed, text_tokens, text_mask, keep)  # [B, N, W]
        return self.out(self.norm(states[:, -1]))  # the query's output: x̂₀ [B, D]
