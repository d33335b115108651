"""klvae: the continuous KL autoencoder of latent diffusion (diffusers' AutoencoderKL), a LatentCodec for DiT."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.klvae.config import KLVAEConfig
from genforge.tokenizers.config import DIFFUSERS_BLOCKS, TOKENIZER_TRAITS

register_family(KLVAEConfig, "genforge.families.klvae.task:KLVAETask", Path(__file__).parent / "presets",
                exporters={"diffusers": "genforge.families.klvae.export:to_diffusers"},
                codec_loaders={"AutoencoderKL": "genforge.families.klvae.model:codec_from_diffusers"},
                traits=TOKENIZER_TRAITS.but(block_types=DIFFUSERS_BLOCKS))
