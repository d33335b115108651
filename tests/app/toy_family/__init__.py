"""A toy family in one folder: config, model, task, registration (and presets/toy-debug.yaml). It denoises
images with one convolution and samples by denoising noise: enough to train, resume and sample through the
engine, and the proof that adding a family touches no file outside its folder (tests/app/test_toy_family.py)."""

from pathlib import Path
from typing import Literal

import torch
from torch import nn

from genforge.core.config import FamilyConfig
from genforge.core.family import BuildContext, register_family
from genforge.core.task import Task


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

    @torch.no_grad()
    def sample(self, cond, generator, n, **opts):
        noise = torch.randn(n, self.net.in_channels, self.size, self.size, generator=generator)
        return self.net(noise.to(self.net.weight.device)).clamp(-1, 1)


register_family(ToyConfig, ToyTask, Path(__file__).parent / "presets")
