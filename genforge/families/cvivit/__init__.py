"""cvivit: Phenaki's causal video tokenizer C-ViViT (first frame + tubelets, spatial then causal temporal
transformers, VQ / LFQ / FSQ), a TokenCodec of videos for Phenaki."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.cvivit.config import CViViTConfig
from genforge.tokenizers.config import DISCRETE_TOKENIZER_TRAITS

register_family(CViViTConfig, "genforge.families.cvivit.task:CViViTTask", Path(__file__).parent / "presets",
                traits=DISCRETE_TOKENIZER_TRAITS.but(block_types=("genforge.nn.attention:PreNormBlock",)))
