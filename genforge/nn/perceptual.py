"""Perceptual distances over a frozen feature network of genforge.nn.features, training losses of the tokenizers:
the LPIPS-style distance (Zhang et al. 2018) taming-transformers' VQGAN trains with (and metric `perceptual`); the
MSE of a network's last features, as muse-maskgit-pytorch's VQGanVAE takes its perceptual loss; and the video
perceptual distance of C-ViViT (Villegas et al. 2022) on the I3D features FVD uses."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genforge.core.status import console
from genforge.nn.features import (FeatureNetworkUnavailable, FrozenFeatures, I3DFeatures, InceptionFeatures,
                                  VGG16Features)
from genforge.nn.frozen import Frozen

Network = Literal["inception", "vgg16"]
Distance = Literal["lpips", "feature_mse"]


def feature_network(network: Network, weights_path: str | Path | Sequence[str | Path] | None,
                    classifier: bool = False) -> tuple[FrozenFeatures, str]:
    """The frozen network of a perceptual distance and a description of its weights (vgg16: `weights_path` is
    required; with `classifier`, its fc6/fc7 too). Nothing is downloaded."""
    if network == "inception":
        net: FrozenFeatures = InceptionFeatures(weights_path)
        return net, f"{net.path}"
    if network == "vgg16":
        if weights_path is None:
            raise FeatureNetworkUnavailable("network='vgg16' needs weights_path: a local file with torchvision "
                                            "VGG16 (features.N.*) or LPIPS weights; nothing is downloaded")
        vgg = VGG16Features(weights_path, classifier=classifier)
        return vgg, f"{weights_path}, {'LPIPS linear heads' if vgg.lin is not None else 'uniform channel weights'}"
    raise ValueError(f"network must be 'inception' or 'vgg16', got {network!r}")


def input_rule(network: Network, resize: int | None) -> str:
    """How images reach the network, for the description a run prints."""
    return (f"resized to {resize}px" if resize else
            "at its own resolution" + (", at least 75px" if network == "inception" else ""))


class PerceptualLoss(nn.Module):
    """LPIPS-style distance (Zhang et al. 2018, eq. 1): per layer, unit-normalise features over channels,
    squared difference, weighted by the LPIPS linear heads when loaded, else summed over channels (LPIPS's
    `lpips=False` variant: each layer gives 2 - 2·cos in [0, 4], whatever its width; a channel mean would
    weight a 64-channel layer 32x more than a 2048-channel one), spatial mean; sum over layers.

    The frozen network is held by `Frozen` (genforge.nn.frozen): it stays out of `state_dict()` and `parameters()`
    (checkpoints do not carry ~90 MB of fixed weights) and follows the images to their device.
    """

    def __init__(self, network: Network = "inception",
                 weights_path: str | Path | Sequence[str | Path] | None = None,
                 resize: int | None = None) -> None:
        super().__init__()
        net, source = feature_network(network, weights_path)
        self.network = network
        # resize=None: the images' own size (Inception: at least its minimum, 75). Forward+backward of 16 32px
        # images on 1 CPU thread: Inception 0.57 s at 75px, 1.7 s at 128px, 14 s at 299px; VGG16 0.5 s at 32px
        self.resize = resize
        self.net = Frozen(net)  # outside the module tree (see the class docstring)
        self._description = f"perceptual distance: {network} ({source}), input {input_rule(network, resize)}"
        console().info(self._description)

    def describe(self) -> str:
        """The network and weight file in use."""
        return self._description

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-sample distance [B] between images x and y (float in [-1, 1]); 0 for identical images."""
        net = self.net.on(x.device)
        fx = net.blocks(x, self.resize)
        with torch.set_grad_enabled(torch.is_grad_enabled() and y.requires_grad):
            fy = net.blocks(y, self.resize)
        lin = getattr(net, "lin", None)
        total = x.new_zeros(x.shape[0], dtype=torch.float32)
        for k, (a, b) in enumerate(zip(fx, fy)):
            # F.normalize rather than LPIPS's f / (|f| + eps): same value, but no NaN gradient where f = 0
            diff = (F.normalize(a.float(), dim=1, eps=1e-10) - F.normalize(b.float(), dim=1, eps=1e-10)).square()
            per_pixel = (diff * lin[k] if lin is not None else diff).sum(1)  # [B, H, W]
            total = total + per_pixel.mean((1, 2))
        return total


