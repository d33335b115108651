"""VQAutoencoder: the VQGAN of taming-transformers / MUSE as a `TokenCodec` (genforge.nn.codec).

image [B, C, H, W] --encoder--> [B, z, h, w] --quant_conv--> z --quantizer--> zq, ids [B, h, w]
      --post_quant_conv--> --decoder--> image [B, C, H, W]          with h = H / f, f = 2**(levels - 1)

The encoder and decoder are diffusers' VAE stacks (resnet blocks per level, a middle block with self-attention);
the quantizers are vector-quantize-pytorch's `VectorQuantize`, `LFQ` and `FSQ`.

The EMA codebook (van den Oord et al. 2017, appendix A.1; Razavi et al. 2019) is updated from each training
step's assignments, but the update is *deferred*: a step adds its counts and sums (and, for dead-code
replacement, a random sample of its encodings) to pending buffers, and they are applied to the codebook when
the step ends (`VQGANTask.end_step`, on every rank), or else when the next step's first quantization runs or
before any read outside training (encode, previews, evaluation).
Applied after the step's loss, as VQ-VAE does, but with three properties the immediate in-forward update
lacks: every micro-batch of a step sees the same codebook (one update per global batch, however it is split
over accumulation steps and processes), calling the loss twice at one step gives the same value, and the
pending buffers are saved with the weights, so a run resumes bit for bit.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from diffusers.models.autoencoders.vae import Decoder, Encoder
from einops import rearrange
from torch import Tensor, nn
from vector_quantize_pytorch import FSQ, LFQ, VectorQuantize

from genforge.core.random import BatchRandom
from genforge.families.vqgan.config import QuantizerConfig, VQGANConfig


EMPTY = 2.0  # the key of an empty sample slot (real keys are uniform in [0, 1); checkpoints refuse inf)


class Quantized(NamedTuple):
    """What the quantizer returns for z [B, z, h, w]."""

    zq: Tensor  # [B, z, h, w]; gradients reach z (straight-through or rotation trick)
    ids: Tensor  # long [B, h, w] in [0, codebook_size)
    loss: Tensor  # scalar auxiliary loss: commitment (vq); commitment + entropy (lfq); 0 (fsq)
    logs: dict[str, Tensor]  # its parts, detached scalars


def build_quantizer(cfg: QuantizerConfig, dim: int) -> nn.Module:
    """vector-quantize-pytorch's quantizer for `cfg`, on channel-first feature maps of `dim` channels."""
    if cfg.kind == "vq":
        return VectorQuantize(
            dim=dim, codebook_size=cfg.codebook_size, codebook_dim=cfg.codebook_dim, accept_image_fmap=True,
            commitment_weight=cfg.commitment_weight, decay=cfg.decay, use_cosine_sim=cfg.use_cosine_sim,
            kmeans_init=cfg.kmeans_init, ema_update=cfg.ema_update, learnable_codebook=not cfg.ema_update,
            rotation_trick=cfg.rotation_trick,
            threshold_ema_dead_code=0,  # dead codes are replaced by PendingCodebookUpdate, deterministically
        )
    if cfg.kind == "lfq":
        return LFQ(dim=dim, codebook_size=cfg.codebook_size, entropy_loss_weight=cfg.entropy_loss_weight,
                   commitment_loss_weight=cfg.commitment_weight, diversity_gamma=cfg.diversity_gamma)
    # FSQ reads its levels back with .item() while it is built, which a meta tensor (dry runs) cannot do;
    # level 2 needs FSQ's symmetric rounding
    cpu = torch.device("cpu") if torch.get_default_device().type == "meta" else nullcontext()
    with cpu:
        return FSQ(levels=list(cfg.levels), dim=dim, preserve_symmetry=2 in cfg.levels)


