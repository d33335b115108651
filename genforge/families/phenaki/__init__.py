"""phenaki: Phenaki's masked-token transformer (Villegas et al. 2022) over a C-ViViT's video ids, text conditioned."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.phenaki.config import PhenakiConfig, PhenakiSampleOptions
from genforge.masked.config import MASKED_TRAITS

register_family(PhenakiConfig, "genforge.families.phenaki.task:PhenakiTask", Path(__file__).parent / "presets",
                # train.grad_clip 0: phenaki-pytorch's PhenakiTrainer does not clip (max_grad_norm=None)
                traits=MASKED_TRAITS.but(metrics=("judge", "direction"), sample_options=PhenakiSampleOptions,
                                         grad_clip=0.0))
