import torch
from torch import nn

from genforge.engine.ema import EMA


def test_update_matches_formula_and_warmup():
    lin = nn.Linear(2, 2)
    ema = EMA(lin, decay=0.9, warmup=False)
    before = ema.shadow["weight"].clone()
    with torch.no_grad():
        lin.weight.add_(1.0)
    ema.update(step=0)
    assert torch.allclose(ema.shadow["weight"], 0.9 * before + 0.1 * lin.weight)
    warm = EMA(lin, decay=0.9999, warmup=True)
    assert warm.decay_at(0) == 0.1 and warm.decay_at(10**7) == 0.9999
    late = EMA(lin, decay=0.9, warmup=False, start=5)
    assert late.decay_at(4) == 0.0 and late.decay_at(5) == 0.9


def test_swapped_in_restores_live_weights():
    lin = nn.Linear(2, 2)
    ema = EMA(lin, decay=0.5)
    live = lin.weight.detach().clone()
    ema.shadow["weight"].fill_(7.0)
    with ema.swapped_in() as m:
        assert torch.all(m.weight == 7.0)
    assert torch.equal(lin.weight, live)
