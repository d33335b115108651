"""The batches of a loader that streams forever (webdataset shards, parquet files), shared by their tests."""

import json
from pathlib import Path

from kill_harness import same_run

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.data.loader import build_train_batches


def take(loader, n: int) -> list:
    """n batches of a (forever) loader; its workers are shut down before returning."""
    it = iter(loader)
    try:
        return [next(it) for _ in range(n)]
    finally:
        del it


def slot_keys(dataset, data, train, world_size: int, workers: int, batches: int) -> dict[int, list[str]]:
    """The sample keys each slot `rank·W + worker` streams in the first `batches` micro-batches of every rank, in
    order: micro-batch j of a rank comes from its worker j % W."""
    keys: dict[int, list[str]] = {}
    for rank in range(world_size):
        stream = take(build_train_batches(dataset, data, train, world_size=world_size, rank=rank), batches)
        for worker in range(workers):
            keys[rank * workers + worker] = [k for b in stream[worker::workers] for k in b["key"]]
    return keys


def resumes_bit_identically(overrides: list[str], folder: Path, steps: int = 6, stop_at: int = 3) -> dict:
    """Train dit-debug with `overrides` straight through and again stopped at `stop_at` then resumed: the two runs
    are the same (kill_harness.same_run); returns the straight run's last trainer_state.json."""
    for name, stop in (("straight", None), ("resumed", stop_at), ("resumed", None)):
        make_trainer(load_config("dit-debug", overrides), folder / name).fit(stop_at=stop)
    assert same_run(folder / "straight", folder / "resumed")
    return json.loads((folder / "straight" / "checkpoints" / f"step-{steps:06d}" / "trainer_state.json").read_text())
