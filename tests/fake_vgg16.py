"""Random VGG16 weights under torchvision's key names: a stand-in for the LPIPS VGG16 file a perceptual loss reads."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from genforge.nn.features import VGG16_LAYOUT


def vgg_state() -> dict[str, torch.Tensor]:
    """Random VGG16 conv weights under torchvision's key names (He init, so activations stay in range)."""
    gen = torch.Generator().manual_seed(0)
    state, channels, index = {}, 3, 0
    for item in VGG16_LAYOUT:
        if item == "M":
            index += 1
            continue
        he_std = (2 / (9 * channels)) ** 0.5
        state[f"features.{index}.weight"] = torch.randn(item, channels, 3, 3, generator=gen) * he_std
        state[f"features.{index}.bias"] = torch.zeros(item)
        channels, index = item, index + 2  # conv, relu
    return state


def vgg_file(folder) -> str:
    """A safetensors file of `vgg_state()` in `folder`."""
    path = folder / "vgg16.safetensors"
    save_file(vgg_state(), str(path))
    return str(path)


def vgg_classifier_state(width: int) -> dict[str, torch.Tensor]:
    """Random fc6 and fc7 under torchvision's key names, `width` wide (torchvision's: 4096; tests monkeypatch
    genforge.nn.features.VGG16_FC_WIDTH to a small one)."""
    gen = torch.Generator().manual_seed(1)
    flat = 512 * 7 * 7
    return {"classifier.0.weight": torch.randn(width, flat, generator=gen) * (2 / flat) ** 0.5,
            "classifier.0.bias": torch.randn(width, generator=gen) * 0.1,
            "classifier.3.weight": torch.randn(width, width, generator=gen) * (2 / width) ** 0.5,
            "classifier.3.bias": torch.randn(width, generator=gen) * 0.1}
