"""cvivit as a Task: the shared tokenizer objective (genforge/tokenizers/task.py) on clips: reconstruction of
every frame, the image perceptual term on a drawn frame of each clip, Phenaki's video perceptual term on the I3D
features of whole clips (model.video_perceptual, the I3D file of eval.i3d_weights), the patch-GAN term (a 2-D
discriminator on the drawn frame, or a 3-D one on whole clips; taming's adaptive or a fixed weight), the quantizer's
loss (commitment; LFQ's entropy), the discriminator (with R1) as the second phase. Image batches train it as 1-frame
videos (joint image + video training). Padded clips (data.video.min_frames): the losses and the quantizer see only
the frames of real token frames (`core.codec.token_frame_mask`: causal in time, those never see a padded frame)."""

from __future__ import annotations

import torch
from torch import Tensor

from genforge.core.codec import token_frame_mask
from genforge.core.family import BuildContext
from genforge.core.random import BatchRandom
from genforge.eval.tokenizer_metrics import batch_codebook_usage
from genforge.families.cvivit.config import CViViTConfig
from genforge.families.cvivit.model import CViViT
from genforge.nn.perceptual import VideoPerceptualLoss
from genforge.tokenizers.task import TokenizerTask


class CViViTTask(TokenizerTask):
    """Trains a CViViT; its codec's ids [B, t, h, w] are what Phenaki models."""

    # the discriminator stays in the root unit: FSDP2 reshards a block after its backward, and the gradient
    # penalty's double backward (create_graph) needs the discriminator's weights after that

    def __init__(self, cfg: CViViTConfig, ctx: BuildContext) -> None:
        super().__init__(cfg, ctx)
        self.autoencoder = CViViT(cfg, ctx.info.channels)
        if cfg.video_perceptual.weight > 0:  # Phenaki's L_VP: the I3D file FVD reads, named by eval.i3d_weights
            self.video_perceptual = VideoPerceptualLoss(ctx.i3d_weights)
            self.video_perceptual_weight = cfg.video_perceptual.weight
        self._last_was_image = False

    def autoencode(self, video: Tensor, rng: BatchRandom, step: int,
                   keep: Tensor | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        ae = self.autoencoder
        z = ae.encode_latent(video)  # [B, D, t, h, w]
        tokens = None if keep is None else token_frame_mask(keep, ae.temporal_patch)  # [B, t]: the real token frames
        q = ae.quantize(z, step if ae.training else None, rng, keep=tokens)
        self._last_was_image = z.shape[2] == 1
        recon = ae.decode_latent(q.zq, image=video.ndim == 4)  # the input's shape (causal: padding comes after)
        ids = q.ids if tokens is None else q.ids[tokens]  # the codes used: not the padding's
        return recon, q.loss, {**q.logs, **batch_codebook_usage(ids, ae.codebook_size)}

    def loss_frames(self, frame_mask: Tensor) -> Tensor:
        """The frames of the real token frames: a tubelet mixing real and padded frames is left out whole."""
        pt = self.autoencoder.temporal_patch
        tokens = token_frame_mask(frame_mask, pt)  # [B, t]
        return torch.cat([tokens[:, :1], tokens[:, 1:].repeat_interleave(pt, dim=1)], dim=1)  # [B, T]

    def end_step(self, step: int) -> None:
        """Apply the step's codebook statistics on every rank (as vqgan does)."""
        if self.autoencoder.pending is not None:
            self.autoencoder.apply_pending()

    def last_layer(self) -> Tensor:
        """The output map the last batch's reconstruction went through last (CViViT.output_layer)."""
        return self.autoencoder.output_layer(image=self._last_was_image)
