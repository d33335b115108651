"""MaskedTokenTask: MaskGIT's masked-token objective over a tokenizer's ids, conditioned on text (MUSE) or classes,
with conditioning dropout for classifier-free guidance, and iterative parallel decoding; what maskgit (image ids
[B, h, w]) and phenaki (video ids [B, t, h, w]) share. A subclass builds the transformer (`build_model`, its own
position embeddings) and says which ids to decode (`code_shape`); everything else runs on the flattened ids [B, N].
Positions that padding feeds (`real_positions`: phenaki's token frames of padded video frames) are never targets,
never counted in the loss's normaliser, and are removed from self-attention as keys, so nothing of them reaches a real
token (phenaki-pytorch's `video_mask`)."""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genforge.core.config import SampleOptions
from genforge.core.family import BuildContext
from genforge.core.random import BatchRandom
from genforge.core.task import Batch, Task, class_conditions, class_count, global_rows
from genforge.masked.config import MaskedSampleOptions, MaskedTokenConfig
from genforge.masked.masking import decode, guided_logits, hidden_count, training_mask
from genforge.masked.transformer import MaskTransformer
from genforge.nn.frozen import held_on
from genforge.text.encoders import attach_text_encoder, build_text_encoder, use_cached_text_embeds
from genforge.tokenizers.standins import build_standin


DecodeRun = Callable[[Tensor | None, Tensor | None], Tensor]  # (start ids [n, N], positions [N] to decode) -> ids


class TrainingMasks(NamedTuple):
    """What a training step hides, which the cross-entropy scores."""

    hidden: Tensor  # bool [B, N]: positions shown to the transformer as [MASK] and scored
    total: Tensor  # hidden positions of the whole global batch: the loss's denominator


