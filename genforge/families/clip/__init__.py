"""clip: a small contrastive image-text model (CLIP), the offline image embedder of the DALL·E 2 decoder."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.core.task import FamilyTraits
from genforge.families.clip.config import ClipConfig

register_family(ClipConfig, "genforge.families.clip.task:ClipTask", Path(__file__).parent / "presets",
                traits=FamilyTraits(
                    roles=("embedder",), metrics=("zero_shot", "retrieval"), makes_samples=False,
                    block_types=("genforge.nn.attention:PreNormBlock",),
                    no_sharding="trains a scalar parameter (the logit scale, CLIP §2.5), which FSDP2 cannot shard; "
                                "genforge's CLIP models fit one GPU"))
