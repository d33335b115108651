"""The GAN pieces of the tokenizers (genforge.nn.discriminator) on inputs whose answers are known by hand."""

import pytest
import torch
from torch import nn

from genforge.nn.discriminator import (PatchDiscriminator, SpatioTemporalPatchDiscriminator, adaptive_weight,
                                      gradient_penalty, hinge_discriminator_loss, interpolates,
                                      perceptual_adaptive_weight, r1_penalty)


def test_hinge_loss_on_known_logits():
    real = torch.tensor([2.0, 0.5, -1.0])  # relu(1 - D): 0, 0.5, 2   -> mean 5/6
    fake = torch.tensor([-2.0, 0.0, 1.0])  # relu(1 + D): 0, 1, 2     -> mean 1
    assert torch.allclose(hinge_discriminator_loss(real, fake), torch.tensor(0.5 * (5 / 6 + 1)))
    # confident and right on both sides: no loss (the hinge stops pushing past the margin)
    assert hinge_discriminator_loss(torch.full((4,), 3.0), torch.full((4,), -3.0)) == 0


def test_r1_is_zero_for_a_constant_discriminator():
    d = nn.Conv2d(3, 1, 1)
    nn.init.zeros_(d.weight)
    nn.init.constant_(d.bias, 0.7)
    real = torch.randn(2, 3, 8, 8, requires_grad=True)
    assert r1_penalty(d(real), real) == 0


def test_r1_matches_the_gradient_of_a_linear_discriminator():
    """D(x) = Σ_c w_c x_c + b per pixel: ∂ΣD/∂x[b, c, i, j] = w_c, so ‖∇ₓD‖² = H·W·Σ w_c² for every sample."""
    d = nn.Conv2d(3, 1, 1)
    with torch.no_grad():
        d.weight.copy_(torch.tensor([1.0, -2.0, 0.5]).view(1, 3, 1, 1))
    real = torch.randn(4, 3, 5, 6, requires_grad=True)
    penalty = r1_penalty(d(real), real)
    assert torch.allclose(penalty, torch.tensor(5 * 6 * (1 + 4 + 0.25)))
    penalty.backward()  # create_graph: the penalty trains the discriminator
    assert d.weight.grad is not None and d.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("w", [[0.6, -0.8, 0.0], [1.0, -2.0, 0.5], [0.1, 0.1, 0.1]])
def test_gradient_penalty_of_a_linear_discriminator_is_norm_of_w_minus_1_squared(w):
    """D(x) = w·x (one score per image): ∇ₓD = w everywhere, so (‖∇D‖₂ − 1)² = (‖w‖ − 1)² at every point."""
    weight = torch.tensor(w, requires_grad=True)
    x = torch.randn(5, 3, requires_grad=True)
    penalty = gradient_penalty(x @ weight, x)
    expected = (torch.tensor(w).norm() - 1) ** 2
    assert torch.allclose(penalty, expected, atol=1e-6)
    penalty.backward()  # create_graph: the penalty trains the discriminator, d/dw = 2(‖w‖ − 1) w / ‖w‖
    torch.testing.assert_close(weight.grad, 2 * (torch.tensor(w).norm() - 1) * torch.tensor(w) / torch.tensor(w).norm())


def test_gradient_penalty_sums_the_patch_logits_of_an_image():
    """A 1x1-conv discriminator w per pixel on an H×W image: ∇ₓΣD has norm √(H·W)·‖w‖ for every image."""
    d = nn.Conv2d(3, 1, 1)
    with torch.no_grad():
        d.weight.copy_(torch.tensor([1.0, -2.0, 0.5]).view(1, 3, 1, 1))
    x = torch.randn(4, 3, 5, 6, requires_grad=True)
    expected = ((5 * 6 * (1 + 4 + 0.25)) ** 0.5 - 1) ** 2
    assert torch.allclose(gradient_penalty(d(x), x), torch.tensor(expected))
    constant = nn.Conv2d(3, 1, 1)
    nn.init.zeros_(constant.weight)
    penalty = gradient_penalty(constant(x), x)  # a flat discriminator: ‖∇D‖ = 0, penalty 1, a finite gradient
    assert penalty == 1 and torch.isfinite(torch.autograd.grad(penalty, constant.weight)[0]).all()


