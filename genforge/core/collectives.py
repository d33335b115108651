"""How the processes of a run work as one (torchrun / accelerate launch; gloo on CPUs, NCCL on GPUs): the main
process decides and tells the others, every rank learns whether any rank saw something, and rows or objects held by
each rank are gathered. Training, evaluation, sampling and encoding all use these; without an initialised process
group each one is the single-process identity."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

T = TypeVar("T")


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _comm_device() -> torch.device:
    """Where collective tensors must live: the current GPU for NCCL, else the CPU (gloo)."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def main_decides(decide: Callable[[], T], refusals: tuple[type[BaseException], ...] = (),
                 raise_as: Callable[[str], BaseException] | None = None) -> T:
    """`decide()` on the main process (rank 0), its result (any picklable value) on every rank. When it raises one
    of `refusals`, every rank raises `raise_as(message)` (default: the first refusal's type) with the main process's
    message, so no rank goes on alone."""
    rank, world = rank_and_world()
    decision: list[object] = [None]
    if rank == 0:
        try:
            decision = [("value", decide())]
        except refusals as err:
            decision = [("error", str(err))]
    if world > 1:
        dist.broadcast_object_list(decision, src=0)
    kind, payload = decision[0]
    if kind == "error":
        raise (raise_as or refusals[0])(payload)
    return payload


def any_rank(flag: bool | int) -> int:
    """The largest value of an integer flag over the ranks, on every rank (so all of them take the same decision);
    every rank must call it at the same point: also a barrier."""
    rank, world = rank_and_world()
    if world == 1:
        return int(flag)
    value = torch.tensor([int(flag)], device=_comm_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


def every_rank(ok: bool) -> bool:
    """Whether `ok` holds on every rank, on every rank (so all of them stop when one failed); a barrier too."""
    return not any_rank(not ok)


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's picklable `obj`, in rank order, on every rank ([obj] without a process group)."""
    rank, world = rank_and_world()
    if world == 1:
        return [obj]
    every: list[Any] = [None] * world
    dist.all_gather_object(every, obj)
    return every


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


def gather_step_rows(fields: tuple[str, ...], batches: list[dict[str, Any]], micro: int) -> dict[str, Tensor]:
    """The `fields` (a task's `global_fields`) that this optimizer step's micro-batches have, for every sample of
    the global batch [G, ...] in BatchRandom's row order (micro-batch m of rank p holds rows (m·P + p)·micro
    onwards): this rank's micro-batches, each padded to `micro` rows with zeros (a stream's micro-batch short of its
    unreadable records), gathered over the processes. Every rank's batches have the same fields (data config)."""
    rank, world = rank_and_world()
    gathered = {}
    for name in fields:
        if name not in batches[0]:
            continue
        rows = [b[name] for b in batches]
        mine = torch.stack([torch.cat([v, v.new_zeros(micro - len(v), *v.shape[1:])]) for v in rows])  # [A, micro, ...]
        if world > 1:  # as integers (gloo gathers no bool), on the backend's device
            sent = mine.long().to(_comm_device())
            parts = [torch.empty_like(sent) for _ in range(world)]
            dist.all_gather(parts, sent)
            mine = torch.stack(parts).to(device=mine.device, dtype=mine.dtype).transpose(0, 1)  # [A, P, micro, ...]
        gathered[name] = mine.reshape(-1, *rows[0].shape[1:])  # [G, ...]
    return gathered


def peer_failed(err: BaseException) -> bool:
    """An error raised because a peer process died or hung (gloo/NCCL timeouts and closed connections)."""
    if isinstance(err, torch.distributed.DistError):
        return True
    text = str(err)
    return any(sign in text for sign in ("gloo", "NCCL", "Timed out", "timed out", "Connection closed"))
