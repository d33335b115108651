"""phenaki as a Task: the shared masked-token objective and guided decoding (genforge/masked_base/task.py) over a
video tokenizer's ids [B, t, h, w] (a cvivit run, or the colour stand-in), with factorised positions; samples are
clips [B, C, T, H, W], any 1 + k·(temporal patch) frames (`genforge sample --frames`)."""

from __future__ import annotations

from typing import Any

from genforge.core.family import BuildContext
from genforge.families.phenaki.model import VideoMaskTransformer
from genforge.masked_base.task import MaskedTokenTask


class PhenakiTask(MaskedTokenTask):
    """Phenaki's text-to-video transformer over the t×h×w ids of clips of data.video.num_frames frames."""

    prompt_source = "moving_shapes"

    def build_model(self, ctx: BuildContext, source: str, text_dim: int) -> VideoMaskTransformer:
        cfg, codec = self.cfg, self.token_codec
        temporal = getattr(codec, "temporal_downsample", None)
        if temporal is None:
            raise ValueError(f"model.tokens: {source} is an image tokenizer; phenaki needs a video tokenizer (a "
                             "cvivit run)")
        self.temporal_downsample = int(temporal)
        self.frames, self.grid = cfg.check_tokens(ctx.data, int(codec.downsample), self.temporal_downsample,
                                                  self.codebook_size, source)
        self.num_frames = ctx.data.video.num_frames
        return VideoMaskTransformer(self.codebook_size, self.grid**2, cfg.width, cfg.depth, cfg.num_heads,
                                    cfg.mlp_ratio, cfg.dropout, text_dim=text_dim, num_classes=self.num_classes)

    def code_shape(self, n: int, **opts: Any) -> tuple[int, ...]:
        """[n, t, h, w] for clips of `frames` frames (default data.video.num_frames): 1 + (frames − 1) / temporal
        patch token frames."""
        frames = opts.get("frames") or self.num_frames
        if (frames - 1) % self.temporal_downsample:
            raise ValueError(f"--frames {frames}: the tokenizer makes clips of 1 + k·{self.temporal_downsample} "
                             f"frames, e.g. {1 + self.temporal_downsample * max(1, (frames - 1) // self.temporal_downsample)}")
        return (n, 1 + (frames - 1) // self.temporal_downsample, self.grid, self.grid)

    def sampler_settings(self, **opts: Any) -> dict[str, Any]:
        return {**super().sampler_settings(**opts), "frames": opts.get("frames") or self.num_frames}