class PendingCodebookUpdate(nn.Module):
    """This step's codebook statistics (persistent buffers), to be applied to a `VectorQuantize` codebook once
    the step is over: EMA of the usage counts and of the sum of the encodings assigned to each code, and a
    uniform sample of the step's encodings (the `codebook_size` with the smallest random keys) to restart
    dead codes with."""

    def __init__(self, codebook_size: int, dim: int, sample: bool) -> None:
        super().__init__()
        self.register_buffer("step", torch.tensor(-1, dtype=torch.long))  # -1: nothing pending
        self.register_buffer("counts", torch.zeros(codebook_size))  # [K]
        self.register_buffer("sums", torch.zeros(codebook_size, dim))  # [K, d]
        self.sample = sample
        if sample:
            self.register_buffer("candidates", torch.zeros(codebook_size, dim))  # [K, d], by increasing key
            self.register_buffer("keys", torch.full((codebook_size,), EMPTY))  # [K] in [0, 1); EMPTY: no sample

    @torch.no_grad()
    def add(self, step: int, x: Tensor, ids: Tensor, keys: Tensor | None) -> None:
        """Encodings x [N, d] assigned to ids [N] at `step`, with random keys [N] (sample=True); summed over
        processes, so every rank holds the same pending update."""
        x = x.float()
        counts = torch.bincount(ids, minlength=len(self.counts)).to(x)  # [K]
        sums = F.one_hot(ids, len(self.counts)).to(x).t() @ x  # [K, d]
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if distributed:
            dist.all_reduce(counts)
            dist.all_reduce(sums)
        self.step.fill_(step)
        self.counts += counts
        self.sums += sums
        if self.sample:
            keys, x = self._smallest(torch.cat([self.keys, keys.float()]), torch.cat([self.candidates, x]))
            if distributed:  # every rank's K smallest, then the K smallest of those
                world = dist.get_world_size()
                all_keys, all_x = [torch.empty_like(keys) for _ in range(world)], [torch.empty_like(x) for _ in range(world)]
                dist.all_gather(all_keys, keys)
                dist.all_gather(all_x, x)
                keys, x = self._smallest(torch.cat(all_keys), torch.cat(all_x))
            self.keys.copy_(keys)
            self.candidates.copy_(x)

    def _smallest(self, keys: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        keys, order = keys.topk(len(self.keys), largest=False, sorted=True)
        return keys, x[order]

    @torch.no_grad()
    def apply_to(self, vq: VectorQuantize, cfg: QuantizerConfig) -> None:
        """codebook <- EMA update with the pending statistics; dead codes <- sampled encodings; then clear."""
        book = vq._codebook  # buffers cluster_size [1, K], embed_avg [1, K, d], embed [1, K, d]
        size, avg, embed = book.cluster_size[0], book.embed_avg[0], book.embed.data[0]
        size.lerp_(self.counts, 1.0 - cfg.decay)
        avg.lerp_(self.sums, 1.0 - cfg.decay)
        if cfg.ema_update:
            n = size.sum()
            smoothed = (size + book.eps) / (n + len(size) * book.eps) * n  # Laplace smoothing: no division by 0
            new = avg / smoothed[:, None]
            embed.copy_(F.normalize(new, dim=-1) if cfg.use_cosine_sim else new)
        if cfg.threshold_ema_dead_code > 0:
            dead = (size < cfg.threshold_ema_dead_code).nonzero().squeeze(1)
            dead = dead[: int((self.keys < EMPTY).sum())]  # as many as there are samples
            sample = self.candidates[: len(dead)]
            sample = F.normalize(sample, dim=-1) if cfg.use_cosine_sim else sample
            embed[dead] = sample
            size[dead] = cfg.threshold_ema_dead_code
            avg[dead] = sample * cfg.threshold_ema_dead_code
        self.step.fill_(-1)
        self.counts.zero_()
        self.sums.zero_()
        if self.sample:
            self.keys.fill_(EMPTY)
            self.candidates.zero_()


class VQAutoencoder(nn.Module):
    """TokenCodec: encode = ids of the quantized encoder output, decode = decoder(codes of the ids)."""

    def __init__(self, cfg: VQGANConfig, channels: int) -> None:
        super().__init__()
        levels, z = len(cfg.block_out_channels), cfg.z_channels
        self.qcfg = cfg.quantizer
        self.codebook_size = cfg.quantizer.size()
        self.downsample = 2 ** (levels - 1)
        arch = cfg.stack_kwargs()
        self.encoder = Encoder(in_channels=channels, out_channels=z, down_block_types=("DownEncoderBlock2D",) * levels,
                               double_z=False, **arch)
        self.quant_conv = nn.Conv2d(z, z, 1)
        self.quantizer = build_quantizer(cfg.quantizer, z)
        self.post_quant_conv = nn.Conv2d(z, z, 1)
        self.decoder = Decoder(in_channels=z, out_channels=channels, up_block_types=("UpDecoderBlock2D",) * levels,
                               **arch)
        q = cfg.quantizer
        self.pending = None
        if q.kind == "vq" and (q.ema_update or q.threshold_ema_dead_code > 0):
            dim = q.codebook_dim or z
            self.pending = PendingCodebookUpdate(q.codebook_size, dim, sample=q.threshold_ema_dead_code > 0)

    # --------------------------------------------------------------------------------------- pieces
    def encode_latent(self, image: Tensor) -> Tensor:
        """image [B, C, H, W] -> z [B, z, h, w] (before quantization)."""
        return self.quant_conv(self.encoder(image))

    def decode_latent(self, zq: Tensor) -> Tensor:
        """zq [B, z, h, w] -> image [B, C, H, W]."""
        return self.decoder(self.post_quant_conv(zq))

    def quantize(self, z: Tensor, step: int | None = None, rng: BatchRandom | None = None) -> Quantized:
        """z [B, z, h, w] -> Quantized. With `step` (training), this batch's codebook statistics join the update
        applied when the next step begins (dead-code samples keyed by `rng`); without, the codebook is only read,
        after any pending update is applied."""
        if self.pending is not None:
            self.apply_pending(unless_step=step)
        kind = self.qcfg.kind
        if kind == "vq":
            zq, ids, loss, parts = self.quantizer(z, ema_update=False, return_loss_breakdown=True)
            logs = {"commitment": parts.commitment}
            if step is not None and self.pending is not None:
                self._add_pending(z, ids, step, rng)
        elif kind == "lfq":
            (zq, ids, loss), parts = self.quantizer(z, return_loss_breakdown=True)
            logs = {"commitment": parts.commitment, "per_sample_entropy": parts.per_sample_entropy,
                    "batch_entropy": parts.batch_entropy}
        else:
            zq, ids = self.quantizer(z)
            loss, logs = z.new_zeros(()), {}
        return Quantized(zq, ids.long(), loss, {k: v.detach().float() for k, v in logs.items()})

    @torch.no_grad()
    def _add_pending(self, z: Tensor, ids: Tensor, step: int, rng: BatchRandom | None) -> None:
        """The encodings as the codebook sees them (projected; l2-normalised for cosine sim) [N, d] -> pending."""
        b, _, h, w = z.shape
        x = self.quantizer.project_in(rearrange(z, "b c h w -> b (h w) c"))
        x = self.quantizer._codebook.transform_input(x).flatten(0, 1)  # [B·h·w, d]
        keys = None
        if self.pending.sample:  # per-row draws: the same keys however the global batch is split
            keys = (rng.rand(h * w) if rng is not None else torch.rand(b, h * w)).to(x.device).flatten()
        self.pending.add(step, x, ids.flatten(), keys)

    def apply_pending(self, unless_step: int | None = None) -> None:
        """Apply the pending codebook update (unless it belongs to `unless_step`, the step running now)."""
        pending = int(self.pending.step)
        if pending >= 0 and pending != unless_step:
            self.pending.apply_to(self.quantizer, self.qcfg)

    def codes(self, ids: Tensor) -> Tensor:
        """ids long [B, h, w] -> the quantized latent zq [B, z, h, w] (what `quantize` returns in eval mode)."""
        if self.qcfg.kind == "vq":
            if self.pending is not None:
                self.apply_pending()
            codes = self.quantizer.codebook[ids]  # [B, h, w, d]
            return rearrange(self.quantizer.project_out(codes), "b h w c -> b c h w")
        return self.quantizer.indices_to_codes(ids)  # lfq, fsq: [B, z, h, w]

    # ----------------------------------------------------------------------------------- TokenCodec
    def encode(self, image: Tensor) -> Tensor:
        """image [B, C, H, W] in [-1, 1] -> token ids long [B, H/f, W/f] in [0, codebook_size)."""
        return self.quantize(self.encode_latent(image)).ids

    def decode(self, ids: Tensor) -> Tensor:
        """token ids long [B, h, w] -> image [B, C, h·f, w·f]."""
        return self.decode_latent(self.codes(ids))
