"""Config of the `maskgit` family: a MUSE / MaskGIT masked-token transformer over a tokenizer's ids."""

from __future__ import annotations

from typing import Literal

from genforge.core.config import DataConfig
from genforge.masked.config import MaskedTokenConfig


class MaskGITConfig(MaskedTokenConfig):
    """MUSE base transformer (Chang et al. 2023) trained with MaskGIT's masked-token objective (Chang et al. 2022)."""

    family: Literal["maskgit"] = "maskgit"

    def check_data(self, data: DataConfig) -> None:
        tokenizer = self.tokens.loaded
        if data.source == "cache" and not tokenizer:
            raise ValueError("data.source=cache needs model.tokens.codec=tokenizer (model.tokens.tokenizer: the run) "
                             "or diffusers (model.tokens.pretrained: the folder), the codec that wrote the cache "
                             "(it decodes the samples)")
        if not tokenizer:  # the stand-in's grid and vocabulary are known now; a tokenizer's once it is loaded
            self.check_tokens(data.image_size, self.tokens.factor, self.tokens.levels**3,
                              "model.tokens.factor", "model.tokens.levels")

    def check_tokens(self, image_size: int, downsample: int, codebook_size: int, downsample_source: str,
                     codebook_source: str) -> None:
        """model.codebook_size / seq_len against a tokenizer's (ValueError naming both sides)."""
        if image_size % downsample:
            raise ValueError(f"data.image_size={image_size} must be divisible by {downsample_source}={downsample}")
        grid = (image_size // downsample) ** 2
        self.check_vocabulary(codebook_size, codebook_source)
        if self.seq_len is not None and self.seq_len != grid:
            raise ValueError(f"model.seq_len={self.seq_len} differs from the token grid of {downsample_source} at "
                             f"data.image_size={image_size} ({image_size // downsample}x{image_size // downsample} "
                             f"= {grid}); set it to {grid} or leave it out")
