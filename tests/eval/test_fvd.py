"""FVD: the I3D file is the user's (a clear error without it), clips reach it as uint8 pixel values with the
network's own rescale and resize, and the distance is FID's formula on its features."""

from __future__ import annotations

import pytest
import torch

from fake_i3d import standin_file

import genforge.eval.distribution_metrics as dm
from genforge.nn.features import FeatureNetworkUnavailable, I3DFeatures


def test_without_the_i3d_file_fvd_is_a_clear_error(tmp_path):
    with pytest.raises(FeatureNetworkUnavailable, match="eval.i3d_weights"):
        I3DFeatures(None)
    with pytest.raises(FeatureNetworkUnavailable, match="is not a file"):
        I3DFeatures(tmp_path / "missing.pt")


def test_clips_reach_the_network_as_uint8_pixel_values(tmp_path):
    net = I3DFeatures(standin_file(tmp_path))
    clips = torch.rand(3, 3, 5, 8, 8) * 2 - 1  # [B, C, T, H, W] in [-1, 1]
    pixels = ((clips + 1) * 127.5).round()
    expected = net.net(pixels, rescale=True, resize=True, return_features=True)
    assert torch.equal(net(clips), expected)
    grey = clips[:, :1]
    assert torch.equal(net(grey), net(grey.expand(-1, 3, -1, -1, -1)))  # one channel shown as RGB
    assert net(clips).shape == (3, I3DFeatures.dim)


def test_fvd_is_zero_for_one_set_and_grows_with_the_shift(tmp_path):
    net = I3DFeatures(standin_file(tmp_path))
    generator = torch.Generator().manual_seed(0)
    real = torch.rand(64, 3, 5, 8, 8, generator=generator) * 1.6 - 0.8
    same = dm.frechet_distance(*dm.gaussian_stats(net(real)), *dm.gaussian_stats(net(real)))
    near = dm.frechet_distance(*dm.gaussian_stats(net(real)), *dm.gaussian_stats(net(real + 0.05)))
    far = dm.frechet_distance(*dm.gaussian_stats(net(real)), *dm.gaussian_stats(net(real + 0.2)))
    assert abs(same) < 1e-6 and 0 < near < far
