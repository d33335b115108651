import math

import pytest

from genforge.core.config import TrainConfig
from genforge.engine.optim import lr_factor


def test_warmup_then_constant():
    cfg = TrainConfig(steps=100, warmup_steps=10)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(50, cfg) == 1.0


def test_cosine_reaches_floor():
    cfg = TrainConfig(steps=110, warmup_steps=10, lr_schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(110, cfg) == pytest.approx(0.1)


def test_exponential_decays_by_the_rate_every_interval_after_the_warmup():
    """DALLE-pytorch train_vae.py: ExponentialLR(gamma=0.98) stepped every 100 steps."""
    cfg = TrainConfig(steps=10_000, lr_schedule="exponential")
    assert (cfg.lr_decay_rate, cfg.lr_decay_every) == (0.98, 100)
    assert [lr_factor(s, cfg) for s in (0, 99, 100, 199, 200)] == [1.0, 1.0, 0.98, 0.98, 0.98**2]
    assert lr_factor(1_050, cfg) == pytest.approx(0.98**10)
    warm = TrainConfig(steps=100, warmup_steps=10, lr_schedule="exponential", lr_decay_rate=0.5, lr_decay_every=20)
    assert lr_factor(5, warm) == pytest.approx(0.6)  # the warm-up comes first
    assert [lr_factor(s, warm) for s in (10, 29, 30, 50, 70)] == [1.0, 1.0, 0.5, 0.25, 0.125]
    floored = warm.model_copy(update={"min_lr_ratio": 0.2})
    assert lr_factor(50, floored) == 0.25 and lr_factor(70, floored) == 0.2


def test_the_scheduler_follows_the_exponential_factor_and_phases_override_it():
    import torch

    from genforge.core.config import PhaseConfig
    from genforge.engine.optim import build_scheduler

    cfg = TrainConfig(steps=50, lr=0.1, lr_schedule="exponential", lr_decay_rate=0.5, lr_decay_every=3,
                      phases={"discriminator": PhaseConfig(lr_decay_every=1)})
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    sched = build_scheduler(opt, cfg)
    seen = []
    for _ in range(7):
        seen.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025])
    phase = cfg.for_phase("discriminator")
    assert phase.lr_decay_every == 1 and lr_factor(2, phase) == 0.25
