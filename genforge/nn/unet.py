"""The diffusion U-Net of ADM / GLIDE / the DALL·E 2 decoder, for any family that denoises images.

Dhariwal & Nichol 2021 ("Diffusion Models Beat GANs", §3 "Architecture improvements"): residual blocks with
adaptive group normalisation (the timestep embedding predicts a scale and shift of each block's second norm,
"AdaGN"), BigGAN-style up/down-sampling, attention at chosen resolutions with several heads, skip connections
from every down block to its mirror. Nichol et al. 2022 (GLIDE, §2.3 / App. A) let each attention layer also attend
to a conditioning sequence by concatenating its projected keys and values to the image's. Ramesh et al. 2022
(DALL·E 2, §2.1 "Decoder") add the CLIP image embedding to the timestep embedding and project it to four extra
context tokens; its upsamplers take the low-resolution image as extra input channels (the SR3 / Imagen way), and the
level of the noise augmentation applied to that image (Ho et al. 2022, "Cascaded Diffusion Models", §4.2) is
embedded like the timestep.

Shapes in comments: B batch, C in channels, H = W side, c channels of a level, E = 4·dim embedding width,
L context tokens, D_ctx context width, D_img image-embedding width, D_txt text-embedding width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from genforge.core.config import StrictModel
from genforge.nn.embeddings import timestep_embedding


def group_norm(channels: int, groups: int = 32) -> nn.GroupNorm:
    """GroupNorm with `groups` groups, fewer when `channels` is not divisible (small test models)."""
    return nn.GroupNorm(math.gcd(channels, groups), channels, eps=1e-6)


def zero_module(module: nn.Module) -> nn.Module:
    """Zero a layer's parameters: the residual branch it ends starts as the identity (ADM's zero_module)."""
    for p in module.parameters():
        nn.init.zeros_(p)
    return module


class ResBlock(nn.Module):
    """ADM residual block (Dhariwal & Nichol 2021, §3): GroupNorm -> SiLU -> [resample] -> conv3×3, then
    GroupNorm(h)·(1 + scale) + shift with (scale, shift) from the embedding (AdaGN, eq. in §3), SiLU, dropout, a
    zero-initialised conv3×3, plus the (resampled, 1×1-projected where the width changes) input."""

    def __init__(self, in_ch: int, out_ch: int, emb_dim: int, dropout: float = 0.0,
                 resample: str | None = None) -> None:
        super().__init__()
        self.resample = resample  # None, "down" (avg-pool 2) or "up" (nearest 2×): BigGAN-style (§3)
        self.in_layers = nn.Sequential(group_norm(in_ch), nn.SiLU())
        self.in_conv = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_dim, 2 * out_ch))
        self.out_norm = group_norm(out_ch)
        self.out_layers = nn.Sequential(nn.SiLU(), nn.Dropout(dropout),
                                        zero_module(nn.Conv2d(out_ch, out_ch, 3, padding=1)))
        self.skip = nn.Identity() if in_ch == out_ch else nn.Conv2d(in_ch, out_ch, 1)

    def _resample(self, x: Tensor) -> Tensor:
        if self.resample == "down":
            return F.avg_pool2d(x, 2)
        if self.resample == "up":
            return F.interpolate(x, scale_factor=2, mode="nearest")
        return x

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        # x [B, c_in, H, W], emb [B, E]
        h = self.in_conv(self._resample(self.in_layers(x)))  # [B, c_out, H', W']
        scale, shift = self.emb_layers(emb)[:, :, None, None].chunk(2, dim=1)  # [B, c_out, 1, 1] each
        h = torch.addcmul(shift, self.out_norm(h), 1 + scale)  # AdaGN
        return self.skip(self._resample(x)) + self.out_layers(h)  # [B, c_out, H', W']


class AttentionBlock(nn.Module):
    """Multi-head self-attention over the H·W positions; with a context, its projected keys and values are put in
    front of the image's, so one attention reads both (GLIDE's encoder_kv, App. A). SDPA kernel; zero-initialised
    output projection, so the block starts as the identity."""

    def __init__(self, channels: int, head_dim: int, context_dim: int | None = None) -> None:
        super().__init__()
        self.heads = max(1, channels // head_dim)
        if channels % self.heads:
            raise ValueError(f"U-Net attention width {channels} is not divisible into {self.heads} heads")
        self.norm = group_norm(channels)
        self.qkv = nn.Conv1d(channels, 3 * channels, 1)
        self.context_kv = nn.Linear(context_dim, 2 * channels) if context_dim else None
        self.proj = zero_module(nn.Conv1d(channels, channels, 1))

    def forward(self, x: Tensor, context: Tensor | None = None, context_mask: Tensor | None = None) -> Tensor:
        # x [B, c, H, W], context [B, L, D_ctx], context_mask bool [B, L] (True = attend)
        b, c, hgt, wid = x.shape
        d = c // self.heads
        q, k, v = self.qkv(self.norm(x).view(b, c, hgt * wid)).view(b, 3, self.heads, d, hgt * wid).unbind(1)
        q, k, v = (t.transpose(-1, -2) for t in (q, k, v))  # [B, heads, N, d], N = H·W
        mask = None
        if context is not None and self.context_kv is not None:
            ck, cv = self.context_kv(context).view(b, -1, 2, self.heads, d).permute(2, 0, 3, 1, 4)  # [B, h, L, d]
            k, v = torch.cat([ck.to(k.dtype), k], dim=2), torch.cat([cv.to(v.dtype), v], dim=2)  # [B, h, L+N, d]
            if context_mask is not None:
                keep = torch.cat([context_mask, context_mask.new_ones(b, hgt * wid)], dim=1)  # [B, L+N]
                mask = keep[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, heads, N, d]
        return x + self.proj(out.transpose(-1, -2).reshape(b, c, hgt * wid)).view(b, c, hgt, wid)


class UNet(nn.Module):
    """ADM/GLIDE U-Net for ε/x₀/v prediction: [B, C, H, W] (+ conditions) -> [B, C_out, H, W].

    dim: width of the first level; dim_mults: width multiplier of each level (H halves from one level to the next);
    num_res_blocks: residual blocks per level on the way down (one more on the way up, ADM); attention_levels:
    indices of the levels with attention; mid_attention: attention in the middle block between its two residual
    blocks (ADM's; DALL·E 2's upsamplers have none: only convolutions); head_dim: channels per attention head.
    Conditioning (each optional): image_embed_dim (DALL·E 2: added to the timestep embedding and projected to
    `image_context_tokens` context tokens), text_dim (text encodings [B, L, D_txt] as context), num_classes (a label
    embedding added to the timestep embedding), lowres (the upsampler's low-resolution image as C extra input
    channels, with its noise-augmentation level embedded). Null conditions for classifier-free guidance are learned:
    `image_keep` / `text_keep` / label `num_classes` select them. A U-Net built without a condition has no layers
    for it, and its forward refuses it (an unconditional upsampler takes no image embedding).
    """

    def __init__(self, in_channels: int = 3, out_channels: int = 3, dim: int = 64,
                 dim_mults: tuple[int, ...] = (1, 2, 4), num_res_blocks: int = 2,
                 attention_levels: tuple[int, ...] = (1, 2), head_dim: int = 32, dropout: float = 0.0,
                 mid_attention: bool = True, image_embed_dim: int = 0, image_context_tokens: int = 4,
                 text_dim: int = 0, num_classes: int = 0, lowres: bool = False) -> None:
        super().__init__()
        if any(not 0 <= level < len(dim_mults) for level in attention_levels):
            raise ValueError(f"attention_levels={list(attention_levels)} must index dim_mults (0..{len(dim_mults) - 1})")
        self.in_channels, self.out_channels, self.lowres = in_channels, out_channels, lowres
        self.downsample = 2 ** (len(dim_mults) - 1)  # H must be divisible by it
        emb_dim = 4 * dim
        context_dim = emb_dim if (image_embed_dim or text_dim) else None

        # ---- conditioning -> timestep-like embedding [B, E] and context tokens [B, L, D_ctx]
        self.time_embed = nn.Sequential(nn.Linear(dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.lowres_noise_embed = (nn.Sequential(nn.Linear(dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
                                   if lowres else None)
        self.label_embed = nn.Embedding(num_classes + 1, emb_dim) if num_classes else None  # + the null class
        self.null_label = num_classes
        self.image_embed_dim, self.image_context_tokens = image_embed_dim, image_context_tokens
        if image_embed_dim:
            self.null_image_embed = nn.Parameter(torch.randn(image_embed_dim) / math.sqrt(image_embed_dim))
            self.image_to_emb = nn.Linear(image_embed_dim, emb_dim)
            self.image_to_tokens = nn.Linear(image_embed_dim, image_context_tokens * context_dim)
        self.text_dim = text_dim
        if text_dim:
            self.null_text = nn.Parameter(torch.randn(text_dim) / math.sqrt(text_dim))  # one null token
            self.text_to_context = nn.Linear(text_dim, context_dim)
        self.context_norm = nn.LayerNorm(context_dim) if context_dim else None

        # ---- down path: skips record every output's width
        self.input_conv = nn.Conv2d(in_channels * (2 if lowres else 1), dim, 3, padding=1)
        self.down = nn.ModuleList()
        skips, ch = [dim], dim
        for level, mult in enumerate(dim_mults):
            for _ in range(num_res_blocks):
                self.down.append(self._level_block(ch, dim * mult, emb_dim, dropout, level in attention_levels,
                                                   head_dim, context_dim))
                ch = dim * mult
                skips.append(ch)
            if level < len(dim_mults) - 1:
                self.down.append(nn.ModuleList([ResBlock(ch, ch, emb_dim, dropout, resample="down")]))
                skips.append(ch)
        middle_attention = [AttentionBlock(ch, head_dim, context_dim)] if mid_attention else []
        self.middle = nn.ModuleList([ResBlock(ch, ch, emb_dim, dropout), *middle_attention,
                                     ResBlock(ch, ch, emb_dim, dropout)])
        # ---- up path: each block takes the matching skip
        self.up = nn.ModuleList()
        for level, mult in reversed(list(enumerate(dim_mults))):
            for i in range(num_res_blocks + 1):
                block = self._level_block(ch + skips.pop(), dim * mult, emb_dim, dropout, level in attention_levels,
                                          head_dim, context_dim)
                ch = dim * mult
                if level > 0 and i == num_res_blocks:
                    block.append(ResBlock(ch, ch, emb_dim, dropout, resample="up"))
                self.up.append(block)
        self.out = nn.Sequential(group_norm(ch), nn.SiLU(), zero_module(nn.Conv2d(ch, out_channels, 3, padding=1)))
        self.dim = dim

    @staticmethod
    def _level_block(in_ch: int, out_ch: int, emb_dim: int, dropout: float, attention: bool, head_dim: int,
                     context_dim: int | None) -> nn.ModuleList:
        layers: list[nn.Module] = [ResBlock(in_ch, out_ch, emb_dim, dropout)]
        if attention:
            layers.append(AttentionBlock(out_ch, head_dim, context_dim))
        return nn.ModuleList(layers)

    # ------------------------------------------------------------------------------------------ conditioning
    def _conditioning(self, t: Tensor, image_embed: Tensor | None, image_keep: Tensor | None,
                      text_embed: Tensor | None, text_mask: Tensor | None, text_keep: Tensor | None, y: Tensor | None,
                      lowres_noise_level: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The embedding [B, E] every ResBlock is modulated by, and the context [B, L, D_ctx] + mask [B, L]."""
        b = t.shape[0]
        emb = self.time_embed(timestep_embedding(t, self.dim).to(self.time_embed[0].weight.dtype))  # [B, E]
        if self.lowres_noise_embed is not None:
            level = lowres_noise_level if lowres_noise_level is not None else torch.zeros_like(t)
            emb = emb + self.lowres_noise_embed(timestep_embedding(level, self.dim).to(emb.dtype))
        if self.label_embed is not None:
            y = y if y is not None else torch.full((b,), self.null_label, dtype=torch.long, device=t.device)
            emb = emb + self.label_embed(y)
        tokens, masks = [], []
        if self.image_embed_dim:
            image = self.null_image_embed.expand(b, -1) if image_embed is None else image_embed
            if image_keep is not None:  # classifier-free guidance: the learned null embedding where dropped
                image = torch.where(image_keep[:, None].bool(), image.to(self.null_image_embed.dtype),
                                    self.null_image_embed)
            emb = emb + self.image_to_emb(image)  # DALL·E 2 §2.1: added to the timestep embedding
            tokens.append(self.image_to_tokens(image).view(b, self.image_context_tokens, -1))  # [B, 4, D_ctx]
            masks.append(torch.ones(b, self.image_context_tokens, dtype=torch.bool, device=t.device))
        if self.text_dim:
            null = self.null_text.view(1, 1, -1).expand(b, 1, -1)  # [B, 1, D_txt]: always attendable
            if text_embed is None:
                text, mask = null, torch.ones(b, 1, dtype=torch.bool, device=t.device)
            else:
                text = torch.cat([null, text_embed.to(null.dtype)], dim=1)  # [B, 1 + L, D_txt]
                mask = text_mask.bool() if text_mask is not None else torch.ones(text_embed.shape[:2], dtype=torch.bool,
                                                                                 device=t.device)
                mask = torch.cat([torch.ones(b, 1, dtype=torch.bool, device=t.device), mask], dim=1)
                if text_keep is not None:  # dropped captions: only the null token
                    mask = mask & torch.cat([mask.new_ones(b, 1), text_keep[:, None].bool().expand(-1, mask.shape[1] - 1)],
                                            dim=1)
            tokens.append(self.text_to_context(text))  # [B, 1 + L, D_ctx]
            masks.append(mask)
        if not tokens:
            return emb, None, None
        return emb, self.context_norm(torch.cat(tokens, dim=1)), torch.cat(masks, dim=1)

    # ---------------------------------------------------------------------------------------------- forward
    def forward(self, x: Tensor, t: Tensor, *, image_embed: Tensor | None = None, image_keep: Tensor | None = None,
                text_embed: Tensor | None = None, text_mask: Tensor | None = None, text_keep: Tensor | None = None,
                y: Tensor | None = None, lowres: Tensor | None = None,
                lowres_noise_level: Tensor | None = None) -> Tensor:
        """x [B, C, H, W] (noisy), t [B] (timestep, float or long) -> [B, C_out, H, W]. image_embed [B, D_img],
        text_embed [B, L, D_txt] with text_mask bool [B, L], y long [B]; *_keep bool [B] (False: the null
        condition, for guidance); lowres [B, C, h, w] (resized to H×W here) with lowres_noise_level [B]."""
        given = {"image_embed": image_embed, "image_keep": image_keep, "text_embed": text_embed,
                 "text_mask": text_mask, "text_keep": text_keep, "y": y, "lowres": lowres,
                 "lowres_noise_level": lowres_noise_level}
        unexpected = [name for name, value in given.items() if value is not None and not self.takes(name)]
        if unexpected:
            raise ValueError(f"this U-Net was built without the conditioning {unexpected} (it has no layers for it)")
        if x.shape[-1] % self.downsample or x.shape[-2] % self.downsample:
            raise ValueError(f"U-Net with {int(math.log2(self.downsample)) + 1} levels needs H, W divisible by "
                             f"{self.downsample}, got {tuple(x.shape[-2:])}")
        emb, context, context_mask = self._conditioning(t, image_embed, image_keep, text_embed, text_mask, text_keep,
                                                        y, lowres_noise_level)
        if self.lowres:
            if lowres is None:
                raise ValueError("this U-Net is an upsampler: it needs the low-resolution image `lowres`")
            lowres = F.interpolate(lowres.to(x.dtype), size=x.shape[-2:], mode="bilinear", align_corners=False)
            x = torch.cat([x, lowres], dim=1)  # [B, 2C, H, W]
        h = self.input_conv(x)  # [B, dim, H, W]
        skips = [h]
        for block in self.down:
            h = self._run(block, h, emb, context, context_mask)
            skips.append(h)
        h = self._run(self.middle, h, emb, context, context_mask)  # [B, c_last, H/ds, W/ds]
        for block in self.up:
            h = self._run(block, torch.cat([h, skips.pop()], dim=1), emb, context, context_mask)
        return self.out(h)  # [B, C_out, H, W]

    def takes(self, name: str) -> bool:
        """Whether forward's conditioning input `name` (image_embed, text_embed, y, lowres, ... ) has layers here."""
        if name.startswith("image_"):
            return bool(self.image_embed_dim)
        if name.startswith("text_"):
            return bool(self.text_dim)
        if name == "y":
            return self.label_embed is not None
        if name.startswith("lowres"):
            return self.lowres
        raise ValueError(f"unknown U-Net input {name!r}")

    @staticmethod
    def _run(layers: nn.ModuleList, h: Tensor, emb: Tensor, context: Tensor | None,
             context_mask: Tensor | None) -> Tensor:
        for layer in layers:
            h = layer(h, emb) if isinstance(layer, ResBlock) else layer(h, context, context_mask)
        return h


