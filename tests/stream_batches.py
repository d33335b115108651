"""The batches of a loader that streams forever (webdataset shards, parquet files), shared by their tests."""

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
