"""Text encoders behind one interface (see docs/text.md): `build_text_encoder(cfg).encode(texts)` ->
embeddings float32 [B, L, D] (pads zero) and mask bool [B, L]."""

from genforge.text.base import TextEncoder
from genforge.text.config import TextEncoderConfig
from genforge.text.encoders import (
    MemoisedTextEncoder,
    PretrainedTextEncoder,
    attach_text_encoder,
    build_text_encoder,
    minilm_dir,
)

__all__ = ["MemoisedTextEncoder", "PretrainedTextEncoder", "TextEncoder", "TextEncoderConfig",
           "attach_text_encoder", "build_text_encoder", "minilm_dir"]
