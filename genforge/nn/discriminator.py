"""The patch discriminators (2-D on images or frames, 3-D on clips) and GAN terms of VQGAN (Esser et al. 2021,
"Taming Transformers", sec. 3.2).

PatchGAN (Isola et al. 2017): a stack of stride-2 convolutions whose output is one real/fake logit per
overlapping patch. GroupNorm instead of taming's BatchNorm, as MUSE's VQGAN does: batch statistics would couple
real and fake batches and break the gradient penalty.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with the largest of 32, 16, ..., 1 groups that divides `channels`."""
    groups = next(g for g in (32, 16, 8, 4, 2, 1) if channels % g == 0)
    return nn.GroupNorm(groups, channels)


def patch_stack(conv: type[nn.Conv2d] | type[nn.Conv3d], in_channels: int, channels: int, num_layers: int,
                kernel: int | tuple[int, ...]) -> nn.Sequential:
    """PatchGAN's layers (taming's NLayerDiscriminator, GroupNorm for BatchNorm): a stride-2 conv, `num_layers`
    widening convs (stride 2 but the last) with GroupNorm, and a conv to one logit per patch; padding 1 everywhere."""
    layers: list[nn.Module] = [conv(in_channels, channels, kernel, 2, 1), nn.LeakyReLU(0.2)]
    width = channels
    for n in range(1, num_layers + 1):
        stride = 2 if n < num_layers else 1  # the last widening conv keeps the resolution
        out = channels * min(2**n, 8)
        layers += [conv(width, out, kernel, stride, 1, bias=False), group_norm(out), nn.LeakyReLU(0.2)]
        width = out
    layers.append(conv(width, 1, kernel, 1, 1))
    return nn.Sequential(*layers)


class PatchDiscriminator(nn.Module):
    """image [B, C, H, W] -> logits [B, 1, h, w]; `num_layers` stride-2 convolutions (receptive field 70 px
    at 3 layers); the input side must be at least 2**num_layers * 4 pixels."""

    def __init__(self, in_channels: int = 3, channels: int = 64, num_layers: int = 3) -> None:
        super().__init__()
        self.net = patch_stack(nn.Conv2d, in_channels, channels, num_layers, 4)

    def forward(self, image: Tensor) -> Tensor:
        return self.net(image)


class SpatioTemporalPatchDiscriminator(nn.Module):
    """clip [B, C, T, H, W] -> logits [B, 1, t, h, w]: the PatchGAN above with 3-D convolutions, one real/fake
    logit per spatio-temporal patch of the whole clip (as TATS's video discriminator, Ge et al. 2022, and the 3-D
    discriminators of MAGVIT, Yu et al. 2023), so it judges motion as well as frames. Kernels 3 x 4 x 4: in space
    the 2-D layers' sizes (sides of at least 2**num_layers * 4 pixels); in time padding 1 and stride 2 where the
    space is halved, t = ceil(T / 2**num_layers), so any T >= 1 works (an image step's 1-frame clips too)."""

    def __init__(self, in_channels: int = 3, channels: int = 64, num_layers: int = 3) -> None:
        super().__init__()
        self.net = patch_stack(nn.Conv3d, in_channels, channels, num_layers, (3, 4, 4))

    def forward(self, clip: Tensor) -> Tensor:
        return self.net(clip)


def hinge_discriminator_loss(real_logits: Tensor, fake_logits: Tensor) -> Tensor:
    """Hinge loss (Lim & Ye 2017): ½·(E[relu(1 − D(x))] + E[relu(1 + D(x̂))])."""
    return 0.5 * (F.relu(1.0 - real_logits).mean() + F.relu(1.0 + fake_logits).mean())


def r1_penalty(real_logits: Tensor, real: Tensor) -> Tensor:
    """R1 gradient penalty (Mescheder et al. 2018, eq. 9 without γ/2): E‖∇ₓ D(x)‖² on real images; `real`
    must require grad before D is applied."""
    (grad,) = torch.autograd.grad(real_logits.sum(), real, create_graph=True)
    return grad.float().square().flatten(1).sum(1).mean()


def gradient_penalty(logits: Tensor, inputs: Tensor) -> Tensor:
    """WGAN-GP's penalty (Gulrajani et al. 2017, eq. 3 without λ): E[(‖∇ₓ D(x)‖₂ − 1)²] with D(x) the sum of an
    image's patch logits; `inputs` must require grad before D is applied. The paper takes x on random interpolates
    of real and fake (`interpolates`); muse-maskgit-pytorch's VQGanVAE takes it on the real images."""
    (grad,) = torch.autograd.grad(logits.sum(), inputs, create_graph=True)
    return (grad.float().flatten(1).norm(dim=1) - 1.0).square().mean()


def interpolates(real: Tensor, fake: Tensor, epsilon: Tensor) -> Tensor:
    """x̂ = ε·x + (1 − ε)·x̃ per image, ε [B] in [0, 1] (WGAN-GP's sampling of points between the distributions)."""
    eps = epsilon.to(real).view(-1, *([1] * (real.ndim - 1)))
    return eps * real + (1.0 - eps) * fake


def last_layer_grad_norm(loss: Tensor, last_layer: Tensor) -> Tensor:
    """‖∇_L loss‖₂ (detached) on the decoder's last layer L, the graph kept for the backward to come."""
    (grad,) = torch.autograd.grad(loss, last_layer, retain_graph=True)
    return grad.detach().norm()


def adaptive_weight(nll: Tensor, generator_loss: Tensor, last_layer: Tensor, max_weight: float = 1e4) -> Tensor:
    """Taming's λ = ‖∇_L nll‖ / (‖∇_L g‖ + 1e-4), clamped to [0, max_weight], detached (Esser et al. 2021, eq. 7),
    with L the decoder's last layer and nll the reconstruction + perceptual terms: balances the adversarial term
    against them."""
    return (last_layer_grad_norm(nll, last_layer) / (last_layer_grad_norm(generator_loss, last_layer) + 1e-4)
            ).clamp(0.0, max_weight)


def perceptual_adaptive_weight(perceptual: Tensor, generator_loss: Tensor, last_layer: Tensor,
                               max_weight: float = 1e4) -> Tensor:
    """MUSE's λ = ‖∇_L perceptual‖ / max(‖∇_L g‖, 1e-8), clamped to max_weight, detached (muse-maskgit-pytorch
    VQGanVAE): taming's ratio measured on the perceptual term's gradient alone, the reconstruction term left out."""
    return (last_layer_grad_norm(perceptual, last_layer) / last_layer_grad_norm(generator_loss, last_layer)
            .clamp(min=1e-8)).clamp(0.0, max_weight)
