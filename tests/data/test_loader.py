import numpy as np
import pytest
import torch

from genforge.data.loader import StepBatchSampler, collate


def _take(sampler, n):
    it = iter(sampler)
    return [next(it) for _ in range(n)]


def test_ranks_and_accumulation_partition_the_global_batch():
    n, batch = 40, 8
    whole = _take(StepBatchSampler(n, batch, seed=3), 5)
    for accum, world in ((2, 1), (1, 2), (2, 2)):
        per_rank = [_take(StepBatchSampler(n, batch, accum, world, r, seed=3), 5 * accum) for r in range(world)]
        for step in range(5):
            got = []
            for micro in range(accum):  # rank-major inside each micro-batch, as the trainer slices its noise
                for r in range(world):
                    got += per_rank[r][step * accum + micro]
            assert got == whole[step]


def test_epoch_covers_each_sample_once_and_resume_continues():
    sampler = StepBatchSampler(20, 5, seed=0)
    epoch = [i for b in _take(sampler, 4) for i, _ in b]
    assert sorted(epoch) == list(range(20))
    straight = _take(StepBatchSampler(20, 5, seed=0), 10)
    resumed = _take(StepBatchSampler(20, 5, seed=0, start_step=6), 4)
    assert resumed == straight[6:]


def test_bad_sizes_are_clear_errors():
    with pytest.raises(ValueError, match="divisible"):
        StepBatchSampler(100, 10, grad_accum=3)
    with pytest.raises(ValueError, match="fewer than"):
        StepBatchSampler(4, 8)


def test_collate_drops_and_reports_bad_samples():
    good = {"image": torch.zeros(3, 2, 2), "label": 1, "key": "a"}
    batch = collate([good, {"key": "b.jpg", "bad": "truncated"}, dict(good, key="c", label=np.int64(2))])
    assert batch["image"].shape == (2, 3, 2, 2)
    assert batch["label"].tolist() == [1, 2] and batch["key"] == ["a", "c"]
    assert batch["skipped"] == [("b.jpg", "truncated")]
