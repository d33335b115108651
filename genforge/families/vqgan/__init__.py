"""vqgan: the VQGAN of taming-transformers / MUSE (VQ, LFQ or FSQ bottleneck, patch GAN), a TokenCodec for MaskGIT."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.vqgan.config import VQGANConfig
from genforge.tokenizers.config import DIFFUSERS_BLOCKS, DISCRETE_TOKENIZER_TRAITS

register_family(VQGANConfig, "genforge.families.vqgan.task:VQGANTask", Path(__file__).parent / "presets",
                exporters={"diffusers": "genforge.families.vqgan.export:to_diffusers"},
                codec_loaders={"VQModel": "genforge.families.vqgan.diffusers_codec:codec_from_diffusers"},
                # no clipping: muse-maskgit-pytorch's VQGanVAETrainer (max_grad_norm, discr_max_grad_norm = None)
                traits=DISCRETE_TOKENIZER_TRAITS.but(block_types=DIFFUSERS_BLOCKS, grad_clip=0.0))
