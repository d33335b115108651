"""A stand-in for StyleGAN-V's I3D TorchScript file (metric fvd): its call signature, features from a fixed projection."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class StandInI3D(nn.Module):
    """The call signature of StyleGAN-V's i3d_torchscript.pt; features: a fixed projection of per-channel statistics
    (after the rescale to [-1, 1] the real network does when asked)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 400)

    def forward(self, x: Tensor, rescale: bool = False, resize: bool = False, return_features: bool = False) -> Tensor:
        if rescale:
            x = x / 127.5 - 1
        return self.proj(torch.cat([x.mean((2, 3, 4)), x.std((2, 3, 4))], 1))


def standin_file(folder) -> str:
    torch.manual_seed(0)
    path = folder / "i3d_torchscript.pt"
    torch.jit.script(StandInI3D()).save(str(path))
    return str(path)


class ConvStandInI3D(nn.Module):
    """A small Conv3d network with the call signature of StyleGAN-V's i3d_torchscript.pt: clips [B, 3, T, H, W] of
    pixel values in [0, 255], rescaled to [-1, 1] when asked (`resize` is ignored: test clips are tiny); features
    [B, 400] from a spatio-temporal convolution, ReLU, a global average pool and a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1)
        self.proj = nn.Linear(8, 400)

    def forward(self, x: Tensor, rescale: bool = False, resize: bool = False, return_features: bool = False) -> Tensor:
        if rescale:
            x = x / 127.5 - 1
        return self.proj(torch.relu(self.conv(x)).mean((2, 3, 4)))


def conv_standin_file(folder) -> str:
    torch.manual_seed(0)
    path = folder / "i3d_conv_torchscript.pt"
    torch.jit.script(ConvStandInI3D()).save(str(path))
    return str(path)
