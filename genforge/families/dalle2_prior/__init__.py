"""dalle2_prior: DALL·E 2's diffusion prior, caption -> CLIP image embedding (a causal transformer predicting x₀, CLIP
reranking of two candidates), the first half of text-to-image with the dalle2_decoder."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.core.task import FamilyTraits
from genforge.families.dalle2_prior.config import Dalle2PriorConfig, Dalle2PriorSampleOptions

register_family(Dalle2PriorConfig, "genforge.families.dalle2_prior.task:Dalle2PriorTask",
                Path(__file__).parent / "presets",
                traits=FamilyTraits(metrics=("prior_similarity",), sample_options=Dalle2PriorSampleOptions,
                                    block_types=("genforge.nn.attention:PreNormBlock",),
                                    grad_clip=0.5))  # DALLE2-pytorch's DiffusionPriorTrainConfig.max_grad_norm
