"""The motion-direction check: global Lucas–Kanade velocity of rendered moving-shapes clips, and still clips."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from genforge.data.moving_shapes import render_clips
from genforge.eval.motion import STILL, global_velocity, motion_direction


@pytest.mark.parametrize("frames, textured", [(9, 0.0), (5, 1.0)])
def test_direction_of_rendered_clips(frames, textured):
    clips = render_clips(64, 32, frames, seed=3, textured_fraction=textured)
    assert torch.equal(motion_direction(clips["video"]), clips["direction"])
    noisy = clips["video"] + 0.2 * torch.randn(clips["video"].shape, generator=torch.Generator().manual_seed(0))
    assert (motion_direction(noisy) == clips["direction"]).float().mean() >= 0.95


def test_velocity_of_an_exact_translation():
    x = torch.linspace(-3, 3, 32)
    blob = torch.exp(-(x[None] ** 2 + x[:, None] ** 2))  # a smooth blob [32, 32]
    frames = torch.stack([torch.roll(blob, shifts=s, dims=1) for s in range(4)])  # one pixel right per frame
    video = frames[None, None].expand(1, 3, 4, 32, 32)
    vx, vy = global_velocity(video)[0].tolist()
    assert vx == pytest.approx(1.0, abs=0.15) and abs(vy) < 0.05


def test_a_still_clip_has_no_direction():
    still = torch.rand(2, 3, 1, 16, 16).expand(2, 3, 5, 16, 16)
    assert motion_direction(still).tolist() == [STILL, STILL]
    with pytest.raises(ValueError, match="T >= 2"):
        global_velocity(torch.zeros(1, 3, 1, 8, 8))


class DevicesPerOp(TorchDispatchMode):
    """Records the devices of each aten op's tensor arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        devices = {a.device for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)}
        if len(devices) > 1:
            self.mixed.append(f"{func}: {sorted(map(str, devices))}")
        return func(*args, **(kwargs or {}))


def test_direction_is_computed_on_the_clips_device():
    """A tokenizer's reconstructions stay on the GPU (recon_direction): every op of the direction runs on the clips'
    device (meta stands in for a GPU here; a CPU tensor beside the clips failed on the H200)."""
    clips = torch.zeros(3, 3, 5, 16, 16, device="meta")
    with DevicesPerOp() as ops:
        directions = motion_direction(clips)
    assert ops.mixed == []
    assert directions.device.type == "meta" and directions.shape == (3,)