class MaskedTokenTask(Task):
    """Trains a `MaskTransformer` to predict masked token ids (cross-entropy on the masked positions only) and
    samples by iterative decoding, then decodes the ids to pixels with the tokenizer."""


    def __init__(self, cfg: MaskedTokenConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.cfg = cfg
        data = ctx.info
        self.token_codec, source = self._build_codec(cfg, ctx)  # frozen
        self.codebook_size = int(self.token_codec.codebook_size)
        cfg.check_vocabulary(self.codebook_size, source)
        self.num_classes = class_count(cfg.conditioning, cfg.num_classes, data.num_classes, "text or none")
        encoder = build_text_encoder(cfg.text) if cfg.conditioning == "text" else None
        text_dim = encoder.dim if encoder is not None else 0
        self.model = self.build_model(ctx, source, text_dim)
        if cfg.critic is not None and cfg.critic.kind == "separate":  # inside the model: checkpointed, averaged
            width, depth, heads = cfg.critic_size()
            self.model.critic = token_critic(self.make_transformer(width, depth, heads, text_dim))
        elif cfg.critic is not None:  # self critic: a head on the generator's hidden states
            self.model.critic_head = critic_head(cfg.width)
        self.phases = tuple(p for p in cfg.phase_names() if cfg.train_phases is None or p in cfg.train_phases)
        self.use_cached_text = False  # embeddings from the cache (genforge encode --text-encoder) instead of `text`
        if encoder is not None:
            # trainable: a submodule of the model (optimised, averaged, checkpointed); frozen: outside the module tree
            attach_text_encoder(self.model, "text_encoder", encoder)
            self.use_cached_text = use_cached_text_embeds(data.text_encoder, encoder, ctx.data.path)
        self.heldout = ctx.heldout  # default prompts: held-out captions (with their labels and directions)
        # (a cache is checked when its first preview is made: sampling a finished run must not need its data)
        if cfg.conditioning == "text" and not cfg.sample_prompts and data.kind != "tokens":
            if self.heldout is None or "text" not in self.heldout.conditions(1):
                raise ValueError("model.sample_prompts: the data has no held-out captions for the preview grids and "
                                 "evaluation; set prompts, e.g. --set 'model.sample_prompts=[\"a photo of a dog\"]'")

    # ------------------------------------------------------------------------------------------ for subclasses
    def build_model(self, ctx: BuildContext, source: str, text_dim: int) -> MaskTransformer:
        """The generator over this run's ids: their layout checked against the tokenizer (named `source` in
        messages), then `make_transformer` of model.width/depth/num_heads."""
        raise NotImplementedError

    def make_transformer(self, width: int, depth: int, num_heads: int, text_dim: int) -> MaskTransformer:
        """A transformer of this size over this run's id layout (its own position embeddings); the generator, and
        the token critic's trunk. Called after `build_model` has read the layout."""
        raise NotImplementedError

    def code_shape(self, n: int, options: MaskedSampleOptions) -> tuple[int, ...]:
        """The shape of the ids `sample` decodes for n samples with the resolved `options`: [n, h, w] (images) or
        [n, t, h, w] (clips)."""
        raise NotImplementedError

    def real_positions(self, frame_mask: Tensor, n: int) -> Tensor:
        """bool [B, N] (N = `n` ids per sample): the positions of samples with real frames `frame_mask` [B, T] that no
        padding feeds (phenaki: those of the real token frames)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ building
    @staticmethod
    def _build_codec(cfg: MaskedTokenConfig, ctx: BuildContext) -> tuple[nn.Module, str]:
        """The token codec of `model.tokens` (the stand-in, or the tokenizer run's, loaded by the application) and
        where its grid and vocabulary come from, for messages."""
        if not cfg.tokens.loaded:
            return build_standin(cfg.tokens), "model.tokens.factor/levels"
        codec, _ = ctx.codecs[cfg.tokens.source_field]
        return codec, f"the tokenizer {cfg.tokens.source_path}"

    def ema_module(self) -> nn.Module:
        return self.model

    def phase_names(self) -> tuple[str, ...]:
        return self.cfg.phase_names()

    def parameters_for(self, phase: str) -> list[nn.Parameter]:
        """critic: the token critic's weights; main: every other trainable weight (the generator, a trainable text
        encoder, and a critic trained jointly with it)."""
        critic = getattr(self.model, "critic", None)
        apart = critic is not None and self.cfg.critic.training == "phase"
        critic_ids = {id(p) for p in critic.parameters()} if apart else set()
        return [p for p in self.parameters() if p.requires_grad and (id(p) in critic_ids) == (phase == "critic")]

    def train(self, mode: bool = True) -> "MaskedTokenTask":
        """Train mode for the transformer; the codec stays frozen in eval mode."""
        super().train(mode)
        self.token_codec.eval()
        return self

    # ------------------------------------------------------------------------------------------ conditioning
    def context(self, cond: dict[str, Any], drop: Tensor, text_key: str = "text",
                transformer: MaskTransformer | None = None) -> tuple[Tensor, Tensor]:
        """Context and mask of `cond` (text, cached text embeddings or labels) for `transformer` (default: the
        generator; the critic projects the same text embeddings with its own weights, and never trains the text
        encoder); rows of `drop` unconditional."""
        transformer = transformer or self.model
        if self.cfg.conditioning == "text":
            if self.use_cached_text and "text_embed" in cond and text_key == "text":
                embed, mask = cond["text_embed"], cond["text_mask"]
            else:
                encoder = self.model.text_encoder
                trains = torch.is_grad_enabled() and encoder.trainable and transformer is self.model
                with torch.set_grad_enabled(trains):
                    embed, mask = encoder.encode_on(list(cond[text_key]), self.model.head.weight.device)
            return transformer.context(drop, text_embed=embed, text_mask=mask)
        if self.cfg.conditioning == "class":
            return transformer.context(drop, labels=cond["label"])
        return transformer.context(drop)

    def to_tokens(self, batch: Batch) -> Tensor:
        """Token ids [B, N]: cached (checked to lie in the vocabulary: an id outside it must never reach the
        embedding), or encoded from the images or clips."""
        if "tokens" in batch:
            ids = batch["tokens"].long().flatten(1)
            if ids.min() < 0 or ids.max() >= self.codebook_size:
                raise ValueError(f"cached token ids lie in [{int(ids.min())}, {int(ids.max())}], outside the "
                                 f"vocabulary [0, {self.codebook_size}) of this run's tokenizer")
            return ids
        with torch.no_grad():
            pixels = batch["video"] if "video" in batch else batch["image"]
            return held_on(self.token_codec, pixels.device).encode(pixels).flatten(1)  # [B, (t,) h, w] -> [B, N]

    # ------------------------------------------------------------------------------------------ training
    def loss(self, batch: Batch, phase: str, step: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Cross-entropy on the masked positions only (MaskGIT eq. 1), averaged over every masked token of the
        global batch, so any split into processes and accumulation steps gives the same gradient; with a critic
        trained jointly (model.critic.training=joint), + loss_weight × its `critic_bce` on this step's masks and
        the generator's own samples (phenaki-pytorch's Phenaki.forward). The phase `critic`: `critic_loss`."""
        if phase == "critic":
            return self.critic_loss(batch)
        ids = self.to_tokens(batch)  # [B, N]
        rng = batch["rng"]
        real = self.global_real_positions(batch, ids.shape[1])  # [G, N] or None: no padding
        masks = self.training_masks(rng, ids.shape[1], real)
        real = None if real is None else rng.rows(real)  # [B, N]
        drop = rng.rand() < self.cfg.cond_dropout_prob  # [B]: unconditional rows (classifier-free guidance)
        context, context_mask = self.context(batch, drop)
        shown = ids.masked_fill(masks.hidden, self.model.mask_id)
        hidden = self.model.hidden(shown, context, context_mask, real)  # [B, N, D]
        logits = self.model.head(hidden[masks.hidden])  # only the scored positions: [M, K]
        targets = ids[masks.hidden]  # [M]
        ce = F.cross_entropy(logits.float(), targets, reduction="sum", label_smoothing=self.cfg.label_smoothing)
        loss = ce * (rng.global_size / rng.size) / masks.total
        with torch.no_grad():
            logs = {"ce": ce.detach() / masks.hidden.sum(), "masked": masks.hidden.float().mean(),
                    "accuracy": (logits.argmax(-1) == targets).float().mean()}
        weight = 0.0 if self.cfg.critic is None else self.cfg.critic.joint_weight
        if weight:
            with torch.no_grad():
                drawn = draw_tokens(logits.float(), rng.rand(ids.shape[1])[masks.hidden])  # [M]
            filled = ids.masked_scatter(masks.hidden, drawn)  # [B, N]: the generator's tokens where it was asked
            critic, critic_logs = self.critic_bce(filled, masks.hidden, batch, drop, real, (context, context_mask))
            loss = loss + weight * critic
            logs.update({f"critic_{k}": v for k, v in critic_logs.items()})
            logs["critic_changed"] = (drawn != targets).float().mean()
        return loss, logs

    def global_real_positions(self, batch: Batch, n: int) -> Tensor | None:
        """`real_positions` of every sample of the step [G, N] when the batch's clips carry a frame mask (None: every
        position is real; image batches)."""
        if "frame_mask" not in batch:
            return None
        return self.real_positions(global_rows(batch, "frame_mask"), n)

    def training_masks(self, rng: BatchRandom, n: int, real: Tensor | None = None) -> TrainingMasks:
        """The positions hidden in training and scored (bool [B, N], True = hidden), and how many the whole global
        batch scores (the loss's denominator): MaskGIT's ⌈γ(r)·N⌉ uniformly random positions per
        sample. `real` bool [G, N]: the real positions of every sample of the step (clips with padding): ⌈γ(r)·N_real⌉
        of those alone."""
        r_all = rng.rand_global()  # [G]: the mask ratio draw of every sample of the step
        counted = n if real is None else real.sum(1)  # positions per sample that may be hidden
        masked_total = hidden_count(r_all, counted, self.cfg.mask_schedule).sum()  # every masked token of the step
        real_rows = None if real is None else rng.rows(real)
        mask = training_mask(rng.rows(r_all), rng.rand(n), self.cfg.mask_schedule, real_rows)
        return TrainingMasks(mask, masked_total)

    def critic_loss(self, batch: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        """Token-Critic (Lezama et al. 2022, §3.2, eq. 4) as a phase of its own: mask ids as in training (γ(r)·N
        random positions), fill the masked positions with tokens sampled from the generator (no gradient,
        conditioned), and train the critic to tell which positions were filled (`critic_bce`); a share
        model.critic.cond_dropout_prob of the samples without the condition (phenaki-pytorch trains its critic
        with the generator's condition dropout), so the critic can be guided."""
        ids = self.to_tokens(batch)  # [B, N]
        rng = batch["rng"]
        real = self.global_real_positions(batch, ids.shape[1])
        real = None if real is None else rng.rows(real)  # [B, N]
        mask = training_mask(rng.rand(), rng.rand(ids.shape[1]), self.cfg.mask_schedule, real)  # [B, N] True = filled
        keep = torch.zeros(len(ids), dtype=torch.bool, device=ids.device)
        with torch.no_grad():
            context, context_mask = self.context(batch, keep)
            logits = self.model(ids.masked_fill(mask, self.model.mask_id), context, context_mask, real)[mask].float()
            drawn = draw_tokens(logits, rng.rand(ids.shape[1])[mask])  # [M]
            filled = ids.masked_scatter(mask, drawn)  # [B, N]
        prob = self.cfg.critic.cond_dropout_prob
        drop = rng.rand() < prob if prob else keep  # [B]: drawn last, so the masks and fills stay those of prob 0
        loss, logs = self.critic_bce(filled, mask, batch, drop, real)
        logs["changed"] = (drawn != ids[mask]).float().mean()  # share of filled tokens unlike the real ones
        return loss, logs

    def critic_context(self, cond: dict[str, Any], drop: Tensor,
                       generator_context: tuple[Tensor, Tensor] | None = None,
                       text_key: str = "text") -> tuple[Tensor, Tensor]:
        """The condition as the critic reads it: a separate critic's own projection of it; a self critic's is the
        generator's (`generator_context` when the caller has it)."""
        if self.cfg.critic.kind == "self":
            return generator_context or self.context(cond, drop, text_key=text_key)
        return self.context(cond, drop, text_key=text_key, transformer=self.model.critic)

    def critic_scores(self, ids: Tensor, context: tuple[Tensor, Tensor], real: Tensor | None = None) -> Tensor:
        """The critic's logit of "filled in by the generator" for every token of ids [B, N] -> [B, N], given its
        `critic_context`: a separate critic's head, or a self critic's head over the generator's hidden states."""
        if self.cfg.critic.kind == "self":
            return self.model.critic_head(self.model.hidden(ids, *context, real))[..., 0]
        return self.model.critic(ids, *context, real)[..., 0]

    def critic_bce(self, filled: Tensor, mask: Tensor, cond: dict[str, Any], drop: Tensor, real: Tensor | None,
                   generator_context: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Token-Critic's objective (eq. 4): binary cross-entropy of `critic_scores(filled)` against `mask` (True =
        filled by the generator) over the real positions, and its accuracy."""
        context = self.critic_context(cond, drop, generator_context)
        scores = self.critic_scores(filled, context, real)  # [B, N]
        real = torch.ones_like(mask) if real is None else real
        loss = F.binary_cross_entropy_with_logits(scores[real].float(), mask[real].float())
        with torch.no_grad():
            logs = {"bce": loss.detach(), "accuracy": ((scores > 0) == mask)[real].float().mean()}
        return loss, logs

    # ------------------------------------------------------------------------------------------ sampling
    def resolve(self, options: SampleOptions | None = None) -> MaskedSampleOptions:
        """Unset steps, guidance scale, temperatures, their annealing and whether to decode with the critic and to
        guide it from the model section; ValueError for --critic or --critic-guidance without a token critic, or
        --critic-guidance with a critic never trained without the condition."""
        c = self.cfg
        options = super().resolve(options)
        for name in ("critic", "critic_guidance"):
            if getattr(options, name) and c.critic is None:
                raise ValueError(f"--{name.replace('_', '-')}: this run has no token critic (model.critic)")
        if options.critic_guidance:
            c.critic.check_guidance("--critic-guidance")
        return options.filled(steps=c.sample_steps, cfg_scale=c.cfg_scale, temperature=c.temperature,
                              choice_temperature=c.choice_temperature, temperature_anneal=c.temperature_anneal,
                              critic=None if c.critic is None else c.critic.sample,
                              critic_guidance=None if c.critic is None else c.critic.guidance)

    def sample_conditions(self, n: int, generator: torch.Generator, options: MaskedSampleOptions) -> Batch:
        """Prompts (--prompt, --prompts, model.sample_prompts, else the held-out captions with their labels and
        directions, as the data hands them), or labels (--label, else every class in turn)."""
        device = generator.device
        if self.cfg.conditioning == "class":
            return class_conditions(n, self.num_classes, options.label, device)
        if self.cfg.conditioning == "none":
            if options.prompt or options.prompts or options.label is not None:
                raise ValueError("this model is unconditional (model.conditioning=none): no --prompt or --label")
            return Batch()
        if options.label is not None:
            raise ValueError("--label: this model is text-conditioned; use --prompt")
        cond: dict[str, Any] = {}
        prompts = options.given_prompts(n)
        if prompts or self.cfg.sample_prompts:
            cond["text"] = prompts or [self.cfg.sample_prompts[i % len(self.cfg.sample_prompts)] for i in range(n)]
        else:
            held = self.heldout.conditions(n) if self.heldout is not None else {}
            if "text" not in held:
                raise ValueError("no prompts: the data has no held-out captions; pass --prompt or --prompts FILE, or "
                                 "set model.sample_prompts")
            cond.update({k: v.to(device) if isinstance(v, Tensor) else v for k, v in held.items()})
        if options.negative_prompt:
            cond["negative_text"] = [options.negative_prompt] * n
        return Batch(**cond)

    def guidance_scale(self, options: MaskedSampleOptions) -> float:
        """The guidance scale decoding runs at: the resolved one, 1 (none) for an unconditional model."""
        return options.cfg_scale if self.cfg.conditioning != "none" else 1.0

    def uses_critic(self, options: MaskedSampleOptions) -> bool:
        """Whether decoding re-masks by the token critic's scores (a run with a critic, asked to)."""
        return self.cfg.critic is not None and bool(options.critic)

    def critic_guided(self, options: MaskedSampleOptions) -> bool:
        """Whether the critic's scores are guided as the generator's logits (decoding is guided and asked to)."""
        return self.uses_critic(options) and bool(options.critic_guidance) and self.guidance_scale(options) > 1.0

    def sampler_settings(self, options: MaskedSampleOptions) -> dict[str, Any]:
        c = self.cfg
        settings = {"sampler": "maskgit", "steps": options.steps, "cfg_scale": self.guidance_scale(options),
                    "temperature": options.temperature, "choice_temperature": options.choice_temperature,
                    "temperature_anneal": options.temperature_anneal, "mask_schedule": c.mask_schedule}
        if options.negative_prompt:
            settings.update(negative_prompt=options.negative_prompt)
        if c.critic is not None:
            settings.update(critic=self.uses_critic(options))
            if self.uses_critic(options):
                settings.update(critic_noise=c.critic.noise, critic_guidance=self.critic_guided(options))
        return settings

    @torch.no_grad()
    def sample(self, cond: Batch, generator: torch.Generator, n: int, options: MaskedSampleOptions,
               progress: bool = False, initial: Tensor | None = None) -> Tensor:
        """Iterative parallel decoding (MaskGIT §3.2) with classifier-free guidance: logits = u + s·(c − u), the
        unconditional branch u from the null context or the negative prompt, and with a token critic its scores
        (guided the same way with critic_guidance, `critic_choice`); images (clips) in [-1, 1].
        `initial` (ids [n, ...code_shape], mask_id where to generate) keeps the known tokens (masking.decode)."""
        device = self.model.head.weight.device
        keep = torch.zeros(n, dtype=torch.bool, device=device)
        context, context_mask = self.context(cond, keep)
        scale = self.guidance_scale(options)
        guided = scale > 1.0
        if guided:
            if "negative_text" in cond:
                uncond, uncond_mask = self.context(cond, keep, text_key="negative_text")
            else:
                uncond, uncond_mask = self.context(cond, ~keep)
            context, context_mask = _stack_contexts((context, context_mask), (uncond, uncond_mask))

        def logits_fn(ids: Tensor) -> Tensor:
            if not guided:
                return self.model(ids, context, context_mask)
            cond_logits, uncond_logits = self.model(torch.cat([ids, ids]), context, context_mask).float().chunk(2)
            return guided_logits(cond_logits, uncond_logits, scale)

        critic = self.uses_critic(options)
        critic_fn = self.critic_choice(cond, keep, options) if critic else None
        shape = self.code_shape(n, options)

        def run(start: Tensor | None, generate: Tensor | None) -> Tensor:
            return decode(logits_fn, n, math.prod(shape[1:]), self.model.mask_id, options.steps, generator, device,
                          temperature=options.temperature, choice_temperature=options.choice_temperature,
                          schedule=self.cfg.mask_schedule, initial=start, critic=critic_fn,
                          critic_noise=self.cfg.critic.noise if critic else 0.0, generate=generate,
                          temperature_anneal=options.temperature_anneal)

        ids = self.decode_in_order(run, shape, None if initial is None else initial.flatten(1), options)  # [n, N]
        images = held_on(self.token_codec, ids.device).decode(ids.view(shape))  # [B, C, H, W] or [B, C, T, H, W]
        return images.float().clamp(-1, 1)

    def critic_choice(self, cond: dict[str, Any], keep: Tensor,
                      options: MaskedSampleOptions) -> Callable[[Tensor], Tensor]:
        """Token-Critic's choice of what to re-mask, ids [n, N] -> [n, N], high = looks real: minus the critic's
        logit of "sampled". When `critic_guided`, the logits are guided as the generator's, u + s·(c − u) at the
        guidance scale s, u under the null context or the negative prompt (phenaki-pytorch's
        critic.forward_with_cond_scale)."""
        context = self.critic_context(cond, keep)
        if not self.critic_guided(options):
            return lambda ids: -self.critic_scores(ids, context)
        if "negative_text" in cond:
            uncond = self.critic_context(cond, keep, text_key="negative_text")
        else:
            uncond = self.critic_context(cond, ~keep)
        both, scale = _stack_contexts(context, uncond), self.guidance_scale(options)

        def guided(ids: Tensor) -> Tensor:
            c, u = self.critic_scores(torch.cat([ids, ids]), both).float().chunk(2)
            return -guided_logits(c, u, scale)
        return guided

    def decode_in_order(self, run: DecodeRun, shape: tuple[int, ...], initial: Tensor | None,
                        options: MaskedSampleOptions) -> Tensor:
        """ids [n, N] of `shape` from `run(start ids, positions to decode or None = every masked one)`, one
        `masking.decode`; a subclass may decode the positions in several passes (phenaki: token frame by frame)."""
        return run(initial, None)  # MaskGIT: every masked position together


def draw_tokens(logits: Tensor, uniforms: Tensor) -> Tensor:
    """One token per row of logits [M, K] drawn from softmax(logits) by inverting its CDF at `uniforms` [M] in
    [0, 1) -> long [M] (the caller's seeded draws, so resume is exact)."""
    cdf = logits.softmax(-1).cumsum(-1)  # [M, K]
    return (cdf < uniforms[:, None] * cdf[:, -1:]).sum(-1)


def critic_head(width: int) -> nn.Linear:
    """A self critic (phenaki-pytorch's SelfCritic): one logit of "filled in" per token from the generator's hidden
    states [B, N, width]."""
    head = nn.Linear(width, 1)
    nn.init.normal_(head.weight, std=0.02)
    nn.init.zeros_(head.bias)
    return head


def token_critic(trunk: MaskTransformer) -> MaskTransformer:
    """A token critic from a mask transformer: its head gives one logit per token (of "filled in by the generator")
    instead of a distribution over the codebook."""
    trunk.head = critic_head(trunk.head.in_features)
    return trunk


def _stack_contexts(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Two (context [B, L_i, D], mask [B, L_i]) stacked along the batch, padded to the longer L (masked out)."""
    length = max(a[0].shape[1], b[0].shape[1])

    def pad(ctx: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        extra = length - ctx.shape[1]
        return F.pad(ctx, (0, 0, 0, extra)), F.pad(mask, (0, extra), value=False)

    (ca, ma), (cb, mb) = pad(*a), pad(*b)
    return torch.cat([ca, cb]), torch.cat([ma, mb])
