"""C-ViViT: the causal video tokenizer of Phenaki (Villegas et al. 2022, "Phenaki: Variable Length Video Generation
from Open Domain Textual Descriptions", §2.1 and Fig. 2).

video [B, C, T, H, W], T = 1 + k·pt
  -> first frame in p×p patches, the rest in pt×p×p tubelets, each linearly embedded: tokens [B, t, h, w, D],
     t = 1 + (T − 1)/pt, h = H/p, w = W/p  (the first frame on its own, so an image is a 1-frame video)
  -> spatial transformer blocks (attention within each token frame) -> causal temporal transformer blocks
     (attention along t at each position, to the current and earlier token frames only)
  -> quantizer: ids [B, t, h, w]
  -> mirrored decoder (causal temporal blocks, spatial blocks) -> linear maps back to the first frame's patches
     and the tubelets -> video [B, C, T, H, W].
Optional (`model.stem_channels`, `model.head_channels`; 0, the paper's linear maps, by default): per-frame 3×3
convolutions at full resolution, whose features are cut into the patches beside the pixels, and whose correction is
added to the pixels put back, so a patch's embedding sees the pixels beside it and the output can mend edges across
patch borders (convolutional ends on the transformer, as MAGVIT's and ViT-VQGAN's tokenizers mix them). Per frame,
so time stays causal.
Causal attention in time makes the tokens of token frame i depend on the frames up to its tubelet only, so a clip
can be continued (Phenaki's variable length). Positions are fixed sin-cos tables (2-D in space, 1-D in time), so
any number of frames works.

Shapes: B batch, C channels, T frames, H = W side, p patch, pt temporal patch, D width.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

from genforge.families.cvivit.config import CViViTConfig
from genforge.nn.attention import PreNormBlock
from genforge.nn.embeddings import sincos_pos_embed_1d, sincos_pos_embed_2d
from genforge.nn.quantizers import Quantizing


class SpaceTimeTransformer(nn.Module):
    """`spatial_depth` blocks over the h·w tokens of each token frame, then `temporal_depth` causal blocks over the
    t token frames of each position (the encoder's order; the decoder runs them the other way round)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, spatial_depth: int, temporal_depth: int,
                 temporal_first: bool) -> None:
        super().__init__()
        self.spatial = nn.ModuleList(PreNormBlock(dim, heads, mlp_ratio) for _ in range(spatial_depth))
        self.temporal = nn.ModuleList(PreNormBlock(dim, heads, mlp_ratio, causal=True) for _ in range(temporal_depth))
        self.temporal_first = temporal_first
        self.norm = nn.LayerNorm(dim)

    def run_spatial(self, x: Tensor) -> Tensor:
        b, t, h, w, d = x.shape
        x = x.reshape(b * t, h * w, d) + sincos_pos_embed_2d(d, h, w).to(x)  # [B·t, h·w, D]
        for block in self.spatial:
            x = block(x)
        return x.view(b, t, h, w, d)

    def run_temporal(self, x: Tensor) -> Tensor:
        b, t, h, w, d = x.shape
        x = rearrange(x, "b t h w d -> (b h w) t d") + sincos_pos_embed_1d(d, t).to(x)  # [B·h·w, t, D]
        for block in self.temporal:  # causal (SDPA's is_causal): token frame i attends to token frames <= i
            x = block(x)
        return rearrange(x, "(b h w) t d -> b t h w d", b=b, h=h, w=w)

    def forward(self, x: Tensor) -> Tensor:
        """x [B, t, h, w, D] -> [B, t, h, w, D]."""
        if self.temporal_first:
            x = self.run_spatial(self.run_temporal(x))
        else:
            x = self.run_temporal(self.run_spatial(x))
        return self.norm(x)


def patch_embedding(patch_dim: int, dim: int, pixel_norm: bool) -> nn.Sequential:
    """Flattened patches [..., patch_dim] -> tokens [..., dim]. The optional LayerNorm over raw pixels (Dual
    PatchNorm, Kumar et al. 2023) suits classifiers; a tokenizer must keep each patch's brightness, which it removes
    (a flat grey patch normalises to zero whatever its level)."""
    return nn.Sequential(nn.LayerNorm(patch_dim) if pixel_norm else nn.Identity(), nn.Linear(patch_dim, dim),
                         nn.LayerNorm(dim))


