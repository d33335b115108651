"""klvae as a Task: L1 + perceptual + KL (+ optional GAN) on the posterior sample (taming's LPIPSWithDiscriminator)."""

from __future__ import annotations

from torch import Tensor

from genforge.core.family import BuildContext
from genforge.core.random import BatchRandom
from genforge.families.klvae.config import KLVAEConfig
from genforge.families.klvae.model import KLAutoencoder, build_autoencoder_kl
from genforge.tokenizers.task import TokenizerTask


class KLVAETask(TokenizerTask):
    """Trains a KLAutoencoder; its codec's latents are what a latent DiT models."""

    # the discriminator stays in the root unit: FSDP2 reshards a block after its backward, and the gradient
    # penalty's double backward (create_graph) needs the discriminator's weights after that

    def __init__(self, cfg: KLVAEConfig, ctx: BuildContext) -> None:
        super().__init__(cfg, ctx)
        vae = build_autoencoder_kl(cfg, ctx.info.channels)
        scale = cfg.scale_factor
        if scale is None and cfg.pretrained is not None:
            scale = float(vae.config.scaling_factor)  # a pretrained VAE brings its own
        self.autoencoder = KLAutoencoder(vae, scale)
        if ctx.info.image_size % self.autoencoder.downsample:
            raise ValueError(f"data.image_size={ctx.info.image_size} must be divisible by the downsampling "
                             f"{self.autoencoder.downsample} of model.pretrained={cfg.pretrained}")

    def autoencode(self, image: Tensor, rng: BatchRandom, step: int,
                   keep: Tensor | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        posterior = self.autoencoder.posterior(image)
        noise = rng.randn(*posterior.mean.shape[1:]).to(posterior.mean)  # [B, z, h, w], reproducible per row
        z = posterior.mean + posterior.std * noise  # reparameterised sample of q(z|x)
        if self.autoencoder.training:
            self.autoencoder.update_latent_var(z)
        recon = self.autoencoder.vae.decode(z).sample  # [B, C, H, W]
        # KL per sample, summed over the latent; divided by the pixels per sample like the mean reconstruction loss
        kl = posterior.kl().mean() / image[0].numel()
        logs = {"kl": kl.detach() * image[0].numel(), "latent_std": posterior.mean.detach().float().std()}
        return recon, self.cfg.kl_weight * kl, logs

    def last_layer(self) -> Tensor:
        return self.autoencoder.vae.decoder.conv_out.weight
