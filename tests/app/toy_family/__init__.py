"""A toy family in one folder: config, model, task, registration (and presets/toy-debug.yaml). It denoises
images with one convolution and samples by denoising noise: enough to train, resume and sample through the
engine, and the proof that adding a family touches no file outside its folder (tests/app/test_toy_family.py)."""

from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from genforge.core.config import FamilyConfig, SampleOptions
from genforge.core.family import BuildContext, register_family
from genforge.core.task import FamilyTraits, Task


class ToySampleOptions(SampleOptions):
    """The toy's own `genforge sample` option (the CLI makes --noise-scale of it)."""

    noise_scale: float | None = Field(None, gt=0.0, description="scale of the noise the toy denoises (default: 1)")


class ToyConfig(FamilyConfig):
    family: Literal["toy"] = "toy"
    noise: float = 0.5


class ToyTask(Task):
    def __init__(self, cfg: ToyConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.cfg, self.size = cfg, ctx.info.image_size
        self.net = nn.Conv2d(ctx.info.channels, ctx.info.channels, 3, padding=1)  # x + σ·ε -> x

    def loss(self, batch, phase, step):
        x = batch["image"]
        noisy = x + self.cfg.noise * batch["rng"].randn(*x.shape[1:])
        loss = (self.net(noisy) - x).square().mean()
        return loss, {"mse": loss.detach()}

    def resolve(self, options=None):
        return ToySampleOptions.of(options).filled(noise_scale=1.0)

    @torch.no_grad()
    def sample(self, cond, generator, n, options, progress=False):
        scale = options.noise_scale
        noise = scale * torch.randn(n, self.net.in_channels, self.size, self.size, generator=generator)
        return self.net(noise.to(self.net.weight.device)).clamp(-1, 1)


register_family(ToyConfig, ToyTask, Path(__file__).parent / "presets",
                traits=FamilyTraits(sample_options=ToySampleOptions))
