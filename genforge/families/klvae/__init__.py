"""klvae: the continuous KL autoencoder of latent diffusion (diffusers' AutoencoderKL), a LatentCodec for DiT."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.klvae.config import KLVAEConfig

register_family(KLVAEConfig, "genforge.families.klvae.task:KLVAETask", Path(__file__).parent / "presets",
                exporters={"diffusers": "genforge.families.klvae.export:to_diffusers"},
                codec_loaders={"AutoencoderKL": "genforge.families.klvae.model:codec_from_diffusers"})
