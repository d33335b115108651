"""The Task contract: the whole interface a family implements (docs/architecture.md, docs/adding-a-family.md).

The trainer only ever calls `loss`, `sample`, `preview`, `parameters_for`, `ema_module` and the checkpoint hooks;
it never branches on the family. A phase is a name ("main"; VQGAN: "generator", "discriminator"), each
with its own optimizer.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Protocol, TypedDict

import torch
import torch._dynamo
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from genforge.core.config import SampleOptions, TrainConfig


# compiled variants allowed per trained block: training and no-grad (sampling, evaluation), a few batch sizes each
COMPILED_VARIANTS_PER_BLOCK = 8


class Batch(TypedDict, total=False):
    """Named batch fields; absent when not used."""

    image: Tensor  # float [B, C, H, W] in [-1, 1]
    video: Tensor  # float [B, C, T, H, W] in [-1, 1]
    frame_mask: Tensor  # bool [B, T]: True = a real frame of `video`, False = padding (data.video.min_frames)
    label: Tensor  # long [B]
    text: list[str]
    text_embed: Tensor  # [B, L, D]
    text_mask: Tensor  # bool [B, L]
    image_embed: Tensor  # [B, D]
    latent: Tensor  # [B, C, h, w]
    tokens: Tensor  # long [B, N]
    key: list[str]  # sample ids, for skip reports and caches
    global_batch: dict[str, Tensor]  # the traits' global_fields of every sample of the optimizer step (`global_rows`)


class HeldOut(Protocol):
    """A run's held-out data as its task is handed it (BuildContext.heldout; genforge.data makes it from the data
    section, resolving a cache to the data it was encoded from). A task never builds a data set itself."""

    def samples(self, n: int, spread: bool = False) -> Batch:
        """Up to `n` readable held-out samples collated: the pixels (`image` or `video`) with `label`, `text`,
        `direction`, `image_embed` where the data has them; `spread`: evenly over the split, not its first n.
        ValueError when there are none."""

    def conditions(self, n: int) -> Batch:
        """Preview conditions of `n` samples when the user gives none: the held-out captions (`text`), labels
        (`label`) and motion directions (`direction`) the data has (DataSource.preview_conditions)."""


@dataclass(frozen=True)
class FamilyTraits:
    """What a family is, declared once when it registers (`register_family(..., traits=...)`) and handed to each
    task it builds (`Task.traits`): what the application, the evaluation and the engine ask of it besides its
    config. Shared layers declare the traits their families start from (tokenizers.config.TOKENIZER_TRAITS,
    masked.config.MASKED_TRAITS) and a family changes what differs (`but`)."""

    # what it is, for the metrics that apply (genforge.eval.metrics) and the codes its runs hand out: "generator";
    # "tokenizer" (+ "discrete" for token ids); "embedder"
    roles: tuple[str, ...] = ("generator",)
    metrics: tuple[str, ...] = ()  # eval.metrics by default
    # train.grad_clip by default (0: no clipping): the max grad norm of the family's seed trainer where it sets one
    # (DiT's train.py: none; DALLE2-pytorch: 0.5), else genforge's 1.0; a run's config.yaml holds the value it used
    grad_clip: float = 1.0
    # (phase, max grad norm) of the phases the seed clips otherwise by default (phenaki-pytorch's CViViTTrainer: the
    # autoencoder at 0.5, its discriminator not at all), set into train.phases with grad_clip when a run leaves both
    # unset
    phase_grad_clip: tuple[tuple[str, float], ...] = ()
    sample_options: type[SampleOptions] = SampleOptions  # its `genforge sample` options: the common ones + its own
    # the classes of the blocks its networks stack (classes, or "module:Class" imported on first use):
    # train.sharding=fsdp shards them one by one, train.compile compiles them, model.grad_checkpointing recomputes them
    block_types: tuple[type[nn.Module] | str, ...] = ()
    makes_samples: bool = True  # False: nothing to preview or sample (an embedding model such as clip)
    preview_online: bool = False  # True: training previews also get sample() of the online weights, cond["online"]
    # batch fields whose rows for the whole global batch the loss needs (a normaliser over every sample of the
    # step, e.g. the real frames of padded clips): the trainer gathers them over accumulation steps and processes
    global_fields: tuple[str, ...] = ()
    no_sharding: str = ""  # why train.sharding=fsdp cannot shard its model (empty: it can)
    no_compile: str = ""  # why train.compile cannot compile its blocks (empty: it can)

    def but(self, **changes: Any) -> "FamilyTraits":
        """These traits with `changes`."""
        return replace(self, **changes)

    def blocks(self) -> tuple[type[nn.Module], ...]:
        """`block_types` as classes (those named "module:Class" imported now)."""
        return tuple(resolve_named(block) for block in self.block_types)


def resolve_named(entry: Any) -> Any:
    """`entry`, or the attribute a "package.module:attribute" string names (imported now)."""
    if not isinstance(entry, str):
        return entry
    module, _, attribute = entry.partition(":")
    return getattr(importlib.import_module(module), attribute)


class Task(nn.Module):
    """Base class of every family's task: a loss per phase, a sampler, and its own schedule state. `traits`: what
    its family declared (set by the family's builder, FamilySpec.build_task; a task built by hand has the
    defaults); `phases`: the phases this task trains, from its config."""

    phases: tuple[str, ...] = ("main",)
    traits: FamilyTraits = FamilyTraits()

    def phase_names(self) -> tuple[str, ...]:
        """Every phase this task can train; `phases` are those it trains in this run (a cascade trained in part).
        `train.phases` may configure any of them."""
        return self.phases

    def parameters_for(self, phase: str) -> Iterable[nn.Parameter]:
        """The parameters the optimizer of `phase` updates (default: every trainable parameter)."""
        return [p for p in self.parameters() if p.requires_grad]

    def loss(self, batch: Batch, phase: str, step: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Scalar loss for `phase` at optimizer step `step`, plus detached scalars to log."""
        raise NotImplementedError

    def resolve(self, options: SampleOptions | None = None) -> SampleOptions:
        """`options` (None: none given) as this task samples with them: its family's options class, each unset option
        the config has a default for filled in (e.g. steps from model.diffusion.sample_steps), checked against the
        model. Callers resolve once and hand the result to `sample_conditions`, `sample` and `sampler_settings`;
        resolving resolved options changes nothing."""
        return self.traits.sample_options.of(options)

    def preview_options(self, train: TrainConfig) -> SampleOptions:
        """The resolved options of the training previews (a video generator: clips of train.sample_frames)."""
        return self.resolve()

    @torch.no_grad()
    def sample(self, cond: Batch, generator: torch.Generator, n: int, options: SampleOptions,
               progress: bool = False) -> Tensor:
        """Generate `n` outputs for the conditions in `cond` (each field holds n rows; images in [-1, 1],
        [n, C, H, W]) with the resolved `options`; `progress`: a bar over the sampler's steps on the terminal."""
        raise NotImplementedError

    def sample_conditions(self, n: int, generator: torch.Generator, options: SampleOptions) -> Batch:
        """Conditions for `n` samples, e.g. a balanced set of labels or the `label` of the resolved `options`."""
        return Batch()

    def preview(self, cond: Batch, images: Tensor) -> tuple[Tensor, int | None]:
        """What a sample grid shows for `sample(cond)` = `images`, and its images per row (None: square).
        Tokenizers show each row of originals above its reconstructions."""
        return images, None

    def sampler_settings(self, options: SampleOptions) -> dict[str, Any]:
        """The settings `sample` runs with for the resolved `options` (recorded with evaluation results and printed
        by `genforge sample`)."""
        return options.model_dump(exclude_none=True)

    def trained_blocks(self) -> list[nn.Module]:
        """The outermost trained submodules of a class in `traits.block_types` (a transformer's layers, a U-Net's
        residual and attention blocks, a tokenizer's stages): the units `train.sharding=fsdp` shards one by one
        (each one's weights gathered only while it runs; without any, the task is one unit) and whose activations
        `model.grad_checkpointing` recomputes."""
        block_types, units, inside = self.traits.blocks(), [], set()
        for module in self.modules():
            if id(module) in inside:
                continue
            if isinstance(module, block_types) and any(p.requires_grad for p in module.parameters()):
                units.append(module)
                inside.update(id(m) for m in module.modules())
        return units

    def checkpoint_activations(self) -> None:
        """Activation (gradient) checkpointing of every trained block (Chen et al. 2016): its forward keeps only its
        inputs, and backward runs it again to get the rest (torch.utils.checkpoint, non-reentrant, RNG state
        replayed, so losses and gradients are those of the plain run). Less activation memory, one more forward."""
        for block in self.trained_blocks():
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)

    def compile_blocks(self) -> None:
        """torch.compile (inductor) every trained block's forward in place: parameter names, hooks (FSDP2's, DDP's)
        and activation checkpointing (compiled with the block) stay as they are. Blocks of one class share their
        compiled code; shapes are static (dynamic shapes trip inductor on diffusers' attention blocks), so each
        distinct shape, grad mode and autocast dtype adds a variant and the recompile limit grows with the number of
        blocks (a U-Net's blocks differ in channels and resolution)."""
        blocks = self.trained_blocks()
        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, COMPILED_VARIANTS_PER_BLOCK * len(blocks))
        for block in blocks:
            block.forward = torch.compile(block.forward, dynamic=False)

    def ema_module(self) -> nn.Module:
        """The sub-module whose weights are averaged and used for sampling (default: the whole task)."""
        return self

    def codec(self) -> nn.Module | None:
        """Tokenizer families: the encoder/decoder (a `LatentCodec` or `TokenCodec` of genforge.tokenizers.standins, with
        the weights `ema_module` averages) that `genforge encode` and generators use. Generators: None."""
        return None

    # Frozen inputs that the task's checkpoints refer to instead of holding their weights (a diffusers codec
    # folder), by config field: {"path", "sha256", "class"}. Set by the application layer when it builds the task;
    # the trainer writes it into every trainer_state.json ("inputs") and refuses to resume when it changed.
    input_references: Mapping[str, Mapping[str, str]] = MappingProxyType({})

    def state_for_checkpoint(self) -> dict[str, Any]:
        """JSON-serialisable schedule state the family owns (e.g. a Gumbel temperature)."""
        return {}

    def load_state_from_checkpoint(self, state: dict[str, Any]) -> None:
        """Inverse of `state_for_checkpoint`."""

    def end_step(self, step: int) -> None:
        """Called on every rank after the optimizer steps of every phase at `step` (skipped ones too): finish
        state a step accumulated outside the optimizer (vqgan: apply its codebook update), so that every rank holds
        the same state before anything reads it, e.g. sampling on the main process only."""

    def forward(self, batch: Batch, phase: str, step: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Dispatches to `loss`, so that DDP/FSDP wrappers see a forward call."""
        return self.loss(batch, phase, step)


def global_rows(batch: Batch, field: str) -> Tensor:
    """`field` for every sample of the optimizer step [G, ...], rows as `batch["rng"]` numbers them (`rng.rows` of it
    are this micro-batch's): what the trainer gathered into `global_batch` (a Task's `global_fields`; rows of
    samples a stream dropped are zeros), or the batch's own when it is the whole global batch (one process without
    accumulation, a validation batch). ValueError when it is neither."""
    rng = batch["rng"]
    if field in batch.get("global_batch", {}):
        return batch["global_batch"][field]
    if rng.offset == 0 and rng.size == rng.global_size:
        return batch[field]
    raise ValueError(f"the loss needs {field!r} of the whole global batch, but this micro-batch has rows "
                     f"[{rng.offset}, {rng.offset + rng.size}) of {rng.global_size} and no global_batch (a task's "
                     "global_fields, which the trainer gathers)")


def interleave_rows(groups: list[Tensor], width: int = 8) -> tuple[Tensor, int]:
    """Aligned batches [B, C, H, W] (originals, reconstructions, ...) -> a grid of `width` columns in which each row
    of the first is followed by the same row of every other; white cells complete a short last row."""
    like = groups[-1]
    groups = [g.to(like.device, like.dtype) for g in groups]
    width = min(width, len(like))
    rows = []
    for start in range(0, len(like), width):
        for group in groups:
            row = group[start : start + width]
            rows += [row, row.new_ones(width - len(row), *row.shape[1:])]
    return torch.cat(rows), width


def class_conditions(n: int, num_classes: int, label: int | None, device: torch.device | str) -> Batch:
    """Labels of `n` class-conditional samples: `label` for all (--label; ValueError when out of range), else every
    class in turn, one per grid cell."""
    if label is not None:
        if not 0 <= label < num_classes:
            raise ValueError(f"--label {label}: allowed 0..{num_classes - 1}")
        labels = torch.full((n,), label, dtype=torch.long)
    else:
        labels = torch.arange(n) % num_classes
    return Batch(label=labels.to(device))


def heldout_captions(heldout: HeldOut | None, n: int, device: torch.device | str,
                     fields: tuple[str, ...] = ("label",)) -> Batch:
    """n held-out captions spread over the held-out split (cycled when it is smaller), with the same rows of
    `fields` (labels for the judge, images) where the data has them; ValueError when it has no captions."""
    if heldout is None:
        raise ValueError("no held-out captions: pass --prompt")
    held = heldout.samples(n, spread=True)
    if "text" not in held:
        raise ValueError("the held-out data has no captions: pass --prompt")
    index = torch.arange(n) % len(held["text"])
    cond = Batch(text=[held["text"][i] for i in index.tolist()])
    cond.update({name: held[name][index].to(device) for name in fields if name in held})
    return cond


def class_count(conditioning: str, configured: int | None, data_classes: int, others: str) -> int:
    """Classes of a model: 0 unless `conditioning` is "class", then model.num_classes or the data set's
    (ValueError when neither says; `others` names the other model.conditioning values)."""
    if conditioning != "class":
        return 0
    if not (configured or data_classes):
        raise ValueError(f"model.conditioning='class' needs labelled data (data set has no classes); set "
                         f"model.conditioning={others} or model.num_classes")
    return configured or data_classes
