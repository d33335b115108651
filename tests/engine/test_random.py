import torch

from genforge.core.random import BatchRandom


def test_rows_do_not_depend_on_split():
    whole = BatchRandom(seed=1, step=3, phase=0, global_size=8, offset=0, size=8)
    halves = [BatchRandom(1, 3, 0, 8, off, 4) for off in (0, 4)]
    for draw in ("randn", "rand"):
        full = getattr(whole, draw)(2, 3)
        parts = torch.cat([getattr(h, draw)(2, 3) for h in halves])
        assert torch.equal(full, parts)
    assert torch.equal(whole.randint(100), torch.cat([h.randint(100) for h in halves]))


def test_draws_differ_by_step_phase_and_draw():
    a = BatchRandom(0, 0, 0, 4, 0, 4)
    first, second = a.randn(3), a.randn(3)
    assert not torch.equal(first, second)
    assert not torch.equal(first, BatchRandom(0, 1, 0, 4, 0, 4).randn(3))
    assert not torch.equal(first, BatchRandom(0, 0, 1, 4, 0, 4).randn(3))
    assert torch.equal(first, BatchRandom(0, 0, 0, 4, 0, 4).randn(3))
