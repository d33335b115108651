"""phenaki as a Task: the shared masked-token objective and guided decoding (genforge/masked/task.py) over a
video tokenizer's ids [B, t, h, w] (a cvivit run, or the colour stand-in), with factorised positions; samples are
clips [B, C, T, H, W], any 1 + k·(temporal patch) frames (`genforge sample --frames`), or stories: one clip per
prompt of a sequence, each continuing the last (`genforge sample --story`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from genforge.core.family import BuildContext
from genforge.core.random import BatchRandom
from genforge.core.task import Batch
from genforge.families.phenaki.model import VideoMaskTransformer
from genforge.masked.masking import frame_hidden_count, frame_training_mask, hidden_count, training_mask
from genforge.masked.task import DecodeRun, MaskedTokenTask


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
                                    self.cfg.dropout, text_dim=text_dim, num_classes=self.num_classes)

    def code_shape(self, n: int, **opts: Any) -> tuple[int, ...]:
        """[n, t, h, w] for clips of `frames` frames (default data.video.num_frames): 1 + (frames − 1) / temporal
        patch token frames."""
        frames = opts.get("frames") or self.num_frames
        if (frames - 1) % self.temporal_downsample:
            raise ValueError(f"--frames {frames}: the tokenizer makes clips of 1 + k·{self.temporal_downsample} "
                             f"frames, e.g. {1 + self.temporal_downsample * max(1, (frames - 1) // self.temporal_downsample)}")
        return (n, 1 + (frames - 1) // self.temporal_downsample, self.grid, self.grid)

    def training_masks(self, rng: BatchRandom, n: int) -> tuple[Tensor, Tensor]:
        """MaskGIT's uniform masks; with model.frame_order_prob, that share of the clips masked in frame order
        (`masking.frame_training_mask`: what decoding token frame by token frame conditions on)."""
        prob = self.cfg.frame_order_prob
        if not prob:
            return super().training_masks(rng, n)
        per_frame, schedule = self.model.tokens_per_frame, self.cfg.mask_schedule
        frames = n // per_frame  # 1 for an image step (data.images)
        r_all, ordered_all = rng.rand_global(), rng.rand_global() < prob  # [G] each: every sample of the step
        frame_all = (rng.rand_global() * frames).long().clamp(max=frames - 1)  # [G]: the frame being decoded
        counts = torch.where(ordered_all, frame_hidden_count(r_all, frame_all, per_frame, frames, schedule),
                             hidden_count(r_all, n, schedule))
        r, ordered, frame = rng.rows(r_all), rng.rows(ordered_all), rng.rows(frame_all)
        uniform = training_mask(r, rng.rand(n), schedule)  # [B, N]
        in_order = frame_training_mask(r, frame, rng.rand(per_frame), frames, schedule)  # [B, N]
        return torch.where(ordered[:, None], in_order, uniform), counts.sum()

    def decode_in_order(self, run: DecodeRun, shape: tuple[int, ...], initial: Tensor | None,
                        settings: dict[str, Any]) -> Tensor:
        """decode_order=frames: token frame after token frame, each with all its iterations, the later frames
        still masked (a story's carried frames, already known, are skipped); parallel: MaskGIT's order."""
        if settings["decode_order"] != "frames":
            return super().decode_in_order(run, shape, initial, settings)
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

    def sampler_settings(self, **opts: Any) -> dict[str, Any]:
        settings = {**super().sampler_settings(**opts), "frames": opts.get("frames") or self.num_frames,
                    "decode_order": opts.get("decode_order") or self.cfg.decode_order}
        if opts.get("story"):
            t = self.code_shape(1, **opts)[1]
            settings.update(story_chapters=len(opts["story"]), story_context_frames=self.story_context(t)[1])
        return settings

    def story_context(self, token_frames: int) -> tuple[int, int]:
        """(token frames, video frames) a story chapter carries over from the previous one: the last half of a
        clip's token frames (at least one), i.e. its last 1 + (k − 1)·(temporal patch) frames re-encoded."""
        carried = max(1, (token_frames - 1) // 2)
        return carried, 1 + (carried - 1) * self.temporal_downsample

    def sample_conditions(self, n: int, generator: torch.Generator, **opts: Any) -> Batch:
        """As MaskGIT's; with `story` (a list of prompts), each sample's caption is the whole story."""
        if opts.get("story"):
            if opts.get("prompt") or opts.get("prompts"):
                raise ValueError("--story and --prompt/--prompts: give one of them")
            return Batch(text=[" / ".join(opts["story"])] * n)
        return super().sample_conditions(n, generator, **opts)

    @torch.no_grad()
    def sample(self, cond: Batch, generator: torch.Generator, n: int, initial: Tensor | None = None,
               **opts: Any) -> Tensor:
        """Clips [n, C, T, H, W]; with `story` (prompts p_1 … p_m), Phenaki's story mode (§2.3, Fig. 1): the clip of
        p_1, then for each next prompt the last video frames of the story so far are re-encoded by the causal
        tokenizer (`story_context`), kept as the first token frames, and the rest decoded with the new prompt;
        each chapter adds its frames after the carried ones: T = F + (m − 1)·(F − carried video frames)."""
        story = opts.pop("story", None)
        if not story:
            return super().sample(cond, generator, n, initial=initial, **opts)
        shape = self.code_shape(n, **opts)  # [n, t, h, w]
        carried, carried_frames = self.story_context(shape[1])
        others = {k: v for k, v in cond.items() if k != "text"}
        video = super().sample(Batch(**others, text=[story[0]] * n), generator, n, **opts)  # [n, C, F, H, W]
        for prompt in story[1:]:
            known = self.token_codec.encode(video[:, :, -carried_frames:])  # [n, carried, h, w]
            initial = torch.full(shape, self.model.mask_id, dtype=torch.long, device=known.device)
            initial[:, :carried] = known
            clip = super().sample(Batch(**others, text=[prompt] * n), generator, n, initial=initial, **opts)
            video = torch.cat([video, clip[:, :, carried_frames:]], dim=2)
        return video
