"""klvae -> diffusers: the run's AutoencoderKL as it is (genforge builds diffusers' class), with the run's real
latent scale in `scaling_factor` (the fixed one, or the estimated 1/std of the latents), in safetensors."""

from __future__ import annotations

from pathlib import Path

from genforge.core.export import Exported
from genforge.families.klvae.config import KLVAEConfig
from genforge.families.klvae.task import KLVAETask


def to_diffusers(task: KLVAETask, cfg: KLVAEConfig, out: Path) -> Exported:
    """OUT = an AutoencoderKL folder: keys map one to one; `config.scaling_factor` = the codec's scale, so
    `encode(x).latent_dist.mean * scaling_factor` is genforge's latent."""
    codec = task.autoencoder
    codec.diffusers_autoencoder().save_pretrained(out, safe_serialization=True)
    how = "fixed (model.scale_factor or the pretrained VAE's)" if codec.fixed_scale is not None else \
        f"1/std of the latents, estimated over {int(codec.latent_var_updates)} training batches"
    return Exported({".": "AutoencoderKL"}, details={"scaling_factor": codec.scale_factor(), "scale": how})
