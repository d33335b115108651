"""Diffusion Transformer (Peebles & Xie 2023, "Scalable Diffusion Models with Transformers").

Patchify -> N DiT blocks conditioned by adaLN-Zero on c = embed(t) + embed(y) -> adaLN final layer ->
unpatchify. Reads top to bottom; shapes in comments (B batch, C channels, H=W input size, p patch,
N = (H/p)² tokens, D width).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from genforge.nn.attention import Attention, Mlp
from genforge.nn.embeddings import LabelEmbedder, PatchEmbed, TimestepEmbedder, sincos_pos_embed_2d

# The paper's model zoo (Table 1): depth, width, heads; each at patch size 2, 4 and 8.
_WIDTHS = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}
DIT_SIZES: dict[str, dict[str, int]] = {
    f"{name}/{patch}": {"depth": d, "hidden_size": w, "num_heads": h, "patch_size": patch}
    for name, (d, w, h) in _WIDTHS.items()
    for patch in (2, 4, 8)
}


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """adaLN: x·(1 + scale) + shift, per sample. x [B, N, D], shift/scale [B, D]."""
    return x * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    """Transformer block with adaLN-Zero (DiT §3.2): shift, scale and a residual gate for the
    attention and the MLP branch, regressed from c; zero-initialised so the block starts as identity."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        # x [B, N, D], c [B, D]
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_a[:, None] * self.attn(modulate(self.norm1(x), shift_a, scale_a))
        x = x + gate_m[:, None] * self.mlp(modulate(self.norm2(x), shift_m, scale_m))
        return x


class FinalLayer(nn.Module):
    """adaLN (shift, scale) then a linear map from each token to its p×p×C_out patch."""

    def __init__(self, dim: int, patch: int, out_channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, patch * patch * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm(x), shift, scale))  # [B, N, p·p·C_out]


class DiT(nn.Module):
    """DiT over a [B, C, H, W] input (pixels or latents); num_classes=0 makes it unconditional."""

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
        learn_sigma: bool = True,
    ) -> None:
        super().__init__()
        if input_size % patch_size:
            raise ValueError(f"DiT input size {input_size} is not divisible by patch size {patch_size}")
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.patch_size = patch_size
        self.grid = input_size // patch_size
        self.num_classes = num_classes

        self.x_embedder = PatchEmbed(in_channels, hidden_size, patch_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size) if num_classes else None
        # fixed, not learned (DiT §3.2); a buffer so .to(device) moves it, not saved in checkpoints
        self.register_buffer("pos_embed", sincos_pos_embed_2d(hidden_size, self.grid, self.grid)[None],
                             persistent=False)  # [1, N, D]
        self.blocks = nn.ModuleList(DiTBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth))
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """DiT's initialisation: xavier-uniform linears, patch conv as a linear, N(0, 0.02) embedding
        tables and timestep MLP, and adaLN-Zero (modulations and the output layer start at zero)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        w = self.x_embedder.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.x_embedder.proj.bias)
        if self.y_embedder is not None:
            nn.init.normal_(self.y_embedder.table.weight, std=0.02)
        for layer in (self.t_embedder.mlp[0], self.t_embedder.mlp[2]):
            nn.init.normal_(layer.weight, std=0.02)
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for layer in (self.final_layer.adaLN_modulation[-1], self.final_layer.linear):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def unpatchify(self, x: Tensor) -> Tensor:
        """[B, N, p·p·C] -> [B, C, H, W]."""
        b, p, g, c = x.shape[0], self.patch_size, self.grid, self.out_channels
        x = x.view(b, g, g, p, p, c)
        return x.permute(0, 5, 1, 3, 2, 4).reshape(b, c, g * p, g * p)

    def forward(self, x: Tensor, t: Tensor, y: Tensor | None = None) -> Tensor:
        # x [B, C, H, W], t [B] timesteps, y [B] labels (num_classes = null) or None
        tokens = self.x_embedder(x) + self.pos_embed  # [B, N, D]
        c = self.t_embedder(t)  # [B, D]
        if self.y_embedder is not None:
            if y is None:
                y = torch.full((x.shape[0],), self.num_classes, dtype=torch.long, device=x.device)
            c = c + self.y_embedder(y)
        for block in self.blocks:
            tokens = block(tokens, c)  # [B, N, D]
        return self.unpatchify(self.final_layer(tokens, c))  # [B, C_out, H, W]


def dit_from_size(name: str, **kwargs) -> DiT:
    """A DiT of the paper's zoo by name ("S/2", ..., "XL/8"); kwargs give input_size, in_channels, ..."""
    if name not in DIT_SIZES:
        raise ValueError(f"unknown DiT size {name!r}; allowed: {', '.join(DIT_SIZES)}")
    return DiT(**{**DIT_SIZES[name], **kwargs})
