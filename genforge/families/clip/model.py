"""CLIP (Radford et al. 2021, "Learning Transferable Visual Models From Natural Language Supervision"): an image
encoder and a text encoder trained so that an image and its caption have the largest cosine similarity within a
batch (§2.3, Fig. 3).

Image tower: a ViT (Dosovitskiy et al. 2021) — patches + fixed 2-D sin-cos positions + a class token, pre-norm
blocks, LayerNorm, the class token projected to D. Text tower: a genforge text encoder's per-token states, mean-pooled
over the real tokens, projected to D. Shapes: B batch, N patches, L tokens, W width, D embedding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genforge.families.clip.config import ClipConfig
from genforge.nn.attention import PreNormBlock
from genforge.nn.embeddings import PatchEmbed, sincos_pos_embed_2d
from genforge.nn.frozen import held_on
from genforge.text.base import TextEncoder
from genforge.text.encoders import attach_text_encoder


class VisionTower(nn.Module):
    """[B, 3, S, S] in [-1, 1] -> [B, D] (not normalised)."""

    def __init__(self, image_size: int, patch: int, width: int, depth: int, heads: int, embed_dim: int) -> None:
        super().__init__()
        grid = image_size // patch
        self.patches = PatchEmbed(3, width, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.register_buffer("pos", sincos_pos_embed_2d(width, grid, grid)[None], persistent=False)  # [1, N, W]
        self.blocks = nn.ModuleList(PreNormBlock(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, embed_dim, bias=False)

    def forward(self, image: Tensor) -> Tensor:
        x = self.patches(image) + self.pos  # [B, N, W]
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1)  # [B, 1 + N, W]
        for block in self.blocks:
            x = block(x)
        return self.proj(self.norm(x[:, 0]))  # the class token: [B, D]


class ClipModel(nn.Module):
    """The two towers and the learned temperature; a TextTowerEmbedder (genforge.core.codec): `embed_images`,
    `embed_texts` give unit-norm [B, D] embeddings in the shared space."""

    has_text = True

    def __init__(self, cfg: ClipConfig, image_size: int, text_encoder: TextEncoder) -> None:
        super().__init__()
        self.image_size, self.embed_dim = image_size, cfg.embed_dim
        self.text_width = text_encoder.dim  # of `encode_texts`'s states
        self.visual = VisionTower(image_size, cfg.patch_size, cfg.width, cfg.depth, cfg.num_heads, cfg.embed_dim)
        attach_text_encoder(self, "text_encoder", text_encoder)  # tiny: trained here; frozen: outside the tree
        self.text_proj = nn.Linear(text_encoder.dim, cfg.embed_dim, bias=False)
        # log(1/τ), clipped at log(max) when used (CLIP §2.5: "clipped to prevent scaling the logits by more than 100")
        self.log_logit_scale = nn.Parameter(torch.tensor(math.log(1 / cfg.init_temperature)))
        self.log_max_logit_scale = cfg.log_max_logit_scale

    def logit_scale(self) -> Tensor:
        """exp(min(log scale, log max)): the inverse temperature of the similarity logits."""
        return self.log_logit_scale.clamp(max=self.log_max_logit_scale).exp()

    def embed_images(self, image: Tensor) -> Tensor:
        """image [B, 3, H, W] in [-1, 1] (resized to the tower's size when it differs) -> unit-norm [B, D]."""
        if image.shape[-1] != self.image_size or image.shape[-2] != self.image_size:
            image = F.interpolate(image, size=(self.image_size, self.image_size), mode="bilinear",
                                  align_corners=False, antialias=image.shape[-1] > self.image_size)
        return F.normalize(self.visual(image.to(self.visual.cls.dtype)), dim=-1)

    def encode_texts(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Captions -> the text tower's per-token states [B, L, W_t] and mask bool [B, L] (True = a real token): the
        text encodings DALL·E 2's prior attends to."""
        return self.text_encoder.encode_on(list(texts), self.text_proj.weight.device)

    def text_tower(self) -> TextEncoder:
        """The text encoder whose states `encode_texts` gives, on this model's device."""
        return held_on(self.text_encoder, self.text_proj.weight.device)

    def embed_encodings(self, states: Tensor, mask: Tensor) -> Tensor:
        """The text tower's states [B, L, W_t] and mask bool [B, L] (of `encode_texts`, or stored by `genforge
        encode`) -> unit-norm [B, D]: the states averaged over the real tokens, projected."""
        pooled = (states * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1)  # [B, W_t]
        return F.normalize(self.text_proj(pooled.to(self.text_proj.weight.dtype)), dim=-1)

    def embed_texts(self, texts: list[str]) -> Tensor:
        """Captions -> unit-norm [B, D] (`embed_encodings` of their states)."""
        return self.embed_encodings(*self.encode_texts(texts))
