"""diffusion: class-conditional diffusion on pixels or a tokenizer's latents with a DiT (adaLN-Zero) or an ADM U-Net
backbone, on the IDDPM, rectified-flow or EDM objective, with CFG. `model.family: dit`, the family's
former name, is an alias: configs and runs that say it still load."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.core.task import FamilyTraits
from genforge.families.diffusion.config import DiffusionModelConfig

register_family(DiffusionModelConfig, "genforge.families.diffusion.task:DiffusionTask", Path(__file__).parent / "presets",
                aliases=("dit",), exporters={"diffusers": "genforge.families.diffusion.export:to_diffusers"},
                importers={"dit-checkpoint": "genforge.families.diffusion.importer:read_official",
                           "DiTTransformer2DModel": "genforge.families.diffusion.importer:read_diffusers"},
                traits=FamilyTraits(metrics=("judge",), block_types=("genforge.families.diffusion.dit:DiTBlock",
                                                                      "genforge.nn.unet:ResBlock",
                                                                      "genforge.nn.unet:AttentionBlock",
                                                                      "genforge.nn.mp_unet:MPBlock"),
                                    grad_clip=0.0))  # facebookresearch/DiT train.py does not clip
