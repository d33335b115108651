"""Quantizers shared by the tokenizer families (vqgan, cvivit): vector quantization (van den Oord et al. 2017) with an
EMA or a learnt codebook, optionally l2-normalised codes (ViT-VQGAN, Yu et al. 2022); lookup-free quantization (LFQ,
MAGVIT-v2, Yu et al. 2023); finite scalar quantization (FSQ, Mentzer et al. 2023), all from vector-quantize-pytorch.

`Quantizing` is the base of a codec with a quantized bottleneck over channel-first latents of any number of
positional dimensions: z [B, z, h, w] (images) or [B, z, t, h, w] (videos) -> codes of the same shape and ids
[B, h, w] / [B, t, h, w].

The EMA codebook (van den Oord et al. 2017, appendix A.1; Razavi et al. 2019) is updated from each training
step's assignments, but the update is *deferred*: a step adds its counts and sums (and, for dead-code
replacement, a random sample of its encodings) to pending buffers, and they are applied to the codebook when
the step ends (the task's `end_step`, on every rank), or else when the next step's first quantization runs or
before any read outside training (encode, previews, evaluation).
Applied after the step's loss, as VQ-VAE does, but with three properties the immediate in-forward update
lacks: every micro-batch of a step sees the same codebook (one update per global batch, however it is split
over accumulation steps and processes), calling the loss twice at one step gives the same value, and the
pending buffers are saved with the weights, so a run resumes bit for bit.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable, Literal, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field, field_validator, model_validator
from torch import Tensor, nn
from vector_quantize_pytorch import FSQ, LFQ, VectorQuantize

from genforge.core.config import StrictModel
from genforge.core.random import BatchRandom

QuantizerKind = Literal["vq", "lfq", "fsq"]

# which quantizer kinds each field applies to (setting it for another kind is an error)
APPLIES_TO: dict[str, tuple[str, ...]] = {
    "codebook_size": ("vq", "lfq"),
    "codebook_dim": ("vq",),
    "commitment_weight": ("vq", "lfq"),
    "ema_update": ("vq",),
    "decay": ("vq",),
    "use_cosine_sim": ("vq",),
    "kmeans_init": ("vq",),
    "threshold_ema_dead_code": ("vq",),
    "rotation_trick": ("vq",),
    "entropy_loss_weight": ("lfq",),
    "diversity_gamma": ("lfq",),
    "levels": ("fsq",),
}


class QuantizerConfig(StrictModel):
    """The bottleneck between encoder and decoder; each field names the kinds it applies to (changing a field
    of another kind is an error)."""

    kind: QuantizerKind = Field("vq", description="vq: nearest code of a codebook; lfq: the sign of each of "
                                                  "log2(codebook_size) channels; fsq: each channel rounded to "
                                                  "one of `levels[i]` values")
    codebook_size: int = Field(512, ge=2, le=2**20, description="vq, lfq (a power of 2); fsq: prod(levels)")
    codebook_dim: int | None = Field(None, ge=1, description="vq: code dimension (default: model.z_channels; "
                                                             "smaller: a linear projection in and out, as "
                                                             "ViT-VQGAN's 8-32-d codes)")
    commitment_weight: float = Field(0.25, ge=0.0, description="vq, lfq: β of β‖z − sg(e)‖²")
    ema_update: bool = Field(True, description="vq: codebook = EMA of the encodings assigned to each code "
                                               "(a buffer, no gradient); false: a learnt codebook (β‖z − e‖² "
                                               "trains both sides)")
    decay: float = Field(0.99, gt=0.0, lt=1.0, description="vq: decay of the codebook EMA")
    use_cosine_sim: bool = Field(False, description="vq: l2-normalised codes and encodings, nearest by cosine "
                                                    "(ViT-VQGAN); needs ema_update")
    kmeans_init: bool = Field(False, description="vq: initialise the codebook by 10 k-means iterations on the "
                                                 "first training batch")
    threshold_ema_dead_code: float = Field(0.0, ge=0.0, description="vq: a code whose EMA usage count falls "
                                                                    "below this is replaced by an encoding of "
                                                                    "the batch (0: never)")
    rotation_trick: bool = Field(True, description="vq: gradients through the quantizer by the rotation trick "
                                                   "(Fifty et al. 2024); false: the straight-through estimator")
    entropy_loss_weight: float = Field(0.1, ge=0.0, description="lfq: weight of the entropy loss (per-code "
                                                                "entropy − diversity_gamma · batch entropy)")
    diversity_gamma: float = Field(1.0, ge=0.0, description="lfq: weight of the batch-entropy (usage) term")
    levels: list[int] | None = Field(None, min_length=1, max_length=16,
                                     description="fsq: levels per channel, e.g. [8, 5, 5, 5] (1000 codes)")

    @field_validator("levels")
    @classmethod
    def _levels_at_least_two(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(level < 2 for level in value):
            raise ValueError(f"every level must be >= 2, got {value}")
        return value

    @model_validator(mode="after")
    def _fields_fit_the_kind(self) -> "QuantizerConfig":
        # a changed default, not merely a field present (a resolved config.yaml lists every field)
        wrong = [f for f, kinds in APPLIES_TO.items()
                 if self.kind not in kinds and getattr(self, f) != type(self).model_fields[f].default]
        if wrong:
            raise ValueError(", ".join(f"{f} applies to kind {' or '.join(APPLIES_TO[f])}" for f in wrong)
                             + f", not to kind={self.kind}")
        if self.kind == "lfq" and not math.log2(self.codebook_size).is_integer():
            raise ValueError(f"codebook_size={self.codebook_size} must be a power of 2 for kind=lfq (one bit per "
                             f"channel), e.g. {2 ** round(math.log2(self.codebook_size))}")
        if self.kind == "fsq" and self.levels is None:
            raise ValueError("levels must be set for kind=fsq, e.g. levels: [8, 5, 5, 5]")
        if self.kind == "vq" and self.use_cosine_sim and not self.ema_update:
            raise ValueError("use_cosine_sim=true needs ema_update=true (l2-normalised codes are not learnt by "
                             "gradient here)")
        return self

    def size(self) -> int:
        """The number of distinct token ids."""
        return math.prod(self.levels) if self.kind == "fsq" else self.codebook_size


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


class Quantizing(nn.Module):
    """Base of a codec with a quantized bottleneck: `init_quantizer` adds the `quantizer` (and the `pending` codebook
    update of an EMA codebook); `quantize` / `codes` map channel-first latents of any positional rank."""

    def init_quantizer(self, cfg: QuantizerConfig, dim: int) -> None:
        self.qcfg = cfg
        self.codebook_size = cfg.size()
        self.quantizer = build_quantizer(cfg, dim)
        self.pending = None
        if cfg.kind == "vq" and (cfg.ema_update or cfg.threshold_ema_dead_code > 0):
            self.pending = PendingCodebookUpdate(cfg.codebook_size, cfg.codebook_dim or dim,
                                                 sample=cfg.threshold_ema_dead_code > 0)

    def quantize(self, z: Tensor, step: int | None = None, rng: BatchRandom | None = None,
                 keep: Tensor | None = None) -> Quantized:
        """z [B, z, h, w] or [B, z, t, h, w] -> Quantized. With `step` (training), this batch's codebook statistics
        join the update applied when the next step begins (dead-code samples keyed by `rng`); without, the codebook
        is only read, after any pending update is applied. `keep` bool [B, t] (video latents): only those token
        frames are quantized, so the loss, its logs and the codebook statistics never see the others (a short
        clip's padding); theirs are zero codes and id 0."""
        if keep is not None:  # the kept token frames as a batch of frames [M, z, h, w], clip-major
            b, c, t, h, w = z.shape
            q = self._quantize(z.transpose(1, 2)[keep], step,
                               lambda: self._keys(rng, b, t * h * w).view(b, t, h * w)[keep])
            zq = z.new_zeros(b, t, c, h, w).index_put((keep,), q.zq).transpose(1, 2)  # [B, z, t, h, w]
            return Quantized(zq, q.ids.new_zeros(b, t, h, w).index_put((keep,), q.ids), q.loss, q.logs)
        if z.ndim > 4:  # video latents: quantized as one tall image [B, z, t·h, w], per position like any other
            q = self.quantize(z.flatten(2, -2), step, rng)
            return Quantized(q.zq.view(z.shape), q.ids.view(z.shape[0], *z.shape[2:]), q.loss, q.logs)
        return self._quantize(z, step, lambda: self._keys(rng, len(z), z.shape[2] * z.shape[3]))

    @staticmethod
    def _keys(rng: BatchRandom | None, rows: int, n: int) -> Tensor:
        """Random keys [rows, n] of a batch's encodings for the dead-code sample: per-row draws, the same however the
        global batch is split."""
        return rng.rand(n) if rng is not None else torch.rand(rows, n)

    def _quantize(self, z: Tensor, step: int | None, keys: Callable[[], Tensor]) -> Quantized:
        """z [B, z, h, w] -> Quantized; `keys` draws the dead-code sample's keys [B, h·w] when one is taken."""
        if self.pending is not None:
            self.apply_pending(unless_step=step)
        kind = self.qcfg.kind
        if kind == "vq":
            zq, ids, loss, parts = self.quantizer(z, ema_update=False, return_loss_breakdown=True)
            logs = {"commitment": parts.commitment}
            if step is not None and self.pending is not None:
                self._add_pending(z, ids, step, keys)
        elif kind == "lfq":
            (zq, ids, loss), parts = self.quantizer(z, return_loss_breakdown=True)
            logs = {"commitment": parts.commitment, "per_sample_entropy": parts.per_sample_entropy,
                    "batch_entropy": parts.batch_entropy}
        else:
            zq, ids = self.quantizer(z)
            loss, logs = z.new_zeros(()), {}
        return Quantized(zq, ids.long(), loss, {k: v.detach().float() for k, v in logs.items()})

    @torch.no_grad()
    def _add_pending(self, z: Tensor, ids: Tensor, step: int, keys: Callable[[], Tensor]) -> None:
        """The encodings as the codebook sees them (projected; l2-normalised for cosine sim) [N, d] -> pending."""
        x = self.quantizer.project_in(rearrange(z, "b c h w -> b (h w) c"))
        x = self.quantizer._codebook.transform_input(x).flatten(0, 1)  # [B·h·w, d]
        drawn = keys().to(x.device).flatten() if self.pending.sample else None
        self.pending.add(step, x, ids.flatten(), drawn)

    def apply_pending(self, unless_step: int | None = None) -> None:
        """Apply the pending codebook update (unless it belongs to `unless_step`, the step running now)."""
        pending = int(self.pending.step)
        if pending >= 0 and pending != unless_step:
            self.pending.apply_to(self.quantizer, self.qcfg)

    def codes(self, ids: Tensor) -> Tensor:
        """ids long [B, h, w] or [B, t, h, w] -> the quantized latent zq [B, z, h, w] / [B, z, t, h, w] (what
        `quantize` returns in eval mode)."""
        if ids.ndim > 3:
            return self.codes(ids.flatten(1, -2)).unflatten(2, ids.shape[1:-1])
        if self.qcfg.kind == "vq":
            if self.pending is not None:
                self.apply_pending()
            codes = self.quantizer.codebook[ids]  # [B, h, w, d]
            return rearrange(self.quantizer.project_out(codes), "b h w c -> b c h w")
        return self.quantizer.indices_to_codes(ids)  # lfq, fsq: [B, z, h, w]
