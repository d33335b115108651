"""Diffusion Transformer (Peebles & Xie 2023, "Scalable Diffusion Models with Transformers").

patchify + fixed sin-cos positions -> `depth` DiT blocks conditioned by adaLN-Zero on c = embed(t) + embed(y)
-> adaLN final layer -> unpatchify (§3.2). Shapes in comments: B batch, C input channels, C' output
channels, H = W input size, p patch, g = H / p, N = g² tokens, D width.

Parameter names follow the reference implementation's, so its checkpoints map key for key
(`pos_embed` is recomputed here, not loaded).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from genforge.nn.attention import Attention, Mlp
from genforge.nn.embeddings import LabelEmbedder, PatchEmbed, TimestepEmbedder, sincos_pos_embed_2d

# The paper's model zoo (§3.2 "Model size", Table 1): depth, width, heads; each at patch 2, 4 and 8.
_ZOO = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}
DIT_SIZES: dict[str, dict[str, int]] = {
    f"{name}/{patch}": {"depth": depth, "hidden_size": width, "num_heads": heads, "patch_size": patch}
    for name, (depth, width, heads) in _ZOO.items()
    for patch in (2, 4, 8)
}


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """adaLN (§3.2): x·(1 + scale) + shift, one shift/scale per sample. x [B, N, D], shift/scale [B, D]."""
    return torch.addcmul(shift[:, None], x, 1 + scale[:, None])


class DiTBlock(nn.Module):
    """Pre-norm transformer block with adaLN-Zero (§3.2 "DiT block design"): from c it regresses a
    shift γ, scale β and residual gate α for the attention and the MLP branch. The regression is
    zero-initialised, so every α starts at 0 and the block starts as the identity."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        # x [B, N, D], c [B, D]
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.adaLN_modulation(c).chunk(6, dim=1)  # [B, D]
        x = torch.addcmul(x, gate_a[:, None], self.attn(modulate(self.norm1(x), shift_a, scale_a)))
        x = torch.addcmul(x, gate_m[:, None], self.mlp(modulate(self.norm2(x), shift_m, scale_m)))
        return x  # [B, N, D]


class FinalLayer(nn.Module):
    """Transformer decoder (§3.2): adaLN (shift, scale; no gate), then a linear map from each token to
    its p×p×C' patch. Zero-initialised, so the untrained model outputs exactly zero."""

    def __init__(self, dim: int, patch: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, patch * patch * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        # x [B, N, D], c [B, D]
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)  # [B, D] each
        return self.linear(modulate(self.norm_final(x), shift, scale))  # [B, N, p·p·C']


class DiT(nn.Module):
    """DiT over [B, C, H, W] pixels or latents.

    num_classes=0 makes it unconditional (no label embedder); otherwise labels 0..num_classes-1 plus the
    null class num_classes, to which training replaces a `class_dropout_prob` share of labels (CFG, §3.1).
    learn_sigma doubles the output channels: noise prediction and the variance interpolation (§3.1).
    """

    def __init__(
        self,
        input_size: int,
        patch_size: int,
        in_channels: int,
        hidden_size: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        num_classes: int = 0,
        class_dropout_prob: float = 0.1,
        learn_sigma: bool = True,
    ) -> None:
        super().__init__()
        if input_size % patch_size:
            raise ValueError(f"DiT input_size={input_size} is not divisible by patch_size={patch_size}")
        self.input_size = input_size
        self.patch_size = patch_size
        self.grid = input_size // patch_size
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.learn_sigma = learn_sigma
        self.num_classes = num_classes

        self.x_embedder = PatchEmbed(in_channels, hidden_size, patch_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob) if num_classes else None
        # fixed, not learned (§3.2); a buffer so .to(device) moves it, left out of checkpoints
        pos_embed = sincos_pos_embed_2d(hidden_size, self.grid, self.grid)[None]  # [1, N, D]
        self.register_buffer("pos_embed", pos_embed, persistent=False)
        self.blocks = nn.ModuleList(DiTBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth))
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """ViT initialisation plus adaLN-Zero (§3.2, §4 "Training"): xavier-uniform linears and patch
        projection (as the linear it is), N(0, 0.02) label table and timestep MLP, zero biases, and
        zero adaLN regressions and output layer."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        patch_w = self.x_embedder.proj.weight  # [D, C, p, p], initialised as the [D, C·p·p] linear it is
        nn.init.xavier_uniform_(patch_w.view(patch_w.shape[0], -1))
        nn.init.zeros_(self.x_embedder.proj.bias)
        if self.y_embedder is not None:
            nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        zeroed = [block.adaLN_modulation[-1] for block in self.blocks]
        zeroed += [self.final_layer.adaLN_modulation[-1], self.final_layer.linear]
        for layer in zeroed:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def unpatchify(self, x: Tensor) -> Tensor:
        """[B, N, p·p·C'] -> [B, C', H, W]; each token's channels are laid out (row in patch, column, C')."""
        b, p, g, c = x.shape[0], self.patch_size, self.grid, self.out_channels
        x = x.view(b, g, g, p, p, c).permute(0, 5, 1, 3, 2, 4)  # [B, C', g, p, g, p]
        return x.reshape(b, c, g * p, g * p)

    def forward(self, x: Tensor, t: Tensor, y: Tensor | None = None) -> Tensor:
        """x [B, C, H, W], t [B] (long or float), y [B] long labels -> [B, C', H, W].

        A class-conditional model given y=None predicts with the null class (unconditional branch);
        an unconditional model rejects labels.
        """
        if x.shape[-2:] != (self.input_size, self.input_size):
            raise ValueError(f"DiT built for {self.input_size}x{self.input_size} inputs, got {tuple(x.shape)}")
        tokens = self.x_embedder(x) + self.pos_embed  # [B, N, D]
        c = self.t_embedder(t)  # [B, D]
        if self.y_embedder is not None:
            if y is None:
                y = torch.full((x.shape[0],), self.y_embedder.null_id, dtype=torch.long, device=x.device)
            c = c + self.y_embedder(y)  # [B, D]
        elif y is not None:
            raise ValueError("this DiT is unconditional (num_classes=0) but was given labels y")
        for block in self.blocks:
            tokens = block(tokens, c)  # [B, N, D]
        return self.unpatchify(self.final_layer(tokens, c))  # [B, N, p·p·C'] -> [B, C', H, W]

