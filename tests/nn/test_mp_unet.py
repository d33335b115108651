"""EDM2's magnitude-preserving U-Net: the magnitude-preserving operations (eq. 47, 66, 81, 88, 103) on Gaussian
inputs, the forced weight normalisation, and the network's layout, start and conditioning."""

from __future__ import annotations

import math

import pytest
import torch

from genforge.nn.mp_unet import MPBlock, MPConv, MPUNet, mp_cat, mp_silu, mp_sum, normalize, project_weights_
from genforge.nn.unet import UNet


def _rms(x: torch.Tensor) -> float:
    return x.pow(2).mean().sqrt().item()


def test_the_operations_keep_unit_gaussians_at_unit_magnitude():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(400_000, generator=g), torch.randn(400_000, generator=g)
    assert abs(_rms(mp_silu(a)) - 1) < 0.01  # eq. 81: the 0.596 is E[silu(x)²]^½ for x ~ N(0, 1)
    for t in (0.3, 0.5, 0.9):
        assert abs(_rms(mp_sum(a, b, t)) - 1) < 0.01
    # mp_cat: the whole at unit RMS, and the parts' magnitudes in the ratio (1 − t) : t whatever their widths
    x, y = torch.randn(2000, 24, generator=g), torch.randn(2000, 8, generator=g)
    cat = mp_cat(x, y, t=0.3)
    assert cat.shape == (2000, 32) and abs(_rms(cat) - 1) < 0.01
    first, second = cat[:, :24].pow(2).sum(1).mean().sqrt(), cat[:, 24:].pow(2).sum(1).mean().sqrt()
    assert abs(first / second - 0.7 / 0.3) < 0.05


def test_an_mp_convolution_has_unit_norm_filters_and_keeps_the_magnitude():
    torch.manual_seed(0)
    conv, linear = MPConv(64, 32, 3), MPConv(128, 96, 0)
    with torch.no_grad():
        conv.weight.mul_(7.0)  # the stored scale does not matter to the forward (weight normalisation)
    x = torch.randn(8, 64, 16, 16)
    assert abs(_rms(conv(x)[:, :, 1:-1, 1:-1]) - 1) < 0.05  # inside the zero padding
    assert abs(_rms(linear(torch.randn(4096, 128))) - 1) < 0.05
    assert torch.allclose(conv(x, gain=0.5), 0.5 * conv(x), atol=1e-6)
    assert torch.count_nonzero(linear(torch.randn(3, 128), gain=torch.zeros(()))) == 0


def test_forced_weight_normalisation_puts_every_filter_back_at_rms_one():
    torch.manual_seed(0)
    net = MPUNet(dim=16, dim_mults=(1, 2), num_res_blocks=1, attention_levels=(1,), head_dim=8, num_classes=3)
    x = torch.randn(2, 3, 8, 8)
    before = net(x, torch.tensor([5.0, 700.0]), y=torch.tensor([0, 2]))
    with torch.no_grad():
        for p in net.parameters():
            if p.ndim >= 2:
                p.mul_(torch.rand(p.shape[0], *[1] * (p.ndim - 1)) * 3 + 0.5)  # each filter rescaled
    project_weights_(net)
    for name, p in net.named_parameters():
        if p.ndim >= 2:
            rms = p.flatten(1).pow(2).mean(1).sqrt()
            assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3), name
    # a filter's scale never reaches the forward: the output is what it was
    assert torch.allclose(net(x, torch.tensor([5.0, 700.0]), y=torch.tensor([0, 2])), before, atol=1e-5)


def test_normalise_is_idempotent_and_unit_rms_per_row():
    w = torch.randn(6, 4, 3, 3) * torch.arange(1, 7).view(6, 1, 1, 1)
    once = normalize(w)
    assert torch.allclose(once.flatten(1).pow(2).mean(1), torch.ones(6), atol=1e-3)
    assert torch.allclose(normalize(once), once, rtol=1e-3, atol=1e-6)  # up to eps = 1e-4


def test_the_network_starts_at_zero_and_keeps_every_activation_near_unit_magnitude():
    torch.manual_seed(0)
    net = MPUNet(dim=32, dim_mults=(1, 2, 2), num_res_blocks=1, attention_levels=(2,), head_dim=32, num_classes=16)
    x, t, y = torch.randn(8, 3, 32, 32), torch.rand(8) * 1000, torch.randint(0, 16, (8,))
    out = net(x, t, y=y)
    assert out.shape == (8, 3, 32, 32) and torch.count_nonzero(out) == 0  # the output gain starts at 0
    magnitudes = []
    for block in net.modules():
        if isinstance(block, MPBlock):
            block.register_forward_hook(lambda module, args, output: magnitudes.append(_rms(output)))
    with torch.no_grad():
        net.output_gain.fill_(1.0)
    assert 0.7 < _rms(net(x, t, y=y)) < 1.3
    assert len(magnitudes) == len(net.down) + len(net.middle) + len(net.up) and all(0.7 < m < 1.3 for m in magnitudes)


def test_the_layout_is_the_adm_unets_and_the_conditioning_is_checked():
    args = dict(dim=16, dim_mults=(1, 2, 2), num_res_blocks=2, attention_levels=(1,), head_dim=8, num_classes=4)
    mp, adm = MPUNet(**args), UNet(**args)
    assert len(mp.down) == len(adm.down) and len(mp.up) == len(adm.up) + len(args["dim_mults"]) - 1  # up blocks
    assert sum(m.heads > 0 for m in mp.modules() if isinstance(m, MPBlock)) == 2 + 3 + 1  # down, up, middle
    with torch.no_grad():
        mp.output_gain.fill_(1.0)
        for block in mp.modules():
            if isinstance(block, MPBlock):
                block.emb_gain.fill_(1.0)
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([10.0, 10.0])
    null = mp(x, t)  # no label: the null class
    assert torch.allclose(null, mp(x, t, y=torch.tensor([4, 4])))
    assert not torch.allclose(null, mp(x, t, y=torch.tensor([1, 1])))
    one = torch.tensor([1, 1])
    assert not torch.allclose(mp(x, t, y=one), mp(x, torch.tensor([900.0, 900.0]), y=one))
    with pytest.raises(ValueError, match="without the conditioning"):
        MPUNet(**{**args, "num_classes": 0})(x, t, y=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="divisible by 4"):
        mp(torch.randn(1, 3, 18, 18), t[:1])
    assert math.isclose(sum(p.numel() for p in mp.parameters()) / sum(p.numel() for p in adm.parameters()), 1,
                        rel_tol=0.2)
