"""EDM2's magnitude-preserving U-Net, laid out as genforge's ADM U-Net (genforge.nn.unet).

Karras et al. 2024, "Analyzing and Improving the Training Dynamics of Diffusion Models" (EDM2), §2-§3 and App. B:
every layer keeps the magnitude of its activations at about 1 at initialisation and throughout training, so that
no weight or activation drifts (their configuration G):
- convolutions and linear layers without biases, with weight normalisation in the forward pass (w / ‖w‖ per output
  channel, scaled by 1/√fan_in: eq. 47) and *forced* weight normalisation of the stored weights after every
  optimizer step (eq. 66; `project_weights_`), so the effective learning rate does not decay as the norms grow;
- no group norms: pixel norm (unit RMS over the channels) on the encoder's skip path and on q, k, v (cosine
  attention);
- SiLU divided by 0.596 (eq. 81), sums and concatenations weighted to keep unit variance (eq. 88, 103), the
  residual branch blended in with t = 0.3;
- the embedding modulates each block multiplicatively, 1 + gain · (linear of the embedding), with the gain a
  learned scalar that starts at 0; the output convolution's gain also starts at 0 (the network starts at zero);
- a constant channel of ones is appended to the input.

The same levels, blocks, attention levels and skips as the ADM U-Net of the same config (input conv; per level
`num_res_blocks` blocks, a down block between levels; a middle of two blocks, the first with attention; per level
`num_res_blocks + 1` blocks each taking a skip, an up block at the end of the level); class conditioning through a
learned one-hot embedding with a null class for guidance. EDM2's learned per-σ loss weighting and its
inverse-square-root learning-rate decay are not part of the network and not included here.

Shapes in comments: B batch, C in channels, H = W side, c channels of a level, E = 4·dim embedding width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genforge.nn.embeddings import timestep_embedding

RESIDUAL_BALANCE = 0.3  # EDM2's res_balance and attn_balance: the branch's share in mp_sum
SKIP_BALANCE = 0.5  # concat_balance: the decoder's input and the encoder's skip weighed equally
LABEL_BALANCE = 0.5  # the label embedding's share beside the noise level's
CLIP_ACTIVATIONS = 256.0  # EDM2 clamps every block's output to ±256 (a guard for float16, harmless in fp32)


def normalize(x: Tensor, dim: int | tuple[int, ...] | None = None, eps: float = 1e-4) -> Tensor:
    """x scaled to unit RMS over `dim` (default: every dimension but the first): x / (eps + ‖x‖/√n)."""
    dim = tuple(range(1, x.ndim)) if dim is None else dim
    norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True, dtype=torch.float32)
    norm = torch.add(eps, norm, alpha=math.sqrt(norm.numel() / x.numel()))
    return x / norm.to(x.dtype)


def mp_silu(x: Tensor) -> Tensor:
    """SiLU scaled to keep a unit-variance Gaussian input at unit second moment (EDM2 eq. 81)."""
    return F.silu(x) / 0.596


def mp_sum(a: Tensor, b: Tensor, t: float = 0.5) -> Tensor:
    """(1 − t)·a + t·b over √((1 − t)² + t²): unit variance for independent unit-variance a and b (eq. 88)."""
    return a.lerp(b, t) / math.sqrt((1 - t) ** 2 + t**2)


def mp_cat(a: Tensor, b: Tensor, t: float = 0.5) -> Tensor:
    """Channel concatenation [B, Na + Nb, ...] with a's share 1 − t and b's t of the output's magnitude, the whole
    at the inputs' magnitude (eq. 103)."""
    na, nb = a.shape[1], b.shape[1]
    scale = math.sqrt((na + nb) / ((1 - t) ** 2 + t**2))
    return torch.cat([a * (scale / math.sqrt(na) * (1 - t)), b * (scale / math.sqrt(nb) * t)], dim=1)


