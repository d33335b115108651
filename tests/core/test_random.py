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


def test_rand_rows_is_split_invariant_and_draws_only_its_rows():
    """Per-row draws: any split of the global batch sees the same rows, and a micro-batch of a huge global batch
    costs only its own rows (a whole-batch draw of [10**12, 64] could not be made)."""
    whole = BatchRandom(7, 3, 0, 6, 0, 6).rand_rows(4, 5)
    parts = [BatchRandom(7, 3, 0, 6, offset, 3).rand_rows(4, 5) for offset in (0, 3)]
    assert whole.shape == (6, 4, 5) and torch.equal(torch.cat(parts), whole)
    assert (whole >= 0).all() and (whole < 1).all() and not torch.equal(whole[0], whole[1])
    huge = BatchRandom(7, 3, 0, 10**12, 10**11, 2).rand_rows(64)
    assert huge.shape == (2, 64)
