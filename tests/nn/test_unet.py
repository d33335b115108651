"""The shared U-Net: shapes, identity at initialisation, conditioning paths and its config checks."""

from __future__ import annotations

import pytest
import torch

from genforge.nn.unet import AttentionBlock, ResBlock, UNet, UNetConfig, build_unet


def _unet(**kwargs) -> UNet:
    torch.manual_seed(0)
    args = dict(in_channels=3, out_channels=6, dim=16, dim_mults=(1, 2), num_res_blocks=1, attention_levels=(1,),
                head_dim=8)
    return UNet(**{**args, **kwargs})


def test_output_shape_and_zero_output_at_initialisation():
    net = _unet()
    out = net(torch.randn(2, 3, 16, 16), torch.tensor([3.0, 500.0]))
    assert out.shape == (2, 6, 16, 16)
    assert torch.count_nonzero(out) == 0  # zero-initialised output convolution (ADM)


def _randomise(net: UNet) -> UNet:
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return net


def test_every_condition_reaches_the_output_and_dropped_ones_use_the_null():
    net = _randomise(_unet(image_embed_dim=12, text_dim=8, num_classes=4, lowres=True)).eval()
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([10.0, 10.0])
    base = dict(image_embed=torch.randn(2, 12), text_embed=torch.randn(2, 5, 8), text_mask=torch.ones(2, 5, dtype=torch.bool),
                y=torch.tensor([1, 2]), lowres=torch.randn(2, 3, 8, 8), lowres_noise_level=torch.tensor([0.0, 0.0]))
    ref = net(x, t, **base)
    for name, other in [("image_embed", torch.randn(2, 12)), ("text_embed", torch.randn(2, 5, 8)),
                        ("y", torch.tensor([3, 0])), ("lowres", torch.randn(2, 3, 8, 8)),
                        ("lowres_noise_level", torch.tensor([300.0, 300.0]))]:
        assert not torch.allclose(net(x, t, **{**base, name: other}), ref), name
    drop = torch.tensor([False, True])
    dropped = net(x, t, **base, image_keep=drop)
    nulled = net(x, t, **{**base, "image_embed": net.null_image_embed.detach().expand(2, -1)})
    assert torch.allclose(dropped[0], nulled[0], atol=1e-6) and torch.allclose(dropped[1], ref[1], atol=1e-6)
    # a dropped caption attends only to the null token: the caption's content no longer matters
    a = net(x, t, **base, text_keep=torch.tensor([False, False]))
    b = net(x, t, **{**base, "text_embed": torch.randn(2, 5, 8)}, text_keep=torch.tensor([False, False]))
    assert torch.allclose(a, b, atol=1e-6)


def test_padding_of_the_text_does_not_change_the_output():
    net = _randomise(_unet(text_dim=8)).eval()
    x, t = torch.randn(1, 3, 16, 16), torch.tensor([5.0])
    text = torch.randn(1, 3, 8)
    short = net(x, t, text_embed=text, text_mask=torch.ones(1, 3, dtype=torch.bool))
    padded = net(x, t, text_embed=torch.cat([text, torch.randn(1, 2, 8)], dim=1),
                 text_mask=torch.tensor([[True, True, True, False, False]]))
    assert torch.allclose(short, padded, atol=1e-5)


def test_upsampler_needs_the_lowres_image_and_sizes_must_tile():
    with pytest.raises(ValueError, match="lowres"):
        _unet(lowres=True)(torch.randn(1, 3, 16, 16), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="divisible by 2"):
        _unet()(torch.randn(1, 3, 15, 15), torch.tensor([1.0]))


def test_config_checks_and_builds():
    with pytest.raises(ValueError, match="attention_levels"):
        UNetConfig(dim_mults=(1, 2), attention_levels=(2,))
    cfg = UNetConfig(dim=8, dim_mults=(1, 2, 2), attention_levels=(2,), head_dim=8)
    assert cfg.downsample == 4
    net = build_unet(cfg, in_channels=3, out_channels=3)
    assert net(torch.randn(1, 3, 8, 8), torch.tensor([0.0])).shape == (1, 3, 8, 8)


def test_mid_attention_can_be_switched_off_leaving_a_convolutional_u_net():
    """UNetConfig.mid_attention=false: the middle block is two residual blocks (DALL·E 2's upsamplers: only
    convolutions); the default keeps ADM's attention there."""
    assert UNetConfig().mid_attention
    with_attention = build_unet(UNetConfig(dim=8, dim_mults=(1, 2), attention_levels=()), in_channels=3,
                                out_channels=3)
    assert sum(isinstance(m, AttentionBlock) for m in with_attention.modules()) == 1  # the middle's
    conv = build_unet(UNetConfig(dim=8, dim_mults=(1, 2), attention_levels=(), mid_attention=False), in_channels=3,
                      out_channels=3)
    assert not any(isinstance(m, AttentionBlock) for m in conv.modules())
    assert [type(m) for m in conv.middle] == [ResBlock, ResBlock]
    out = _randomise(conv)(torch.randn(2, 3, 8, 8), torch.tensor([1.0, 2.0]))
    assert out.shape == (2, 3, 8, 8) and torch.isfinite(out).all()


def test_a_condition_the_u_net_was_built_without_is_refused():
    net = _unet(lowres=True)  # no image embedding, text or labels: none of their layers
    assert not any(name.startswith(("image_to", "null_", "text_to", "label_", "context_"))
                   for name, _ in net.named_parameters())
    x, t, low = torch.randn(1, 3, 16, 16), torch.tensor([1.0]), torch.randn(1, 3, 8, 8)
    assert net(x, t, lowres=low).shape == (1, 6, 16, 16)
    for name, value in [("image_embed", torch.randn(1, 12)), ("text_embed", torch.randn(1, 2, 8)),
                        ("y", torch.tensor([1])), ("image_keep", torch.tensor([True]))]:
        with pytest.raises(ValueError, match=f"without the conditioning \\['{name}'\\]"):
            net(x, t, lowres=low, **{name: value})
    with pytest.raises(ValueError, match="lowres"):
        _unet()(x, t, lowres=low)
