"""dvae: DALL·E's discrete VAE (Gumbel-softmax, KL to the uniform prior), a TokenCodec for token generators."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.dvae.config import DVAEConfig
from genforge.tokenizers.config import DISCRETE_TOKENIZER_TRAITS

register_family(DVAEConfig, "genforge.families.dvae.task:DVAETask", Path(__file__).parent / "presets",
                traits=DISCRETE_TOKENIZER_TRAITS.but(block_types=("genforge.families.dvae.model:ResBlock",),
                                                     grad_clip=0.0))  # DALLE-pytorch train_vae.py does not clip
