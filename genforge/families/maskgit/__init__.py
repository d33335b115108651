"""maskgit: the MUSE / MaskGIT masked-token transformer over a tokenizer's ids, text or class conditioned."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.maskgit.config import MaskGITConfig
from genforge.masked.config import MASKED_TRAITS

register_family(MaskGITConfig, "genforge.families.maskgit.task:MaskGITTask", Path(__file__).parent / "presets",
                traits=MASKED_TRAITS)
