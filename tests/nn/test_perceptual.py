"""Phenaki's video perceptual distance (genforge.nn.perceptual.VideoPerceptualLoss) on the I3D file FVD reads: the
mean squared difference of the features, differentiable, its network out of the owner's state dict."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fake_i3d import conv_standin_file

from genforge.nn.features import FeatureNetworkUnavailable
from genforge.nn.perceptual import VideoPerceptualLoss


def test_the_video_perceptual_distance_is_the_mean_squared_difference_of_i3d_features(tmp_path):
    path = conv_standin_file(tmp_path)
    loss = VideoPerceptualLoss(path)
    net = torch.jit.load(path)
    generator = torch.Generator().manual_seed(0)
    x, y = (torch.rand(3, 3, 5, 8, 8, generator=generator) * 2 - 1 for _ in range(2))  # [B, C, T, H, W]

    def features(clips):  # the call FVD makes, on unquantised pixel values in [0, 255]
        return net((clips + 1) * 127.5, rescale=True, resize=True, return_features=True)

    expected = (features(x) - features(y)).square().mean(1)  # [B]: (1/D)·‖φ(x) − φ(y)‖²
    torch.testing.assert_close(loss(x, y), expected)
    assert torch.equal(loss(x, x), torch.zeros(3))
    grey = x[:, :1]
    torch.testing.assert_close(loss(grey, y[:, :1]), loss(grey.expand(-1, 3, -1, -1, -1),
                                                          y[:, :1].expand(-1, 3, -1, -1, -1)))
    x.requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(x, y).sum(), x)
    assert grad.abs().sum() > 0 and not y.requires_grad  # the gradient reaches the reconstruction, not the target
    owner = nn.Module()
    owner.video_perceptual = loss
    assert not list(owner.state_dict()) and not list(owner.parameters())  # the I3D weights stay out of checkpoints


def test_without_the_i3d_file_the_loss_names_eval_i3d_weights(tmp_path):
    with pytest.raises(FeatureNetworkUnavailable, match="video perceptual loss .*needs a local TorchScript I3D"):
        VideoPerceptualLoss(None)
    with pytest.raises(FeatureNetworkUnavailable, match="eval.i3d_weights: .*missing.pt is not a file"):
        VideoPerceptualLoss(tmp_path / "missing.pt")
