"""dvae: DALL·E's discrete VAE (Gumbel-softmax, KL to the uniform prior), a TokenCodec for token generators."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.dvae.config import DVAEConfig

register_family(DVAEConfig, "genforge.families.dvae.task:DVAETask", Path(__file__).parent / "presets")
