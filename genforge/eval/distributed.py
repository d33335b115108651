"""Collectives for work split over several processes (torchrun / accelerate launch): evaluation and sampling (each
rank handles its share of the samples, rows are gathered in sample order, rank 0 computes the statistics or writes
the grid) and encoding (each rank encodes a part of the data set; rank 0 writes the manifest once every rank
succeeded). Without an initialised process group every function is the single-process identity."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _comm_device() -> torch.device:
    """Where collective tensors must live: the current GPU for NCCL, else the CPU (gloo)."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def gather_rows(rows: Tensor, index: Tensor) -> Tensor:
    """Rows [n_local, ...] of every rank with their global sample numbers `index` [n_local] -> all rows [N, ...]
    in sample order, on every rank (CPU). Ranks may hold different counts (even 0, whose placeholder rows may lack
    the trailing shape, e.g. [0] for [n, T]): rows are padded to the largest count for `all_gather`, and the
    padding removed before sorting."""
    rank, world = rank_and_world()
    if world == 1:
        return rows[index.argsort()]
    device = _comm_device()
    shapes: list[tuple[int, ...]] = [()] * world
    dist.all_gather_object(shapes, tuple(rows.shape))
    sizes = [shape[0] for shape in shapes]
    trailing = next((shape[1:] for shape in shapes if shape[0]), tuple(rows.shape[1:]))
    rows = rows.reshape(len(rows), *trailing)
    padded = rows.new_zeros((max(sizes), *rows.shape[1:]), device=device)
    padded[: len(rows)] = rows.to(device)
    numbers = torch.full((max(sizes),), -1, dtype=torch.long, device=device)
    numbers[: len(rows)] = index.to(device)
    all_rows = [torch.empty_like(padded) for _ in range(world)]
    all_numbers = [torch.empty_like(numbers) for _ in range(world)]
    dist.all_gather(all_rows, padded)
    dist.all_gather(all_numbers, numbers)
    rows = torch.cat([r[:size] for r, size in zip(all_rows, sizes)]).cpu()
    index = torch.cat([i[:size] for i, size in zip(all_numbers, sizes)]).cpu()
    return rows[index.argsort()]


def rank0_decides(flag: bool) -> bool:
    """Rank 0's `flag` on every rank (e.g. "the cache file exists", which only rank 0 checks)."""
    rank, world = rank_and_world()
    if world == 1:
        return flag
    value = torch.tensor([int(flag)], device=_comm_device())
    dist.broadcast(value, src=0)
    return bool(value.item())


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's picklable `obj`, in rank order, on every rank ([obj] without a process group)."""
    rank, world = rank_and_world()
    if world == 1:
        return [obj]
    every: list[Any] = [None] * world
    dist.all_gather_object(every, obj)
    return every


def all_ranks_ok(ok: bool) -> bool:
    """Whether `ok` holds on every rank, on every rank (so all of them stop when one failed); every rank must call
    it at the same point. Also a barrier."""
    rank, world = rank_and_world()
    if world == 1:
        return ok
    value = torch.tensor([int(ok)], device=_comm_device())
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())
