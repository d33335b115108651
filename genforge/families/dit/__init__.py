"""dit: the Diffusion Transformer (adaLN-Zero) on pixels or a tokenizer's latents, IDDPM Gaussian diffusion, CFG."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.dit.config import DiTConfig

register_family(DiTConfig, "genforge.families.dit.task:DiTTask", Path(__file__).parent / "presets")
