"""One collectives module for training, evaluation and encoding (genforge.core.collectives): the single-process
identity here, and two gloo processes (spawned; a few seconds) for what the ranks exchange."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from genforge.core.collectives import (any_rank, every_rank, gather_objects, gather_rows, gather_step_rows,
                                       main_decides, rank_and_world)


def test_one_process_is_the_identity():
    assert rank_and_world() == (0, 1)
    assert main_decides(lambda: 7) == 7 and any_rank(3) == 3 and every_rank(True) and not every_rank(False)
    assert gather_objects("x") == ["x"]
    assert torch.equal(gather_rows(torch.tensor([[1], [2]]), torch.tensor([1, 0])), torch.tensor([[2], [1]]))
    steps = gather_step_rows(("frame_mask",), [{"frame_mask": torch.ones(2, 3)}, {"frame_mask": torch.ones(1, 3)}], 2)
    assert steps["frame_mask"].shape == (4, 3) and steps["frame_mask"][3].sum() == 0  # the short micro-batch padded


def _ranks(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        result = {"decided": main_decides(lambda: "rank 0's"), "any": any_rank(rank), "every": every_rank(rank == 0),
                  "objects": gather_objects(rank)}
        with pytest.raises(KeyError, match="refused"):
            main_decides(lambda: (_ for _ in ()).throw(LookupError("refused")), (LookupError,), KeyError)
        # rank r holds samples r, r + 2: gathered in sample order on every rank
        result["rows"] = gather_rows(torch.tensor([[10 * rank], [10 * rank + 1]]), torch.tensor([rank, rank + 2]))
        # two micro-batches of 2 per rank: micro-batch m of rank p holds rows (m·2 + p)·2 onwards
        batches = [{"label": torch.tensor([100 * m + 10 * rank, 100 * m + 10 * rank + 1])} for m in range(2)]
        result["step"] = gather_step_rows(("label",), batches, 2)["label"]
        out[rank] = result
    finally:
        dist.destroy_process_group()


def test_two_processes_exchange_as_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_ranks, args=(port, out), nprocs=2)
    for rank in (0, 1):
        r = out[rank]
        assert r["decided"] == "rank 0's" and r["any"] == 1 and r["every"] is False and r["objects"] == [0, 1]
        assert r["rows"].flatten().tolist() == [0, 10, 1, 11]
        assert r["step"].tolist() == [0, 1, 10, 11, 100, 101, 110, 111]
