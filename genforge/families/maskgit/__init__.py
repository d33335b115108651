"""maskgit: the MUSE / MaskGIT masked-token transformer over a tokenizer's ids, text or class conditioned."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.maskgit.config import MaskGITConfig
from genforge.families.maskgit.task import MaskGITTask

register_family(MaskGITConfig, MaskGITTask, Path(__file__).parent / "presets")
