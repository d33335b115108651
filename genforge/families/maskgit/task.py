"""maskgit as a Task: the shared masked-token objective and decoding (genforge/masked/task.py) over an image
tokenizer's ids [B, h, w], with learned positions, one per token (MUSE)."""

from __future__ import annotations

from genforge.core.family import BuildContext
from genforge.masked.config import MaskedSampleOptions
from genforge.masked.task import MaskedTokenTask
from genforge.masked.transformer import MaskTransformer


class MaskGITTask(MaskedTokenTask):
    """MaskGIT / MUSE over the h×w token grid of an image tokenizer at data.image_size."""

    def build_model(self, ctx: BuildContext, source: str, text_dim: int) -> MaskTransformer:
        cfg = self.cfg
        downsample = int(self.token_codec.downsample)
        cfg.check_tokens(ctx.info.image_size, downsample, self.codebook_size, source, source)
        self.grid = ctx.info.image_size // downsample  # tokens per side
        return self.make_transformer(cfg.width, cfg.depth, cfg.num_heads, text_dim)

    def make_transformer(self, width: int, depth: int, num_heads: int, text_dim: int) -> MaskTransformer:
        return MaskTransformer(self.codebook_size, self.grid**2, width, depth, num_heads, self.cfg.mlp_ratio,
                               self.cfg.dropout, text_dim=text_dim, num_classes=self.num_classes,
                               modulation=self.cfg.adaln)

    def code_shape(self, n: int, options: MaskedSampleOptions) -> tuple[int, ...]:
        return (n, self.grid, self.grid)
