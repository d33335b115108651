"""Training-timestep distributions of genforge.diffusion.build.draw_timesteps."""

import torch

from genforge.diffusion.build import draw_timesteps
from genforge.diffusion.config import DiffusionConfig
from genforge.core.random import BatchRandom


def draw(cfg: DiffusionConfig, n: int, offset: int = 0, size: int | None = None, step: int = 3) -> torch.Tensor:
    return draw_timesteps(cfg, BatchRandom(0, step, 0, n, offset, size or n))


def test_uniform_is_the_ddpm_draw():
    cfg = DiffusionConfig(num_timesteps=1000)
    expected = BatchRandom(0, 3, 0, 64, 0, 64).randint(1000)
    assert torch.equal(draw(cfg, 64), expected)  # unchanged stream: runs started before the option resume exactly


def test_logit_normal_statistics_and_range():
    cfg = DiffusionConfig(num_timesteps=1000, timestep_sampling="logit_normal", timestep_mean=0.5, timestep_std=1.0)
    t = draw(cfg, 200_000)
    assert t.dtype == torch.long and t.min() >= 0 and t.max() <= 999
    u = (t.double() + 0.5) / 1000  # bin centres
    logit = torch.log(u / (1 - u))
    assert abs(logit.mean().item() - 0.5) < 0.02
    assert abs(logit.std().item() - 1.0) < 0.03
    # the median of t/T is sigmoid(mean): more high-noise steps than uniform's 0.5
    assert abs(t.double().median().item() / 1000 - torch.sigmoid(torch.tensor(0.5)).item()) < 0.01


def test_logit_normal_is_split_invariant():
    cfg = DiffusionConfig(timestep_sampling="logit_normal", timestep_mean=1.0)
    full = draw(cfg, 32)
    halves = torch.cat([draw(cfg, 32, offset=0, size=16), draw(cfg, 32, offset=16, size=16)])
    assert torch.equal(full, halves)