class MPConv(nn.Module):
    """Magnitude-preserving convolution (kernel k ≥ 1) or linear layer (kernel 0), no bias (eq. 47): the weight of
    each output channel is normalised to unit norm in the forward pass, times `gain`."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int) -> None:
        super().__init__()
        shape = (out_channels, in_channels, kernel, kernel) if kernel else (out_channels, in_channels)
        self.weight = nn.Parameter(normalize(torch.randn(shape)))  # stored at RMS 1 per output channel

    def forward(self, x: Tensor, gain: Tensor | float = 1.0) -> Tensor:
        w = normalize(self.weight.float()) * (gain / math.sqrt(self.weight[0].numel()))  # unit norm per output
        w = w.to(x.dtype)
        if w.ndim == 2:
            return x @ w.t()  # [B, in] -> [B, out]
        return F.conv2d(x, w, padding=w.shape[-1] // 2)  # [B, in, H, W] -> [B, out, H, W]


@torch.no_grad()
def project_weights_(module: nn.Module) -> None:
    """Forced weight normalisation (EDM2 eq. 66): every MPConv's stored weight back to RMS 1 per output channel.
    Called after each optimizer step; with FSDP each rank holds whole output channels (dim-0 shards), so the
    projection is local."""
    for layer in module.modules():
        if isinstance(layer, MPConv):
            layer.weight.copy_(normalize(layer.weight))


def _resample(x: Tensor, mode: str | None) -> Tensor:
    """None, "down" (2×2 average, EDM2's [1, 1] filter) or "up" (nearest 2×)."""
    if mode == "down":
        return F.avg_pool2d(x, 2)
    if mode == "up":
        return F.interpolate(x, scale_factor=2, mode="nearest")
    return x


class MPBlock(nn.Module):
    """EDM2's U-Net block (App. B, Fig. 21). Encoder flavour: resample, 1×1 conv where the width changes, pixel
    norm, then x + branch; decoder flavour: branch of x, the 1×1 conv on the skip path. Branch: conv3×3(mp_silu(x)),
    times 1 + gain·linear(emb), mp_silu, dropout, conv3×3; blended with mp_sum(t = 0.3). Optional cosine
    self-attention (q, k, v pixel-normed per head), blended the same way."""

    def __init__(self, in_ch: int, out_ch: int, emb_dim: int, decoder: bool, resample: str | None = None,
                 attention: bool = False, head_dim: int = 32, dropout: float = 0.0) -> None:
        super().__init__()
        self.decoder, self.resample, self.dropout = decoder, resample, dropout
        self.heads = max(1, out_ch // head_dim) if attention else 0
        if attention and out_ch % self.heads:
            raise ValueError(f"U-Net attention width {out_ch} is not divisible into {self.heads} heads")
        self.skip = MPConv(in_ch, out_ch, 1) if in_ch != out_ch else None
        self.conv_in = MPConv(in_ch if decoder else out_ch, out_ch, 3)
        self.emb_linear = MPConv(emb_dim, out_ch, 0)
        self.emb_gain = nn.Parameter(torch.zeros(1))  # 1-D: FSDP2 shards no scalars
        self.conv_out = MPConv(out_ch, out_ch, 3)
        if self.heads:
            self.qkv = MPConv(out_ch, 3 * out_ch, 1)
            self.proj = MPConv(out_ch, out_ch, 1)

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        # x [B, c_in, H, W], emb [B, E]
        x = _resample(x, self.resample)  # [B, c_in, H', W']
        if not self.decoder:
            if self.skip is not None:
                x = self.skip(x)
            x = normalize(x, dim=1)  # pixel norm: [B, c_out, H', W']
        y = self.conv_in(mp_silu(x))  # [B, c_out, H', W']
        scale = self.emb_linear(emb, gain=self.emb_gain) + 1  # [B, c_out]
        y = mp_silu(y * scale[:, :, None, None].to(y.dtype))
        y = F.dropout(y, p=self.dropout, training=self.training)
        y = self.conv_out(y)
        if self.decoder and self.skip is not None:
            x = self.skip(x)
        x = mp_sum(x, y, RESIDUAL_BALANCE)  # [B, c_out, H', W']
        if self.heads:
            b, c, hgt, wid = x.shape
            qkv = self.qkv(x).view(b, self.heads, 3, c // self.heads, hgt * wid)  # [B, heads, 3, d, N]
            q, k, v = normalize(qkv, dim=3).transpose(-1, -2).unbind(2)  # [B, heads, N, d] each, unit RMS over d
            y = F.scaled_dot_product_attention(q, k, v)  # [B, heads, N, d]
            y = self.proj(y.transpose(-1, -2).reshape(b, c, hgt, wid))
            x = mp_sum(x, y, RESIDUAL_BALANCE)
        return x.clamp(-CLIP_ACTIVATIONS, CLIP_ACTIVATIONS)


class MPUNet(nn.Module):
    """EDM2's magnitude-preserving U-Net with the ADM U-Net's layout and forward (x [B, C, H, W], t [B], y [B]) ->
    [B, C_out, H, W]: dim, dim_mults, num_res_blocks, attention_levels, mid_attention, head_dim, dropout as there;
    num_classes > 0: class-conditional with the null label `num_classes` for classifier-free guidance."""

    def __init__(self, in_channels: int = 3, out_channels: int = 3, dim: int = 64,
                 dim_mults: tuple[int, ...] = (1, 2, 4), num_res_blocks: int = 2,
                 attention_levels: tuple[int, ...] = (1, 2), head_dim: int = 32, dropout: float = 0.0,
                 mid_attention: bool = True, num_classes: int = 0) -> None:
        super().__init__()
        if any(not 0 <= level < len(dim_mults) for level in attention_levels):
            raise ValueError(f"attention_levels={list(attention_levels)} must index dim_mults "
                             f"(0..{len(dim_mults) - 1})")
        self.in_channels, self.out_channels, self.dim = in_channels, out_channels, dim
        self.downsample = 2 ** (len(dim_mults) - 1)
        emb_dim = 4 * dim
        # ---- embedding: sinusoidal noise level (×√2: unit RMS) and one-hot label, each through an MP linear
        self.time_linear = MPConv(dim, emb_dim, 0)
        self.label_linear = MPConv(num_classes + 1, emb_dim, 0) if num_classes else None  # + the null class
        self.null_label = num_classes

        def block(c_in: int, c_out: int, decoder: bool, resample: str | None = None,
                  attention: bool = False) -> MPBlock:
            return MPBlock(c_in, c_out, emb_dim, decoder, resample, attention, head_dim, dropout)

        # ---- encoder: skips record every output's width
        self.input_conv = MPConv(in_channels + 1, dim, 3)  # + the constant channel
        self.down = nn.ModuleList()
        skips, ch = [dim], dim
        for level, mult in enumerate(dim_mults):
            if level > 0:
                self.down.append(block(ch, ch, False, resample="down"))
                skips.append(ch)
            for _ in range(num_res_blocks):
                self.down.append(block(ch, dim * mult, False, attention=level in attention_levels))
                ch = dim * mult
                skips.append(ch)
        # ---- middle, then the decoder: each level block takes the matching skip (mp_cat)
        self.middle = nn.ModuleList([block(ch, ch, True, attention=mid_attention), block(ch, ch, True)])
        self.up = nn.ModuleList()
        self.takes_skip: list[bool] = []
        for level, mult in reversed(list(enumerate(dim_mults))):
            if level < len(dim_mults) - 1:
                self.up.append(block(ch, ch, True, resample="up"))
                self.takes_skip.append(False)
            for _ in range(num_res_blocks + 1):
                self.up.append(block(ch + skips.pop(), dim * mult, True, attention=level in attention_levels))
                self.takes_skip.append(True)
                ch = dim * mult
        self.output_conv = MPConv(ch, out_channels, 3)
        self.output_gain = nn.Parameter(torch.zeros(1))  # the network starts at zero

    def embedding(self, t: Tensor, y: Tensor | None) -> Tensor:
        """[B, E]: mp_silu(mp_sum(linear(√2·sinusoid(t)), linear(√K·one_hot(y)), 0.5)), y None: the null label."""
        emb = self.time_linear(timestep_embedding(t, self.dim) * math.sqrt(2))  # [B, E], unit RMS
        if self.label_linear is not None:
            if y is None:
                y = torch.full((t.shape[0],), self.null_label, dtype=torch.long, device=t.device)
            classes = self.label_linear.weight.shape[1]
            one_hot = F.one_hot(y, classes).to(emb.dtype) * math.sqrt(classes)  # [B, K + 1]
            emb = mp_sum(emb, self.label_linear(one_hot), LABEL_BALANCE)
        return mp_silu(emb)

    def forward(self, x: Tensor, t: Tensor, *, y: Tensor | None = None) -> Tensor:
        """x [B, C, H, W] (noisy), t [B] (the objective's model time), y long [B] -> [B, C_out, H, W]."""
        if y is not None and self.label_linear is None:
            raise ValueError("this U-Net was built without the conditioning ['y'] (it has no layers for it)")
        if x.shape[-1] % self.downsample or x.shape[-2] % self.downsample:
            raise ValueError(f"U-Net with {int(math.log2(self.downsample)) + 1} levels needs H, W divisible by "
                             f"{self.downsample}, got {tuple(x.shape[-2:])}")
        emb = self.embedding(t, y).to(x.dtype)  # [B, E]
        h = self.input_conv(torch.cat([x, torch.ones_like(x[:, :1])], dim=1))  # [B, dim, H, W]
        skips = [h]
        for layer in self.down:
            h = layer(h, emb)
            skips.append(h)
        for layer in self.middle:
            h = layer(h, emb)  # [B, c_last, H/ds, W/ds]
        for layer, takes_skip in zip(self.up, self.takes_skip):
            h = layer(mp_cat(h, skips.pop(), SKIP_BALANCE) if takes_skip else h, emb)
        return self.output_conv(h, gain=self.output_gain)  # [B, C_out, H, W]

    def takes(self, name: str) -> bool:
        """Whether forward's conditioning input `name` has layers here (only the label y)."""
        return name == "y" and self.label_linear is not None
