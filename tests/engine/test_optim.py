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
