"""dalle2_decoder: DALL·E 2's decoder, a cascade of diffusion U-Nets conditioned on CLIP image embeddings."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.core.task import FamilyTraits
from genforge.families.dalle2_decoder.config import Dalle2DecoderConfig, Dalle2SampleOptions

register_family(Dalle2DecoderConfig, "genforge.families.dalle2_decoder.task:Dalle2DecoderTask",
                Path(__file__).parent / "presets",
                traits=FamilyTraits(metrics=("fid",), sample_options=Dalle2SampleOptions,
                                    block_types=("genforge.nn.unet:ResBlock", "genforge.nn.unet:AttentionBlock"),
                                    grad_clip=0.5))  # DALLE2-pytorch's DecoderTrainConfig.max_grad_norm