class UNetConfig(StrictModel):
    """The U-Net's hyper-parameters as a config section (a stage of dalle2_decoder: `model.stages[i].unet`)."""

    dim: int = Field(64, gt=0, description="channels of the first level")
    dim_mults: tuple[int, ...] = Field((1, 2, 4), min_length=1, description="width multiplier per level")
    num_res_blocks: int = Field(2, ge=1, le=8)
    attention_levels: tuple[int, ...] = Field((1, 2), description="levels (0 = full resolution) with attention")
    head_dim: int = Field(32, gt=0, description="channels per attention head")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    mid_attention: bool = Field(True, description="self-attention in the middle block (ADM); false: only "
                                                  "convolutions there (DALL·E 2's upsamplers)")

    @model_validator(mode="after")
    def _levels_exist(self) -> "UNetConfig":
        if any(m <= 0 for m in self.dim_mults):
            raise ValueError(f"dim_mults={list(self.dim_mults)} must be positive")
        bad = [level for level in self.attention_levels if not 0 <= level < len(self.dim_mults)]
        if bad:
            raise ValueError(f"attention_levels={list(self.attention_levels)}: level {bad[0]} does not exist "
                             f"(levels 0..{len(self.dim_mults) - 1}, one per dim_mults entry)")
        return self

    @property
    def downsample(self) -> int:
        """How much the coarsest level is smaller than the input: inputs must be divisible by it."""
        return 2 ** (len(self.dim_mults) - 1)


def build_unet(cfg: UNetConfig, **conditioning: int | bool) -> UNet:
    """The U-Net `cfg` describes; `conditioning` gives in/out channels and the UNet's conditioning arguments
    (num_classes, image_embed_dim, ...), keyword only."""
    return UNet(dim=cfg.dim, dim_mults=cfg.dim_mults, num_res_blocks=cfg.num_res_blocks,
                attention_levels=cfg.attention_levels, head_dim=cfg.head_dim, dropout=cfg.dropout,
                mid_attention=cfg.mid_attention, **conditioning)