class FeatureMSELoss(nn.Module):
    """MUSE's perceptual loss (muse-maskgit-pytorch `VQGanVAE`): the mean squared difference of a frozen network's
    last features, (1/D)·‖φ(x) − φ(y)‖², with no per-layer normalisation. φ: VGG16's fc7 after its ReLU (the seed's:
    torchvision VGG16 without its last two classifier layers; the weights file must hold `classifier.0.*` and
    `classifier.3.*`), or, where no VGG16 file is at hand, the FID Inception-v3's spatial mean of mixed_10 (the
    network's pool3 output for a 299px input), 2048-d. Held by `Frozen`, as `PerceptualLoss`."""

    def __init__(self, network: Network = "inception",
                 weights_path: str | Path | Sequence[str | Path] | None = None,
                 resize: int | None = None) -> None:
        super().__init__()
        net, source = feature_network(network, weights_path, classifier=True)
        self.network, self.resize = network, resize
        self.net = Frozen(net)
        what = "fc7" if network == "vgg16" else "mean of mixed_10"
        self._description = (f"perceptual distance: MSE of {network} {what} features ({source.split(', ')[0]}), "
                             f"input {input_rule(network, resize)}")
        console().info(self._description)

    def describe(self) -> str:
        """The network, its features and the weight file in use."""
        return self._description

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-sample distance [B] between images x and y (float in [-1, 1]); its batch mean is F.mse_loss of the
        features. The gradient reaches x (and y when it requires one)."""
        net = self.net.on(x.device)
        fx = net.global_features(x, self.resize)  # [B, D]
        with torch.set_grad_enabled(torch.is_grad_enabled() and y.requires_grad):
            fy = net.global_features(y, self.resize)
        return (fx.float() - fy.float()).square().mean(1)


def perceptual_distance(distance: Distance, network: Network = "inception",
                        weights_path: str | Path | Sequence[str | Path] | None = None,
                        resize: int | None = None) -> PerceptualLoss | FeatureMSELoss:
    """The perceptual distance `distance` names: lpips, taming's LPIPS-style `PerceptualLoss`; feature_mse, MUSE's
    `FeatureMSELoss`."""
    if distance == "feature_mse":
        return FeatureMSELoss(network, weights_path, resize)
    if distance == "lpips":
        return PerceptualLoss(network, weights_path, resize)
    raise ValueError(f"distance must be 'lpips' or 'feature_mse', got {distance!r}")


class VideoPerceptualLoss(nn.Module):
    """Phenaki's video perceptual loss L_VP (Villegas et al. 2022, C-ViViT's objective): the distance between the
    I3D features (Carreira & Zisserman 2017) of a reconstructed clip and of the clip, taken as a feature
    reconstruction loss (Johnson et al. 2016, eq. 2: the squared Euclidean distance normalised by the feature size),
    i.e. the mean over the D features of (φ(x̂) − φ(x))². φ is the I3D TorchScript FVD reads (`eval.i3d_weights`,
    genforge.nn.features.I3DFeatures), held by `Frozen`: out of the task's state dict and parameters."""

    def __init__(self, path: str | Path | None) -> None:
        super().__init__()
        net = I3DFeatures(path, needed_by="the video perceptual loss (model.video_perceptual.weight > 0)")
        self.net = Frozen(net)
        console().info(f"video perceptual distance: I3D features ({net.path})")

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-clip distance [B] between clips x and y [B, C, T, H, W] (float in [-1, 1]); 0 for identical clips.
        The gradient reaches x (and y when it requires one)."""
        net = self.net.on(x.device)
        fx = net.features(x)  # [B, D]
        with torch.set_grad_enabled(torch.is_grad_enabled() and y.requires_grad):
            fy = net.features(y)
        return (fx - fy).square().mean(1)
