"""cvivit: Phenaki's causal video tokenizer C-ViViT (first frame + tubelets, spatial then causal temporal
transformers, VQ / LFQ / FSQ), a TokenCodec of videos for Phenaki."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.cvivit.config import CViViTConfig
from genforge.tokenizers.config import DISCRETE_TOKENIZER_TRAITS

register_family(CViViTConfig, "genforge.families.cvivit.task:CViViTTask", Path(__file__).parent / "presets",
                # phenaki-pytorch's CViViTTrainer clips the autoencoder at 0.5 and its discriminator not at all
                # (train.grad_clip 0.5, train.phases.discriminator.grad_clip 0 when a run leaves both unset)
                traits=DISCRETE_TOKENIZER_TRAITS.but(block_types=("genforge.nn.attention:PreNormBlock",),
                                                     grad_clip=0.5, phase_grad_clip=(("discriminator", 0.0),)))
