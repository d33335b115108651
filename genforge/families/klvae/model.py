"""KLAutoencoder: diffusers' AutoencoderKL as a `LatentCodec`, with the latent scale factor of latent diffusion.

image [B, C, H, W] --encoder--> q(z|x) = N(mean, exp(logvar)) [B, 2·z, H/f, W/f] --decoder--> image
The codec's latent is mean · scale_factor (deterministic, so a cache is reproducible); scale_factor is fixed (set,
or a pretrained VAE's own: the SD VAE's 0.18215, which DiT uses) or 1/std of the latents (Rombach et al. 2022,
appendix G), estimated as a running average while training. `encode_moments` also gives the posterior's std in the
same units, for generators that train on samples of q(z|x) (DiT: model.latent.sample_posterior).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from diffusers import AutoencoderKL
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
from torch import Tensor, nn

from genforge.families.klvae.config import KLVAEConfig

VAR_MOMENTUM = 0.01  # the running variance averages over ~100 steps once it has seen 100


def read_autoencoder_kl(folder: str | Path) -> AutoencoderKL:
    """The AutoencoderKL of a local diffusers folder (safetensors only, no download); FileNotFoundError when it is
    not one."""
    if not Path(folder, "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a diffusers AutoencoderKL directory (no config.json)")
    try:
        return AutoencoderKL.from_pretrained(folder, local_files_only=True, use_safetensors=True)
    except OSError as err:  # no diffusion_pytorch_model.safetensors (a .bin is never unpickled)
        raise FileNotFoundError(f"{folder}: {err}") from None


def codec_from_diffusers(folder: Path) -> "KLAutoencoder":
    """The codec of a diffusers AutoencoderKL folder (e.g. stabilityai/sd-vae-ft-ema): its weights, frozen, and its
    config's `scaling_factor` (0.18215 for the SD VAE, as DiT uses it)."""
    vae = read_autoencoder_kl(folder)
    if vae.config.get("shift_factor"):
        raise ValueError(f"{folder}: shift_factor={vae.config.shift_factor} (an SD3/FLUX-style VAE): genforge's "
                         "latent codec scales latents but does not shift them")
    return KLAutoencoder(vae, float(vae.config.scaling_factor))


def build_autoencoder_kl(cfg: KLVAEConfig, channels: int) -> AutoencoderKL:
    """A fresh AutoencoderKL from the config, or the user's local pretrained one (no download)."""
    if cfg.pretrained is not None:
        try:
            return read_autoencoder_kl(cfg.pretrained)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"model.pretrained: {err}") from None
    levels = len(cfg.block_out_channels)
    return AutoencoderKL(
        in_channels=channels, out_channels=channels,
        down_block_types=("DownEncoderBlock2D",) * levels, up_block_types=("UpDecoderBlock2D",) * levels,
        latent_channels=cfg.latent_channels, **cfg.stack_kwargs(),
    )


class KLAutoencoder(nn.Module):
    """LatentCodec over an AutoencoderKL: encode = posterior mean · scale, decode = decoder(latent / scale)."""

    def __init__(self, vae: AutoencoderKL, scale_factor: float | None = None) -> None:
        super().__init__()
        self.vae = vae
        self.latent_channels = int(vae.config.latent_channels)
        self.downsample = 2 ** (len(vae.config.block_out_channels) - 1)
        self.fixed_scale = scale_factor
        self.register_buffer("latent_var", torch.ones((), dtype=torch.float64))
        self.register_buffer("latent_var_updates", torch.zeros((), dtype=torch.int64))

    def posterior(self, image: Tensor) -> DiagonalGaussianDistribution:
        """q(z|x) [B, latent_channels, H/f, W/f]."""
        return self.vae.encode(image).latent_dist

    def update_latent_var(self, z: Tensor) -> None:
        """Running average of Var[z] over training batches (cumulative for 1/momentum updates, then EMA). With
        several processes the variance is that of every rank's rows of this micro-batch (count, sum and sum of
        squares all-reduced), so the buffer stays the same on every rank."""
        z = z.detach().double()
        stats = torch.stack([z.new_tensor(z.numel()), z.sum(), z.square().sum()])  # n, Σz, Σz²
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(stats)
        n, total, squares = stats
        var = (squares - total * total / n) / (n - 1)  # unbiased, as torch.var
        rate = max(VAR_MOMENTUM, 1.0 / (int(self.latent_var_updates) + 1))
        self.latent_var.lerp_(var, rate)
        self.latent_var_updates += 1

    def scale_factor(self) -> float:
        if self.fixed_scale is not None:
            return self.fixed_scale
        return float(self.latent_var.clamp_min(1e-12).rsqrt())

    def encode(self, image: Tensor) -> Tensor:
        """image [B, C, H, W] in [-1, 1] -> latent [B, latent_channels, H/f, W/f] (unit-variance scale)."""
        return self.posterior(image).mean * self.scale_factor()

    def encode_moments(self, image: Tensor) -> tuple[Tensor, Tensor]:
        """image -> (mean, std) of q(z|x) · scale_factor [B, latent_channels, H/f, W/f]: mean + std · ε is DiT's
        `vae.encode(x).latent_dist.sample() * 0.18215` (a GaussianLatentCodec)."""
        posterior, scale = self.posterior(image), self.scale_factor()
        return posterior.mean * scale, posterior.std * scale

    def decode(self, latent: Tensor) -> Tensor:
        """latent [B, latent_channels, h, w] -> image [B, C, h·f, w·f]."""
        return self.vae.decode(latent / self.scale_factor()).sample

    def diffusers_autoencoder(self) -> AutoencoderKL:
        """A copy of the AutoencoderKL whose config's `scaling_factor` is this codec's scale (the fixed one, or the
        estimated 1/std): diffusers' `encode(x).latent_dist.mean * scaling_factor` is `encode(x)` and
        `decode(z / scaling_factor)` is `decode(z)` (a DiffusersAutoencoder, genforge.core.codec)."""
        # without the private keys: `_use_default_values` would put diffusers' default scaling_factor back
        config = {k: v for k, v in self.vae.config.items() if not k.startswith("_")}
        vae = AutoencoderKL.from_config({**config, "scaling_factor": self.scale_factor()})
        vae.load_state_dict(self.vae.state_dict())  # strict: the same architecture, key for key
        return vae.to(next(self.vae.parameters()).device).eval()
