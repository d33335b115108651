"""Phenaki's video perceptual distance (genforge.nn.perceptual.VideoPerceptualLoss) on the I3D file FVD reads: the
mean squared difference of the features, differentiable, its network out of the owner's state dict; and MUSE's
feature-MSE perceptual loss (FeatureMSELoss): the MSE of VGG16's fc7 (or Inception's mean mixed_10) features."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from fake_i3d import conv_standin_file
from fake_vgg16 import vgg_classifier_state, vgg_state

from genforge.nn import features
from genforge.nn.features import LPIPS_SCALE, LPIPS_SHIFT, VGG16_LAYOUT, FeatureNetworkUnavailable
from genforge.nn.perceptual import FeatureMSELoss, PerceptualLoss, VideoPerceptualLoss, perceptual_distance

FC_WIDTH = 8  # fc6/fc7 of the stand-in VGG16 (torchvision's: 4096)


@pytest.fixture
def vgg_with_classifier(tmp_path, monkeypatch):
    """A VGG16 file with torchvision's conv and classifier keys, fc6/fc7 FC_WIDTH wide."""
    monkeypatch.setattr(features, "VGG16_FC_WIDTH", FC_WIDTH)
    path = tmp_path / "vgg16.safetensors"
    save_file({**vgg_state(), **vgg_classifier_state(FC_WIDTH)}, str(path))
    return path


def vgg_fc7_by_hand(images: torch.Tensor) -> torch.Tensor:
    """torchvision's VGG16 through fc7 + ReLU, written out from the state dicts: [B, FC_WIDTH]."""
    convs, fc = vgg_state(), vgg_classifier_state(FC_WIDTH)
    shift, scale = torch.tensor(LPIPS_SHIFT).view(1, 3, 1, 1), torch.tensor(LPIPS_SCALE).view(1, 3, 1, 1)
    x, index = (images - shift) / scale, 0  # ImageNet normalisation of images in [-1, 1]
    for item in (*VGG16_LAYOUT, "M"):  # torchvision's features end with a fifth max pool
        if item == "M":
            x, index = F.max_pool2d(x, 2), index + 1
        else:
            x, index = F.relu(F.conv2d(x, convs[f"features.{index}.weight"], convs[f"features.{index}.bias"],
                                       padding=1)), index + 2
    x = F.adaptive_avg_pool2d(x, 7).flatten(1)  # [B, 25088]
    x = F.relu(F.linear(x, fc["classifier.0.weight"], fc["classifier.0.bias"]))  # fc6
    return F.relu(F.linear(x, fc["classifier.3.weight"], fc["classifier.3.bias"]))  # fc7


def test_feature_mse_is_the_mse_of_vgg16_fc7_features(vgg_with_classifier):
    """MUSE's perceptual term (muse-maskgit-pytorch VQGanVAE): F.mse_loss of the VGG16 features of the two images, the
    network cut after fc7's ReLU; per sample here, so the batch mean is the seed's value."""
    loss = FeatureMSELoss("vgg16", vgg_with_classifier)
    generator = torch.Generator().manual_seed(0)
    x, y = (torch.rand(3, 3, 32, 32, generator=generator) * 2 - 1 for _ in range(2))
    fx, fy = vgg_fc7_by_hand(x), vgg_fc7_by_hand(y)
    assert fx.shape == (3, FC_WIDTH) and fx.abs().sum() > 0
    torch.testing.assert_close(loss(x, y), (fx - fy).square().mean(1))
    torch.testing.assert_close(loss(x, y).mean(), F.mse_loss(fx, fy))
    assert torch.equal(loss(x, x), torch.zeros(3))
    x.requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(x, y).sum(), x)
    assert grad.abs().sum() > 0
    owner = nn.Module()
    owner.perceptual = loss
    assert not list(owner.state_dict()) and not list(owner.parameters())  # VGG16 stays out of checkpoints
    assert "MSE of vgg16 fc7" in loss.describe()
    small_x, small_y = x.detach()[..., :16, :16], y[..., :16, :16]
    with pytest.raises(ValueError, match="at least 32px .*model.perceptual.resize"):  # five 2x2 max pools
        loss(small_x, small_y)
    up_x, up_y = (F.interpolate(v, size=32, mode="bilinear") for v in (small_x, small_y))
    torch.testing.assert_close(FeatureMSELoss("vgg16", vgg_with_classifier, resize=32)(small_x, small_y),
                               (vgg_fc7_by_hand(up_x) - vgg_fc7_by_hand(up_y)).square().mean(1))


def test_feature_mse_on_inception_is_the_mse_of_its_mean_mixed_10_features():
    loss = FeatureMSELoss("inception")
    net = loss.net.on(torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    x, y = (torch.rand(2, 3, 16, 16, generator=generator) * 2 - 1 for _ in range(2))
    fx, fy = (net.blocks(v)[-1].mean((2, 3)) for v in (x, y))  # mixed_10 at 75px (its smallest input): [B, 2048]
    assert fx.shape == (2, 2048)
    torch.testing.assert_close(loss(x, y), (fx - fy).square().mean(1))


def test_the_distance_is_chosen_by_name_and_feature_mse_needs_vgg16s_classifier(tmp_path, vgg_with_classifier):
    assert type(perceptual_distance("feature_mse", "vgg16", vgg_with_classifier)) is FeatureMSELoss
    assert type(perceptual_distance("lpips", "vgg16", vgg_with_classifier)) is PerceptualLoss
    convs_only = tmp_path / "lpips-like.safetensors"
    save_file(vgg_state(), str(convs_only))
    PerceptualLoss("vgg16", convs_only)  # LPIPS reads the conv layers alone
    with pytest.raises(ValueError, match="missing classifier.0.weight.*torchvision VGG16 state dict"):
        FeatureMSELoss("vgg16", convs_only)
    with pytest.raises(FeatureNetworkUnavailable, match="needs weights_path"):
        FeatureMSELoss("vgg16")
    with pytest.raises(ValueError, match="distance must be"):
        perceptual_distance("l2", "inception")  # type: ignore[arg-type]


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
