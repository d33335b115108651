"""MUSE's base transformer (Chang et al. 2023, "Muse: Text-To-Image Generation via Masked Generative
Transformers", §2.2) over the token ids of a VQ tokenizer, as trained by MaskGIT (Chang et al. 2022); shared by the
token generators (maskgit over image ids, phenaki over video ids with its own position embeddings).

ids (+ [MASK]) -> token + learned position embeddings -> `depth` pre-norm blocks of self-attention,
cross-attention to the conditioning context, MLP -> LayerNorm -> logits over the codebook.
The context is a learned null token followed by the projected text embeddings (or one class embedding);
classifier-free guidance's unconditional branch sees the null token alone. With `modulation=True` the pooled context
(the mean of the condition's tokens, or the null token where the condition is dropped) also modulates every block's
three sub-layers (adaptive LayerNorm shift and scale, and a gate: DiT's adaLN, Peebles & Xie 2023, §3.2, whose
ablation found it better than cross-attention alone; SD3 feeds its pooled text vector the same way), its projection
zero-initialised, so the model starts as the plain one.

Shapes: B batch, N tokens, K codebook size, D width, L context tokens (null token included), E text width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from genforge.nn.attention import Attention, CrossAttention, Mlp


class MaskTransformerBlock(nn.Module):
    """Pre-norm block: x + SelfAttn(LN x), + CrossAttn(LN x, context), + MLP(LN x); with `modulation`, each sub-layer
    as x + (1 + gate)·f(LN(x)·(1 + scale) + shift), (shift, scale, gate) a zero-initialised linear map of the pooled
    condition (adaLN)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, dropout: float, modulation: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_attn = CrossAttention(dim, dim, num_heads)
        self.norm3 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.dropout = nn.Dropout(dropout)
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 9 * dim)) if modulation else None

    def forward(self, x: Tensor, context: Tensor, context_mask: Tensor,
                rotary: tuple[Tensor, Tensor] | None = None, keys: Tensor | None = None,
                pooled: Tensor | None = None) -> Tensor:
        # x [B, N, D], context [B, L, D], context_mask bool [B, L], rotary (cos, sin) [N, d] or None,
        # keys bool [B, 1, 1, N] (the tokens self-attention may attend to) or None: every token,
        # pooled [B, D] (the pooled condition; used with modulation)
        if self.modulation is None:
            x = x + self.dropout(self.attn(self.norm1(x), keys, rotary=rotary))
            x = x + self.dropout(self.cross_attn(self.norm2(x), context, context_mask))
            return x + self.dropout(self.mlp(self.norm3(x)))  # [B, N, D]
        s1, c1, g1, s2, c2, g2, s3, c3, g3 = self.modulation(pooled)[:, None].chunk(9, dim=-1)  # shift, scale, gate
        x = x + (1 + g1) * self.dropout(self.attn(self.norm1(x) * (1 + c1) + s1, keys, rotary=rotary))
        x = x + (1 + g2) * self.dropout(self.cross_attn(self.norm2(x) * (1 + c2) + s2, context, context_mask))
        return x + (1 + g3) * self.dropout(self.mlp(self.norm3(x) * (1 + c3) + s3))  # [B, N, D]


