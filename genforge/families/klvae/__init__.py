"""klvae: the continuous KL autoencoder of latent diffusion (diffusers' AutoencoderKL), a LatentCodec for DiT."""

from pathlib import Path

from genforge.core.family import register_family
from genforge.families.klvae.config import KLVAEConfig
from genforge.families.klvae.task import KLVAETask

register_family(KLVAEConfig, KLVAETask, Path(__file__).parent / "presets")
