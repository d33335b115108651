"""phenaki as a Task: the shared masked-token objective and guided decoding (genforge/masked/task.py) over a
video tokenizer's ids [B, t, h, w] (a cvivit run, or the colour stand-in), with factorised positions; samples are
clips [B, C, T, H, W], any 1 + k·(temporal patch) frames (`genforge sample --frames`), or stories: one clip per
prompt of a sequence, each continuing the last (`genforge sample --story`). Padded clips (data.video.min_frames):
a token frame is real when all its video frames (and every earlier one) are (`core.codec.token_frame_mask`); the
others are never hidden, targets or counted, and self-attention never attends to them (a key mask)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from genforge.core.codec import token_frame_mask
from genforge.core.config import SampleOptions, TrainConfig
from genforge.core.family import BuildContext
from genforge.core.random import BatchRandom
from genforge.core.task import Batch
from genforge.families.phenaki.config import PhenakiSampleOptions
from genforge.families.phenaki.model import VideoMaskTransformer
from genforge.masked.masking import frame_hidden_count, frame_training_mask, hidden_count, training_mask
from genforge.masked.task import DecodeRun, MaskedTokenTask, TrainingMasks


class PhenakiTask(MaskedTokenTask):
    """Phenaki's text-to-video transformer over the t×h×w ids of clips of data.video.num_frames frames."""

    def build_model(self, ctx: BuildContext, source: str, text_dim: int) -> VideoMaskTransformer:
        cfg, codec = self.cfg, self.token_codec
        temporal = getattr(codec, "temporal_downsample", None)
        if temporal is None:
            raise ValueError(f"model.tokens: {source} is an image tokenizer; phenaki needs a video tokenizer (a "
                             "cvivit run)")
        self.temporal_downsample = int(temporal)
        clips = ctx.pixels  # a video token cache: the clips it was encoded from
        self.frames, self.grid = cfg.check_tokens(clips, int(codec.downsample), self.temporal_downsample,
                                                  self.codebook_size, source)
        self.num_frames = clips.video.num_frames
        return self.make_transformer(cfg.width, cfg.depth, cfg.num_heads, text_dim)

    def make_transformer(self, width: int, depth: int, num_heads: int, text_dim: int) -> VideoMaskTransformer:
        return VideoMaskTransformer(self.codebook_size, self.grid**2, width, depth, num_heads, self.cfg.mlp_ratio,
                                    self.cfg.dropout, text_dim=text_dim, num_classes=self.num_classes,
                                    positions=self.cfg.positions, modulation=self.cfg.adaln)

    def clip_shape(self, n: int, frames: int) -> tuple[int, ...]:
        """[n, t, h, w] for clips of `frames` frames: 1 + (frames − 1) / temporal patch token frames; ValueError
        naming --frames when the tokenizer cannot make clips of that length."""
        if (frames - 1) % self.temporal_downsample:
            raise ValueError(f"--frames {frames}: the tokenizer makes clips of 1 + k·{self.temporal_downsample} "
                             f"frames, e.g. {1 + self.temporal_downsample * max(1, (frames - 1) // self.temporal_downsample)}")
        return (n, 1 + (frames - 1) // self.temporal_downsample, self.grid, self.grid)

    def code_shape(self, n: int, options: PhenakiSampleOptions) -> tuple[int, ...]:
        """The ids of n clips of `options.frames` frames (`clip_shape`)."""
        return self.clip_shape(n, options.frames)

    def real_positions(self, frame_mask: Tensor, n: int) -> Tensor:
        """The positions of the real token frames (`token_frame_mask` of the tokenizer's temporal patch): a token
        frame mixing real and padded video frames is padding."""
        tokens = token_frame_mask(frame_mask, self.temporal_downsample)  # [B, t]
        if tokens.shape[1] * self.model.tokens_per_frame != n:
            raise ValueError(f"a frame mask of {frame_mask.shape[1]} frames ({tokens.shape[1]} token frames) does not "
                             f"match clips of {n // self.model.tokens_per_frame} token frames")
        return tokens.repeat_interleave(self.model.tokens_per_frame, dim=1)  # [B, N]

    def loss(self, batch: Batch, phase: str, step: int) -> tuple[Tensor, dict[str, Tensor]]:
        """The masked-token objective; on the first token frame of each clip alone (`first_frames`) during the
        curriculum's first `model.first_frame_steps` steps and every `model.first_frame_every`-th step after."""
        if phase == "main" and self.cfg.first_frame_step(step):
            batch = first_frames(batch, self.model.tokens_per_frame)
        return super().loss(batch, phase, step)

    def training_masks(self, rng: BatchRandom, n: int, real: Tensor | None = None) -> TrainingMasks:
        """MaskGIT's uniform masks; with model.frame_order_prob, that share of the clips masked in frame order
        (`masking.frame_training_mask`: what decoding token frame by token frame conditions on), every hidden token
        scored, the later token frames' too. With `real` (clips with padding), the frame being decoded is drawn among
        each clip's real token frames and the frames after it are hidden up to its last real one."""
        prob = self.cfg.frame_order_prob
        if not prob:
            return super().training_masks(rng, n, real)
        per_frame, schedule = self.model.tokens_per_frame, self.cfg.mask_schedule
        frames = n // per_frame  # 1 for an image step (data.images)
        real_frames = frames if real is None else real[:, ::per_frame].sum(1)  # [G]: a prefix of real token frames
        r_all, ordered_all = rng.rand_global(), rng.rand_global() < prob  # [G] each: every sample of the step
        frame_all = (rng.rand_global() * real_frames).long().clamp(max=real_frames - 1)  # [G]: the frame decoded
        counts = torch.where(ordered_all, frame_hidden_count(r_all, frame_all, per_frame, real_frames, schedule),
                             hidden_count(r_all, n if real is None else real.sum(1), schedule))
        if real is not None:
            counts = counts * (real_frames > 0)  # the all-padding row of a sample a stream dropped hides nothing
        r, ordered, frame = rng.rows(r_all), rng.rows(ordered_all), rng.rows(frame_all)
        real_rows = None if real is None else rng.rows(real)
        uniform = training_mask(r, rng.rand(n), schedule, real_rows)  # [B, N]
        in_order = frame_training_mask(r, frame, rng.rand(per_frame), frames, schedule)  # [B, N]
        if real_rows is not None:
            in_order = in_order & real_rows  # the later frames up to the last real one
        hidden = torch.where(ordered[:, None], in_order, uniform)
        return TrainingMasks(hidden, counts.sum())

    def decode_in_order(self, run: DecodeRun, shape: tuple[int, ...], initial: Tensor | None,
                        options: PhenakiSampleOptions) -> Tensor:
        """decode_order=frames: token frame after token frame, each with all its iterations, the later frames
        still masked (a story's carried frames, already known, are skipped); parallel: MaskGIT's order."""
        if options.decode_order != "frames":
            return super().decode_in_order(run, shape, initial, options)
        n, frames, per_frame = shape[0], shape[1], shape[2] * shape[3]
        mask_id = self.model.mask_id
        ids = initial if initial is not None else torch.full(
            (n, frames * per_frame), mask_id, dtype=torch.long, device=self.model.head.weight.device)
        for frame in range(frames):
            region = torch.zeros(frames * per_frame, dtype=torch.bool, device=ids.device)  # [N]
            region[frame * per_frame : (frame + 1) * per_frame] = True
            if bool((ids[:, region] == mask_id).any()):
                ids = run(ids, region)
        return ids

    def resolve(self, options: SampleOptions | None = None) -> PhenakiSampleOptions:
        """MaskGIT's, and unset frames from the training clips' (data.video.num_frames), decode_order from the model
        section."""
        return super().resolve(options).filled(frames=self.num_frames,
                                                                        decode_order=self.cfg.decode_order)

    def preview_options(self, train: TrainConfig) -> PhenakiSampleOptions:
        """Previews of clips of train.sample_frames frames (default: the training clips')."""
        return self.resolve(PhenakiSampleOptions(frames=train.sample_frames))

    def sampler_settings(self, options: PhenakiSampleOptions) -> dict[str, Any]:
        """MaskGIT's settings, the clip length (checked against the tokenizer's layout), the decoding order, and a
        story's chapters or a prime's frames."""
        self.clip_shape(1, options.frames)  # 1 + k·temporal patch frames, or a ValueError saying which would do
        settings = {**super().sampler_settings(options), "frames": options.frames,
                    "decode_order": options.decode_order}
        if options.story:
            chapters = self.chapters(options.story, options.frames)
            settings.update(story=[{"prompt": c.prompt, "frames": c.frames, "carried": c.carried} for c in chapters])
        if options.prime is not None:
            settings.update(prime_frames=self.prime_length(options.prime.shape[2], options.frames))
        return settings

    # ------------------------------------------------------------------------------------- continuing clips
    def story_context(self, token_frames: int) -> tuple[int, int]:
        """(token frames, video frames) a story chapter carries over from the previous one by default: the last
        half of a clip's token frames (at least one), i.e. its last 1 + (k − 1)·(temporal patch) frames re-encoded."""
        carried = max(1, (token_frames - 1) // 2)
        return carried, 1 + (carried - 1) * self.temporal_downsample

    def carried_tokens(self, carried_frames: int, frames: int, name: str) -> int:
        """Token frames of `carried_frames` video frames kept from a context in a clip of `frames` frames; ValueError
        naming `name` unless they are 1 + k·(temporal patch) and leave a token frame to generate."""
        patch = self.temporal_downsample
        if carried_frames < 1 or (carried_frames - 1) % patch or carried_frames > frames - patch:
            raise ValueError(f"{name}: {carried_frames} carried frames; they must be 1 + k·{patch} and leave at "
                             f"least {patch} of the clip's {frames} frames to generate")
        return 1 + (carried_frames - 1) // patch

    def prime_length(self, given: int, frames: int) -> int:
        """Video frames of a prime of `given` frames that start a clip of `frames`: as many of its last frames as
        make whole token frames and leave one token frame to generate."""
        usable = min(given, frames - self.temporal_downsample)
        return 1 + (usable - 1) // self.temporal_downsample * self.temporal_downsample

    def chapters(self, lines: list[str], frames: int) -> list[Chapter]:
        """A story file's chapters (`prompt [| frames [| carried frames]]` per line), with the clip length and the
        frames carried into each chapter filled in and checked; ValueError naming --story and the line."""
        chapters = []
        for number, line in enumerate(lines, start=1):
            parts = [part.strip() for part in line.split("|")]
            try:
                numbers = [int(part) for part in parts[1:]]
            except ValueError:
                numbers = []
            if not parts[0] or len(parts) > 3 or len(numbers) != len(parts) - 1:
                raise ValueError(f"--story line {number} {line!r}: expected 'prompt', 'prompt | frames' or "
                                 "'prompt | frames | carried frames'")
            length = numbers[0] if numbers else frames
            if number == 1 and len(numbers) > 1:
                raise ValueError(f"--story line 1 {line!r}: the first chapter carries no frames (it starts the story)")
            try:
                token_frames = self.clip_shape(1, length)[1]
                carried = None
                if number > 1:
                    carried = numbers[1] if len(numbers) > 1 else self.story_context(token_frames)[1]
                    self.carried_tokens(carried, length, "carried frames")
            except ValueError as err:
                raise ValueError(f"--story line {number} {line!r}: {err}") from None
            chapters.append(Chapter(parts[0], length, carried))
        return chapters

    def sample_conditions(self, n: int, generator: torch.Generator, options: PhenakiSampleOptions) -> Batch:
        """As MaskGIT's; with `story` (a list of chapters), each sample's caption is the whole story's prompts."""
        if options.story:
            if options.prompt or options.prompts:
                raise ValueError("--story and --prompt/--prompts: give one of them")
            return Batch(text=[" / ".join(c.prompt for c in self.chapters(options.story, self.num_frames))] * n)
        return super().sample_conditions(n, generator, options)

    @torch.no_grad()
    def continue_clip(self, context: Tensor, carried_frames: int, cond: Batch, generator: torch.Generator, n: int,
                      options: PhenakiSampleOptions) -> Tensor:
        """A clip [n, C, F, H, W] of `options.frames` frames that starts with the last `carried_frames` frames of
        `context` [n, C, T', H, W] re-encoded by the causal tokenizer (their tokens kept) and goes on as `cond`
        prompts (Phenaki §2.3)."""
        shape = self.code_shape(n, options)  # [n, t, h, w]
        carried = self.carried_tokens(carried_frames, options.frames, "carried frames")
        known = self.token_codec.encode(context[:, :, -carried_frames:])  # [n, carried, h, w]
        initial = torch.full(shape, self.model.mask_id, dtype=torch.long, device=known.device)
        initial[:, :carried] = known
        return super().sample(cond, generator, n, options, initial=initial)

    @torch.no_grad()
    def sample(self, cond: Batch, generator: torch.Generator, n: int, options: PhenakiSampleOptions,
               progress: bool = False, initial: Tensor | None = None) -> Tensor:
        """Clips [n, C, T, H, W]. With `prime` (a clip [1 or n, C, P, H, W]) the clip starts with the prime's last
        `prime_length` frames through the tokenizer and goes on as prompted. With `story` (chapter lines), Phenaki's
        story mode (§2.3, Fig. 1): the first chapter's clip (primed, if a prime is given), then for each next chapter
        the last `carried` video frames of the story so far are re-encoded by the causal tokenizer, kept as the first
        token frames, and the rest decoded with the chapter's prompt; each chapter adds its frames after the carried
        ones: T = F_1 + Σ (F_i − carried_i)."""
        story, prime = options.story, options.prime
        if not story and prime is None:
            return super().sample(cond, generator, n, options, initial=initial)
        chapters = self.chapters(story, options.frames) if story else [Chapter("", options.frames, None)]
        others = {k: v for k, v in cond.items() if k != "text"}
        first = Batch(**others, text=[chapters[0].prompt] * n) if story else cond
        if prime is None:
            video = super().sample(first, generator, n, clip_options(options, chapters[0]))  # [n, C, F, H, W]
        else:
            prime = prime.to(self.model.head.weight.device).expand(n, -1, -1, -1, -1)
            video = self.continue_clip(prime, self.prime_length(prime.shape[2], chapters[0].frames), first, generator,
                                       n, clip_options(options, chapters[0]))
        for chapter in chapters[1:]:
            clip = self.continue_clip(video, chapter.carried, Batch(**others, text=[chapter.prompt] * n), generator, n,
                                      clip_options(options, chapter))
            video = torch.cat([video, clip[:, :, chapter.carried :]], dim=2)
        return video


def first_frames(batch: Batch, tokens_per_frame: int) -> Batch:
    """The batch as its clips' first frames: `video` [B, C, 1, H, W] (the causal tokenizer's first token frame
    depends on frame 0 alone, so its ids are the clip's first token frame's), cached `tokens` [B, h·w] of
    [B, t·h·w], `frame_mask` [B, 1] (here and in `global_batch`); the rest (captions, the random stream) as it is."""
    sliced = {"video": lambda v: v[:, :, :1], "tokens": lambda v: v[:, :tokens_per_frame],
              "frame_mask": lambda v: v[:, :1]}
    out = Batch({k: sliced[k](v) if k in sliced else v for k, v in batch.items()})
    if "global_batch" in batch:
        out["global_batch"] = {k: sliced[k](v) if k in sliced else v for k, v in batch["global_batch"].items()}
    return out


@dataclass(frozen=True)
class Chapter:
    """A story chapter: its prompt, its clip's frames and the frames it carries over from the story so far (None
    for the first chapter)."""

    prompt: str
    frames: int
    carried: int | None


def clip_options(options: PhenakiSampleOptions, chapter: Chapter) -> PhenakiSampleOptions:
    """The options of one clip of a story or primed sample: the chapter's length, no story and no prime."""
    return options.model_copy(update={"frames": chapter.frames, "story": None, "prime": None})