class MaskTransformer(nn.Module):
    """Bidirectional transformer predicting every token of an image from the unmasked ones and a context.

    text_dim > 0: the context is text embeddings [B, T, text_dim] projected to the width; num_classes > 0: one
    class embedding; neither: the null token only (unconditional). The task attaches its text encoder as
    `text_encoder` (a submodule when trainable, so it is optimised and averaged (EMA) with the transformer).
    """

    def __init__(self, codebook_size: int, seq_len: int, width: int, depth: int, num_heads: int,
                 mlp_ratio: float = 4.0, dropout: float = 0.0, text_dim: int = 0, num_classes: int = 0,
                 modulation: bool = False) -> None:
        super().__init__()
        if text_dim and num_classes:
            raise ValueError("a mask transformer is conditioned on text or on classes, not both")
        self.codebook_size, self.seq_len, self.mask_id = codebook_size, seq_len, codebook_size
        self.token_embed = nn.Embedding(codebook_size + 1, width)  # + [MASK]
        self.pos_embed = nn.Parameter(torch.zeros(1, seq_len, width))  # learned [1, N, D]
        self.null_context = nn.Parameter(torch.zeros(1, 1, width))  # always attended to: the unconditional context
        self.text_proj = nn.Sequential(nn.LayerNorm(text_dim), nn.Linear(text_dim, width)) if text_dim else None
        self.class_embed = nn.Embedding(num_classes, width) if num_classes else None
        self.embed_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(MaskTransformerBlock(width, num_heads, mlp_ratio, dropout, modulation)
                                    for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, codebook_size)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """BERT / MaskGIT initialisation: N(0, 0.02) linears, embeddings and positions; zero biases."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.null_context, std=0.02)
        for block in self.blocks:
            if block.modulation is not None:  # zero-initialised modulation: the model starts as the plain one
                nn.init.zeros_(block.modulation[-1].weight)
                nn.init.zeros_(block.modulation[-1].bias)

    def context(self, drop: Tensor, text_embed: Tensor | None = None, text_mask: Tensor | None = None,
                labels: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Context [B, L, D] and its mask bool [B, L]: the null token, then the condition unless `drop` [B] (bool:
        classifier-free guidance's unconditional rows, which see the null token alone)."""
        b = drop.shape[0]
        null = self.null_context.expand(b, 1, -1)  # [B, 1, D]
        keep_null = torch.ones(b, 1, dtype=torch.bool, device=drop.device)
        if self.text_proj is not None:
            tokens = self.text_proj(text_embed.to(null.dtype))  # [B, T, D]
            mask = text_mask.bool() & ~drop[:, None]  # [B, T]
        elif self.class_embed is not None:
            tokens = self.class_embed(labels)[:, None]  # [B, 1, D]
            mask = ~drop[:, None]
        else:
            return null, keep_null
        return torch.cat([null, tokens], dim=1), torch.cat([keep_null, mask], dim=1)

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """ids long [B, N] in [0, K] -> token + position embeddings [B, N, D] (learned positions, one per token)."""
        if ids.shape[1] != self.seq_len:
            raise ValueError(f"the mask transformer was built for {self.seq_len} tokens, got {tuple(ids.shape)}")
        return self.token_embed(ids) + self.pos_embed

    def rotary(self, n: int) -> tuple[Tensor, Tensor] | None:
        """The self-attention's rotary tables (cos, sin) [N, d] for N tokens, or None: positions are absolute only
        (a subclass may add relative ones)."""
        return None

    def hidden(self, ids: Tensor, context: Tensor, context_mask: Tensor, real: Tensor | None = None) -> Tensor:
        """ids long [B, N] in [0, K] (K = [MASK]) -> final hidden states [B, N, D] (before the head).

        `real` bool [B, N] (None: every token): the tokens self-attention attends to; the others (padding) are
        removed from it as keys (phenaki-pytorch's `video_mask`), so nothing of them reaches a real token's
        output. A row without real tokens attends to all of them (its outputs are never used)."""
        x = self.embed_dropout(self.embed_tokens(ids))  # [B, N, D]
        rotary = self.rotary(ids.shape[1])
        keys = None
        if real is not None:
            keys = (real | ~real.any(1, keepdim=True))[:, None, None, :]  # [B, 1, 1, N]
        pooled = pooled_context(context, context_mask) if self.blocks[0].modulation is not None else None
        for block in self.blocks:
            x = block(x, context, context_mask, rotary, keys, pooled)
        return self.norm(x)  # [B, N, D]

    def forward(self, ids: Tensor, context: Tensor, context_mask: Tensor, real: Tensor | None = None) -> Tensor:
        """ids [B, N] -> logits [B, N, K]; `real` as in `hidden`."""
        return self.head(self.hidden(ids, context, context_mask, real))


def pooled_context(context: Tensor, context_mask: Tensor) -> Tensor:
    """The condition as one vector [B, D]: the mean of the attended context tokens after the null token (the
    sentence embedding of mean pooling, as MiniLM's sentence-transformers pool; a class's one embedding), or the null
    token itself where the condition is dropped (classifier-free guidance's unconditional rows)."""
    keep = context_mask[:, 1:, None].to(context.dtype)  # [B, L-1, 1]
    count = keep.sum(1)  # [B, 1]
    mean = (context[:, 1:] * keep).sum(1) / count.clamp(min=1)  # [B, D]
    return torch.where(count > 0, mean, context[:, 0])
