import json

import numpy as np
import pytest
import torch

from genforge.data.base import BadDataError
from genforge.data.loader import ReplaceUnreadable, SkipLog, StepBatchSampler, collate


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


class _SomeBad(torch.utils.data.Dataset):
    """Items 1 and 2 are unreadable; 5 items."""

    def __len__(self):
        return 5

    def __getitem__(self, item):
        index, _ = item
        if index in (1, 2):
            return {"key": f"{index}.jpg", "bad": "truncated"}
        return {"image": torch.full((3, 2, 2), float(index)), "label": index, "key": f"{index}.jpg"}


def test_unreadable_samples_are_replaced_by_the_next_readable_one_and_reported():
    data = ReplaceUnreadable(_SomeBad())
    batch = collate([data[(0, 0)], data[(1, 0)], data[(2, 0)]])
    assert batch["image"].shape == (3, 3, 2, 2)  # the batch keeps its size
    assert batch["label"].tolist() == [0, 3, 3] and batch["key"] == ["0.jpg", "3.jpg", "3.jpg"]
    assert batch["skipped"] == [("1.jpg", "truncated"), ("2.jpg", "truncated"), ("2.jpg", "truncated")]
    assert collate([data[(4, 0)], data[(0, 0)]])["skipped"] == []


def test_all_unreadable_is_a_clear_error():
    class AllBad(_SomeBad):
        def __getitem__(self, item):
            return {"key": f"{item[0]}.jpg", "bad": "not an image"}

    with pytest.raises(BadDataError, match="unreadable samples in a row"):  # a ValueError: the CLI exits 2
        ReplaceUnreadable(AllBad(), max_tries=5)[(0, 0)]


def test_skip_log_lists_each_file_once_and_survives_a_resume(tmp_path):
    log = SkipLog(tmp_path / "skipped.jsonl")
    log.record(8, [("a.jpg", "truncated"), ("a.jpg", "truncated")], step=0)
    log.record(8, [("a.jpg", "truncated"), ("b.jpg", "empty")], step=1)
    assert (log.reads, log.bad) == (20, 4)
    resumed = SkipLog(tmp_path / "skipped.jsonl")
    resumed.record(8, [("b.jpg", "empty"), ("c.jpg", "bomb")], step=2)
    rows = [json.loads(line) for line in (tmp_path / "skipped.jsonl").read_text().splitlines()]
    assert [(r["key"], r["step"]) for r in rows] == [("a.jpg", 0), ("b.jpg", 1), ("c.jpg", 2)]
