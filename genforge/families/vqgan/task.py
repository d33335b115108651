"""vqgan as a Task: rec + perceptual + quantizer loss + adaptive patch-GAN (taming's VQLPIPSWithDiscriminator by
default, MUSE's VQGanVAE objective by option), the discriminator as the second phase (genforge/tokenizers/task.py)."""

from __future__ import annotations

from torch import Tensor

from genforge.core.family import BuildContext
from genforge.core.random import BatchRandom
from genforge.eval.tokenizer_metrics import batch_codebook_usage
from genforge.families.vqgan.config import VQGANConfig
from genforge.families.vqgan.model import VQAutoencoder
from genforge.tokenizers.task import TokenizerTask


class VQGANTask(TokenizerTask):
    """Trains a VQAutoencoder; its codec's token ids are what MaskGIT models."""

    # the discriminator stays in the root unit: FSDP2 reshards a block after its backward, and the gradient
    # penalty's double backward (create_graph) needs the discriminator's weights after that

    def __init__(self, cfg: VQGANConfig, ctx: BuildContext) -> None:
        super().__init__(cfg, ctx)
        self.autoencoder = VQAutoencoder(cfg, ctx.info.channels)

    def autoencode(self, image: Tensor, rng: BatchRandom, step: int,
                   keep: Tensor | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        ae = self.autoencoder
        z = ae.encode_latent(image)  # [B, z, h, w]
        # codebook statistics only from training passes (the discriminator's fallback pass runs in eval mode)
        q = ae.quantize(z, step if ae.training else None, rng)
        recon = ae.decode_latent(q.zq)  # [B, C, H, W]
        return recon, q.loss, {**q.logs, **batch_codebook_usage(q.ids, ae.codebook_size)}

    def end_step(self, step: int) -> None:
        """The step's codebook statistics are complete on every rank: apply them now, everywhere, rather than when
        the codebook is next read (which the main process alone does when it samples a preview)."""
        if self.autoencoder.pending is not None:
            self.autoencoder.apply_pending()

    def last_layer(self) -> Tensor:
        return self.autoencoder.decoder.conv_out.weight