class FrameConvs(nn.Module):
    """3×3 convolutions applied to every frame on its own (so a frame's output depends on that frame only):
    `in_channels` -> `hidden` -> ... -> `out_channels`, GELU between; [B, C, T, H, W] or [B, C, H, W]."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, depth: int = 2) -> None:
        super().__init__()
        widths = [in_channels] + [hidden] * (depth - 1) + [out_channels]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            layers += [nn.GELU()] if i else []
            layers.append(nn.Conv2d(a, b, 3, padding=1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 4:
            return self.net(x)
        b = x.shape[0]
        frames = self.net(rearrange(x, "b c t h w -> (b t) c h w"))  # [B·T, C', H, W]
        return rearrange(frames, "(b t) c h w -> b c t h w", b=b)


class CViViT(Quantizing):
    """TokenCodec for videos: encode = ids [B, t, h, w] of the quantized encoder tokens, decode = the decoder's video.
    Images [B, C, H, W] are taken as 1-frame videos and come back as images."""

    def __init__(self, cfg: CViViTConfig, channels: int) -> None:
        super().__init__()
        p, pt, dim = cfg.patch_size, cfg.temporal_patch_size, cfg.dim
        self.channels, self.patch, self.temporal_patch = channels, p, pt
        self.downsample, self.temporal_downsample = p, pt
        # ---- optional per-frame conv stem: the patches are cut from [pixels, conv features] ([C + stem_channels])
        self.stem = FrameConvs(channels, cfg.stem_channels, cfg.stem_channels) if cfg.stem_channels else None
        cin = channels + cfg.stem_channels
        # ---- patch embeddings: Linear -> LayerNorm (with cfg.pixel_norm a LayerNorm over the raw patch first)
        self.embed_first = patch_embedding(cin * p * p, dim, cfg.pixel_norm)
        self.embed_tubes = patch_embedding(cin * pt * p * p, dim, cfg.pixel_norm)
        blocks = dict(dim=dim, heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio, spatial_depth=cfg.spatial_depth,
                      temporal_depth=cfg.temporal_depth)
        self.encoder = SpaceTimeTransformer(**blocks, temporal_first=False)
        self.init_quantizer(cfg.quantizer, dim)  # .quantizer, and .pending for an EMA codebook
        self.decoder = SpaceTimeTransformer(**blocks, temporal_first=True)
        # ---- linear maps back to patches of [pixels, features] ([C + head_channels]); the optional per-frame conv
        # head adds its correction to the pixels (its last convolution starts at zero: at first the paper's output)
        self.out_channels = cout = channels + cfg.head_channels
        self.to_first = nn.Linear(dim, cout * p * p)
        self.to_tubes = nn.Linear(dim, cout * pt * p * p)
        self.head = None
        if cfg.head_channels:
            self.head = FrameConvs(cout, cfg.head_channels, channels, depth=3)
            nn.init.zeros_(self.head.net[-1].weight)
            nn.init.zeros_(self.head.net[-1].bias)

    # --------------------------------------------------------------------------------------- pieces
    def embed(self, video: Tensor) -> Tensor:
        """video [B, C, T, H, W] -> patch embeddings [B, t, h, w, D]: the first frame's p×p patches and the tubelets
        (with a conv stem: cut from the pixels and the stem's features)."""
        p, pt = self.patch, self.temporal_patch
        if self.stem is not None:
            video = torch.cat([video, self.stem(video)], dim=1)  # [B, C + stem_channels, T, H, W]
        first = rearrange(video[:, :, :1], "b c 1 (h p1) (w p2) -> b 1 h w (c p1 p2)", p1=p, p2=p)
        tokens = self.embed_first(first)  # [B, 1, h, w, D]
        if video.shape[2] > 1:
            tubes = rearrange(video[:, :, 1:], "b c (t pt) (h p1) (w p2) -> b t h w (c pt p1 p2)", pt=pt, p1=p, p2=p)
            tokens = torch.cat([tokens, self.embed_tubes(tubes)], dim=1)  # [B, t, h, w, D]
        return tokens

    def encode_latent(self, video: Tensor) -> Tensor:
        """video [B, C, T, H, W] (or an image [B, C, H, W]) -> z [B, D, t, h, w] (before quantization)."""
        if video.ndim == 4:
            video = video[:, :, None]
        if (video.shape[2] - 1) % self.temporal_patch:
            raise ValueError(f"C-ViViT with temporal patch {self.temporal_patch} needs 1 + k·{self.temporal_patch} "
                             f"frames, got {video.shape[2]}")
        return rearrange(self.encoder(self.embed(video)), "b t h w d -> b d t h w")

    def decode_latent(self, zq: Tensor, image: bool = False) -> Tensor:
        """zq [B, D, t, h, w] -> video [B, C, 1 + (t − 1)·pt, H, W] (with `image` and t = 1: [B, C, H, W])."""
        x = self.decoder(rearrange(zq, "b d t h w -> b t h w d"))  # [B, t, h, w, D]
        p, pt, c = self.patch, self.temporal_patch, self.out_channels
        video = rearrange(self.to_first(x[:, :1]), "b 1 h w (c p1 p2) -> b c 1 (h p1) (w p2)", c=c, p1=p, p2=p)
        if x.shape[1] > 1:
            tubes = rearrange(self.to_tubes(x[:, 1:]), "b t h w (c pt p1 p2) -> b c (t pt) (h p1) (w p2)", c=c,
                              pt=pt, p1=p, p2=p)
            video = torch.cat([video, tubes], dim=2)  # [B, C', T, H, W]
        if self.head is not None:
            video = video[:, : self.channels] + self.head(video)  # [B, C, T, H, W]
        return video[:, :, 0] if image and x.shape[1] == 1 else video

    def output_layer(self, image: bool) -> Tensor:
        """The weight every pixel of the output passes through last (taming's adaptive GAN weight is measured on
        it): the conv head's last convolution, else the first frame's map (images) or the tubelets' (clips)."""
        if self.head is not None:
            return self.head.net[-1].weight
        return self.to_first.weight if image else self.to_tubes.weight

    # ----------------------------------------------------------------------------------- TokenCodec
    def encode(self, video: Tensor) -> Tensor:
        """video [B, C, T, H, W] in [-1, 1] -> ids long [B, t, h, w] in [0, codebook_size) (an image: [B, 1, h, w])."""
        return self.quantize(self.encode_latent(video)).ids

    def decode(self, ids: Tensor) -> Tensor:
        """ids long [B, t, h, w] -> video [B, C, 1 + (t − 1)·pt, h·p, w·p]."""
        return self.decode_latent(self.codes(ids))
