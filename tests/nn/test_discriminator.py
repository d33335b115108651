"""The GAN pieces of the tokenizers (genforge.nn.discriminator) on inputs whose answers are known by hand."""

import pytest
import torch
from torch import nn

from genforge.nn.discriminator import PatchDiscriminator, adaptive_weight, hinge_discriminator_loss, r1_penalty


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


def test_adaptive_weight_is_the_ratio_of_gradient_norms():
    layer = nn.Parameter(torch.randn(3, 4))
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    nll, g = (layer * a).sum(), (layer * b).sum()  # gradients a and b
    weight = adaptive_weight(nll, g, layer)
    assert torch.allclose(weight, a.norm() / (b.norm() + 1e-4)) and not weight.requires_grad
    tiny = (layer * b * 1e-9).sum()  # a vanishing adversarial gradient: clamped
    assert adaptive_weight(nll, tiny, layer, max_weight=100.0) == 100.0


@pytest.mark.parametrize("size,num_layers,expected", [(16, 2, 2), (32, 2, 6), (32, 3, 2)])
def test_patch_discriminator_gives_one_logit_per_patch(size, num_layers, expected):
    d = PatchDiscriminator(3, channels=8, num_layers=num_layers)
    out = d(torch.randn(2, 3, size, size))
    # stride-2 4x4 convs halve the side num_layers times; the two stride-1 4x4 convs (padding 1) take 1 each
    assert out.shape == (2, 1, expected, expected) == (2, 1, size // 2**num_layers - 2, size // 2**num_layers - 2)
