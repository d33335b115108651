"""TokenizerTask: the training objective the image tokenizers share (taming's VQLPIPSWithDiscriminator and
LPIPSWithDiscriminator, Esser et al. 2021, by default; MUSE's VQGanVAE objective with perceptual.distance
feature_mse and gan.adversarial_weight adaptive_perceptual), with the family-specific parts left to subclasses.

generator phase:     L = rec(x̂, x) + w_p·perceptual(x̂, x) [+ w_vp·video_perceptual(x̂, x)] + regulariser
                         + λ·w_gan·(−E[D(x̂)])   (step ≥ start; λ: taming's adaptive weight ‖∇nll‖/‖∇g‖, MUSE's
                         ‖∇(w_p·perceptual)‖/‖∇g‖, or 1: fixed; perceptual: LPIPS-style (taming) or feature MSE (MUSE))
discriminator phase: hinge(D(x), D(x̂.detach())) + the gradient penalty of `gan.penalty` every N steps:
                     r1: γ/2·N·E‖∇ₓD(x)‖² (lazy R1)   wgan_gp: λ·E(‖∇D(x)‖₂ − 1)² (MUSE: on the real images)
A subclass builds `self.autoencoder` (the codec) and implements `autoencode` (x -> x̂, its regulariser and
its logs) and `last_layer` (the decoder weight λ is measured on).

Video tokenizers (data of kind "video", batch field `video` [B, C, T, H, W]) use the same losses: the
reconstruction loss over every frame, the perceptual loss and the 2-D patch discriminator on one randomly drawn
frame per clip (Phenaki trains C-ViViT's image losses on sampled frames; the draw comes from the batch's
reproducible random stream), or with `gan.discriminator: patch_3d` a 3-D patch discriminator on the whole clips; a
subclass may set `video_perceptual` (Phenaki's I3D term on whole clips of more than one frame). Clips with padding
(`frame_mask`, data.video.min_frames) keep it out of every loss: the losses see only the `loss_frames` (the real
ones, or those of a codec's real token frames), the reconstruction loss summed over them and divided by their
number in the whole global batch, the frame of the image losses drawn among them, and the codec is told which
frames to keep (`autoencode`'s `keep`: its quantizer sees no padding); the terms on whole clips (video perceptual,
3-D discriminator) refuse padded clips in the config.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genforge.core.config import SampleOptions
from genforge.core.random import BatchRandom
from genforge.core.family import BuildContext
from genforge.core.task import Batch, Task, global_rows, interleave_rows
from genforge.nn.perceptual import FeatureMSELoss, PerceptualLoss, VideoPerceptualLoss, perceptual_distance
from genforge.nn.discriminator import (PatchDiscriminator, SpatioTemporalPatchDiscriminator, adaptive_weight,
                                      gradient_penalty, hinge_discriminator_loss, interpolates,
                                      perceptual_adaptive_weight, r1_penalty)
from genforge.tokenizers.config import TokenizerConfig

RECONSTRUCTION_LOSSES = {"l1": F.l1_loss, "mse": F.mse_loss, "smooth_l1": F.smooth_l1_loss}


class TokenizerTask(Task):
    """Autoencoder + optional perceptual loss + optional patch discriminator (a second phase)."""

    autoencoder: nn.Module

    def __init__(self, cfg: TokenizerConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.cfg = cfg
        self.heldout = ctx.heldout  # the held-out images or clips previews reconstruct
        self.image_channels = ctx.info.channels
        self.field = "video" if ctx.info.kind == "video" else "image"  # the batch field the codec reconstructs
        self.perceptual: PerceptualLoss | FeatureMSELoss | None = None
        if cfg.perceptual.weight > 0:
            p = cfg.perceptual
            self.perceptual = perceptual_distance(p.distance, p.network, p.weights_path, p.resize)
        # a video tokenizer (cvivit) may set Phenaki's video perceptual loss and its weight
        self.video_perceptual: VideoPerceptualLoss | None = None
        self.video_perceptual_weight = 0.0
        self.discriminator = None
        if cfg.gan is not None:
            judge = SpatioTemporalPatchDiscriminator if cfg.gan.discriminator == "patch_3d" else PatchDiscriminator
            self.discriminator = judge(ctx.info.channels, cfg.gan.channels, cfg.gan.num_layers)
            self.phases = ("generator", "discriminator")
        self._fakes: dict[tuple[int, int], Tensor] = {}  # reconstructions of this step, for the discriminator

    # ------------------------------------------------------------------------------ for subclasses
    def autoencode(self, image: Tensor, rng: BatchRandom, step: int,
                   keep: Tensor | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """image [B, C, H, W] -> (reconstruction [B, C, H, W], regulariser loss (scalar), logs) in training. Video
        tokenizers: clips [B, C, T, H, W], and `keep` bool [B, T], the `loss_frames` of clips with padding (None:
        every frame), which the regulariser and logs must see alone."""
        raise NotImplementedError

    def loss_frames(self, frame_mask: Tensor) -> Tensor:
        """The frames of clips with real frames `frame_mask` bool [B, T] whose reconstruction enters the losses, a
        prefix of each clip (True first): the real frames (a causal video codec: those of its real token frames)."""
        return frame_mask

    def last_layer(self) -> Tensor:
        """The decoder's output weight (taming's adaptive weight is measured on its gradients)."""
        raise NotImplementedError

    @torch.no_grad()
    def reconstruct(self, image: Tensor) -> Tensor:
        """Deterministic reconstruction through the codec (previews, `genforge sample`)."""
        codec = self.codec()
        return codec.decode(codec.encode(image))

    # ------------------------------------------------------------------------------------ the task
    def codec(self) -> nn.Module:
        return self.autoencoder

    def ema_module(self) -> nn.Module:
        return self.autoencoder

    def parameters_for(self, phase: str) -> Iterable[nn.Parameter]:
        module = self.discriminator if phase == "discriminator" else self.autoencoder
        return [p for p in module.parameters() if p.requires_grad]

    @staticmethod
    def frame_draw(x: Tensor, rng: BatchRandom, keep: Tensor | None = None) -> Tensor | None:
        """For clips x [B, C, T, H, W]: one frame index per clip [B], drawn from the batch's stream (with `keep`, the
        prefix of loss frames [B, T]: among them); None for images."""
        if x.ndim == 4:
            return None
        if keep is None:
            return (rng.rand().to(x.device) * x.shape[2]).long().clamp_(max=x.shape[2] - 1)
        count = keep.sum(1)  # [B], at least the first frame
        return torch.minimum((rng.rand().to(x.device) * count).long(), count - 1)

    def kept_frames(self, batch: Batch, x: Tensor) -> Tensor | None:
        """The `loss_frames` [B, T] of the batch's clips x when they carry a frame mask (None: every frame)."""
        return self.loss_frames(batch["frame_mask"]) if x.ndim == 5 and "frame_mask" in batch else None

    def reconstruction_loss(self, recon: Tensor, x: Tensor, batch: Batch,
                            keep: Tensor | None) -> tuple[Tensor, Tensor]:
        """(the reconstruction loss, its value to log): the mean over every element; with `keep` [B, T], the sum over
        the kept frames divided by the elements of the kept frames of the whole global batch, so any split into
        processes and accumulation steps gives the same gradient (logged: the mean over this batch's kept ones)."""
        loss = RECONSTRUCTION_LOSSES[self.cfg.reconstruction_loss]
        if keep is None:
            value = loss(recon.float(), x.float())
            return value, value.detach()
        rng = batch["rng"]
        recon_kept, x_kept = (v.transpose(1, 2)[keep].float() for v in (recon, x))  # [M, C, H, W]: no padding
        total = loss(recon_kept, x_kept, reduction="sum")
        per_frame = x[:1, :, 0].numel()  # C·H·W
        kept_everywhere = self.loss_frames(global_rows(batch, "frame_mask")).sum()
        return total * (rng.global_size / rng.size) / (kept_everywhere * per_frame), \
            total.detach() / (keep.sum() * per_frame)

    @staticmethod
    def as_frames(x: Tensor, index: Tensor | None) -> Tensor:
        """Images [B, C, H, W] as they are; clips [B, C, T, H, W] -> frame index[b] of each clip [B, C, H, W]."""
        return x if index is None else x[torch.arange(len(x), device=x.device), :, index]

    def adversarial_input(self, x: Tensor, index: Tensor | None) -> Tensor:
        """What the discriminator judges: the whole clips x [B, C, T, H, W] (gan.discriminator patch_3d), else images
        or the frame index[b] of each clip [B, C, H, W] (patch_2d)."""
        return x if self.cfg.gan.discriminator == "patch_3d" else self.as_frames(x, index)

    def loss(self, batch: Batch, phase: str, step: int) -> tuple[Tensor, dict[str, Tensor]]:
        if phase == "discriminator":
            return self.discriminator_loss(batch, step)
        image, rng = batch[self.field], batch["rng"]
        keep = self.kept_frames(batch, image)  # [B, T]: the frames the losses see (None: all)
        recon, regulariser, logs = self.autoencode(image, rng, step, keep)  # [B, C, H, W] or [B, C, T, H, W]
        nll, logs["reconstruction"] = self.reconstruction_loss(recon, image, batch, keep)
        frame = self.frame_draw(image, rng, keep)  # the frame of each clip the image losses see (None: images)
        perceptual_term = None  # w_p·perceptual, which MUSE's adaptive weight is measured on
        if self.perceptual is not None:
            perceptual = self.perceptual(self.as_frames(recon, frame)[:, :3],
                                         self.as_frames(image, frame)[:, :3]).mean()
            logs["perceptual"] = perceptual.detach()
            perceptual_term = self.cfg.perceptual.weight * perceptual
            nll = nll + perceptual_term
        if self.video_perceptual is not None and image.ndim == 5 and image.shape[2] > 1:  # clips, not image steps
            video_perceptual = self.video_perceptual(recon[:, :3], image[:, :3]).mean()
            logs["video_perceptual"] = video_perceptual.detach()
            nll = nll + self.video_perceptual_weight * video_perceptual
        loss = nll + regulariser
        logs["regulariser"] = regulariser.detach().float()
        gan = self.cfg.gan
        if gan is not None:
            self._fakes = {k: v for k, v in self._fakes.items() if k[0] == step}  # keep this step's only
            self._fakes[(step, rng.offset)] = recon.detach()
            if step >= gan.start_step and gan.weight > 0:
                generator_loss = -self.discriminator(self.adversarial_input(recon, frame)).float().mean()
                weight = gan.weight
                if gan.adversarial_weight != "fixed" and torch.is_grad_enabled():
                    if gan.adversarial_weight == "adaptive":  # taming: on reconstruction + perceptual
                        weight = weight * adaptive_weight(nll, generator_loss, self.last_layer())
                    else:  # adaptive_perceptual, MUSE: on the perceptual term alone (the config requires one)
                        weight = weight * perceptual_adaptive_weight(perceptual_term, generator_loss,
                                                                     self.last_layer())
                    logs["adaptive_weight"] = torch.as_tensor(weight).detach()
                logs["generator_adversarial"] = generator_loss.detach()
                loss = loss + weight * generator_loss
        return loss, logs

    def discriminator_loss(self, batch: Batch, step: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Hinge loss on real images and this step's reconstructions (clips: one drawn frame of each, or the whole
        clips with a 3-D discriminator), plus the gradient penalty at every `penalty_every`-th step: lazy R1
        (γ/2 · N · R1, Mescheder et al. 2018; StyleGAN2's lazy regularisation), or WGAN-GP's (Gulrajani et al. 2017)
        λ · E(‖∇D‖₂ − 1)² as muse-maskgit-pytorch computes it: on the real images (penalty_inputs: real; the paper's
        random interpolates with ε from the batch's random stream: interpolates), with D the sum of the patch logits,
        not scaled by N; MUSE's trainer sets apply_grad_penalty_every = 4 (its code hands the flag to the generator
        call, which ignores it, so it in fact penalises every step: penalty_every 1)."""
        image, rng = batch[self.field], batch["rng"]
        keep = self.kept_frames(batch, image)
        fake = self._fakes.get((step, rng.offset))
        if fake is None:  # the generator phase did not run on this batch (e.g. called on its own)
            was_training = self.autoencoder.training
            self.autoencoder.eval()  # no codebook EMA updates from a second pass
            with torch.no_grad():
                fake = self.autoencode(image, rng, step, keep)[0]
            self.autoencoder.train(was_training)
        gan = self.cfg.gan
        penalise = gan.penalty != "none" and gan.penalty_weight > 0 and step % gan.penalty_every == 0
        on_real = penalise and gan.penalty_inputs == "real"  # r1, and wgan_gp as MUSE takes it
        frame = self.frame_draw(image, rng, keep)
        real = self.adversarial_input(image, frame).detach().requires_grad_(on_real)
        fake = self.adversarial_input(fake, frame).detach()
        real_logits = self.discriminator(real)
        fake_logits = self.discriminator(fake)
        loss = hinge_discriminator_loss(real_logits.float(), fake_logits.float())
        logs = {"hinge": loss.detach(), "logits_real": real_logits.detach().float().mean()}
        if not penalise:
            return loss, logs
        if gan.penalty == "r1":
            penalty = r1_penalty(real_logits, real)
            weight = 0.5 * gan.penalty_weight * gan.penalty_every
        else:
            points, logits = real, real_logits
            if not on_real:  # the paper's random interpolates, ε per image from the batch's stream
                points = interpolates(real.detach(), fake, rng.rand()).requires_grad_(True)
                logits = self.discriminator(points)
            penalty = gradient_penalty(logits, points)
            weight = gan.penalty_weight
        logs[gan.penalty] = penalty.detach()
        return loss + weight * penalty, logs

    # ----------------------------------------------------------------------------------- previews
    def sample_conditions(self, n: int, generator: torch.Generator, options: SampleOptions) -> Batch:
        """The first `n` held-out images or clips (the same ones every time, so previews are comparable)."""
        if self.heldout is None:
            raise ValueError(f"no held-out {self.field}s to reconstruct (the task was built without data)")
        return Batch({self.field: self.heldout.samples(n)[self.field].to(generator.device)})

    @torch.no_grad()
    def sample(self, cond: Batch, generator: torch.Generator, n: int, options: SampleOptions,
               progress: bool = False) -> Tensor:
        """Reconstructions of the held-out images or clips through the codec, in [-1, 1]."""
        device = next(self.autoencoder.parameters()).device
        return self.reconstruct(cond[self.field].to(device)).float().clamp(-1, 1)

    def preview(self, cond: Batch, images: Tensor) -> tuple[Tensor, int]:
        """Rows of 8 originals, each followed by a row of their reconstructions (clips: an animated grid): in training
        previews the EMA weights' (`images`), then the online weights' (cond["online"], from the trainer)."""
        return interleave_rows([cond[self.field], images, *self.online_rows(cond)])

    @staticmethod
    def online_rows(cond: Batch) -> list[Tensor]:
        """The online weights' reconstructions the trainer adds to a training preview (none elsewhere)."""
        return [cond["online"]] if "online" in cond else []