def test_interpolates_mix_each_image_by_its_own_epsilon():
    real, fake = torch.ones(3, 2, 4, 4), -torch.ones(3, 2, 4, 4)
    mixed = interpolates(real, fake, torch.tensor([0.0, 0.25, 1.0]))
    assert torch.equal(mixed[0], fake[0]) and torch.equal(mixed[2], real[2])
    assert torch.equal(mixed[1], torch.full((2, 4, 4), -0.5))


def test_adaptive_weight_is_the_ratio_of_gradient_norms():
    layer = nn.Parameter(torch.randn(3, 4))
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    nll, g = (layer * a).sum(), (layer * b).sum()  # gradients a and b
    weight = adaptive_weight(nll, g, layer)
    assert torch.allclose(weight, a.norm() / (b.norm() + 1e-4)) and not weight.requires_grad
    tiny = (layer * b * 1e-9).sum()  # a vanishing adversarial gradient: clamped
    assert adaptive_weight(nll, tiny, layer, max_weight=100.0) == 100.0


def test_muses_adaptive_weight_is_the_perceptual_gradient_over_the_adversarial_one():
    """muse-maskgit-pytorch VQGanVAE: ‖∇perceptual‖ / max(‖∇g‖, 1e-8), clamped to 1e4; no 1e-4 added (taming's)."""
    layer = nn.Parameter(torch.randn(3, 4))
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    perceptual, g = (layer * a).sum(), (layer * b).sum()  # gradients a and b
    weight = perceptual_adaptive_weight(perceptual, g, layer)
    assert torch.allclose(weight, a.norm() / b.norm()) and not weight.requires_grad
    assert weight != adaptive_weight(perceptual, g, layer)  # taming's + 1e-4 in the denominator
    assert perceptual_adaptive_weight(perceptual, (layer * b * 1e-9).sum(), layer) == 1e4  # clamped
    tiny = (layer * b * 1e-12).sum()  # ‖∇g‖ below 1e-8: divided by 1e-8
    assert torch.allclose(perceptual_adaptive_weight(perceptual * 1e-7, tiny, layer, max_weight=1e9),
                          a.norm() * 1e-7 / 1e-8)


@pytest.mark.parametrize("size,num_layers,expected", [(16, 2, 2), (32, 2, 6), (32, 3, 2)])
def test_patch_discriminator_gives_one_logit_per_patch(size, num_layers, expected):
    d = PatchDiscriminator(3, channels=8, num_layers=num_layers)
    out = d(torch.randn(2, 3, size, size))
    # stride-2 4x4 convs halve the side num_layers times; the two stride-1 4x4 convs (padding 1) take 1 each
    assert out.shape == (2, 1, expected, expected) == (2, 1, size // 2**num_layers - 2, size // 2**num_layers - 2)


@pytest.mark.parametrize("frames,num_layers,expected_t", [(1, 2, 1), (5, 2, 2), (11, 3, 2), (17, 3, 3)])
def test_the_3d_patch_discriminator_gives_one_logit_per_spatio_temporal_patch(frames, num_layers, expected_t):
    """Space as the 2-D one; time: ceil(T / 2**num_layers) (stride-2 convs of kernel 3, padding 1), any T >= 1.
    Every logit's patch spans frames, and every frame reaches some logit."""
    torch.manual_seed(0)
    d = SpatioTemporalPatchDiscriminator(3, channels=8, num_layers=num_layers)
    side = 4 * 2**num_layers
    clip = torch.randn(2, 3, frames, side, side, requires_grad=True)
    out = d(clip)
    spatial = PatchDiscriminator(3, channels=8, num_layers=num_layers)(clip[:, :, 0]).shape[-2:]
    assert out.shape == (2, 1, expected_t, *spatial)
    (grad,) = torch.autograd.grad(out.sum(), clip)
    assert (grad.abs().sum((0, 1, 3, 4)) > 0).all()  # it sees every frame of the clip
