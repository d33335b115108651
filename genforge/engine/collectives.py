"""How the processes of a run take one decision: the main process decides and tells the others, or every rank
learns whether any rank saw something. One process: the same calls, with nothing exchanged."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list
from torch import Tensor

T = TypeVar("T")


def main_decides(acc: Accelerator, decide: Callable[[], T], refusals: tuple[type[BaseException], ...] = (),
                 raise_as: Callable[[str], BaseException] | None = None) -> T:
    """`decide()` on the main process, its result (any picklable value) on every rank. When it raises one of
    `refusals`, every rank raises `raise_as(message)` (default: the first refusal's type) with the main process's
    message, so no rank goes on alone."""
    decision: list[object] = [None]
    if acc.is_main_process:
        try:
            decision = [("value", decide())]
        except refusals as err:
            decision = [("error", str(err))]
    if acc.num_processes > 1:
        decision = broadcast_object_list(decision)
    kind, payload = decision[0]
    if kind == "error":
        raise (raise_as or refusals[0])(payload)
    return payload


def any_rank(acc: Accelerator, flag: bool | int) -> int:
    """The largest value of an integer flag over the ranks: every rank takes the same decision."""
    if acc.num_processes == 1:
        return int(flag)
    value = torch.tensor([int(flag)], device=acc.device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return int(value.item())


def gather_rows(acc: Accelerator, fields: tuple[str, ...], batches: list[dict[str, Any]], micro: int
                ) -> dict[str, Tensor]:
    """The `fields` (a task's `global_fields`) that this step's micro-batches have, for every sample of the global
    batch [G, ...] in BatchRandom's row order (micro-batch m of rank p holds rows (m·P + p)·micro onwards): this
    rank's micro-batches, each padded to `micro` rows with zeros (a stream's micro-batch short of its unreadable
    records), gathered over the processes. Every rank's batches have the same fields (data config)."""
    gathered = {}
    for name in fields:
        if name not in batches[0]:
            continue
        rows = [b[name] for b in batches]
        mine = torch.stack([torch.cat([v, v.new_zeros(micro - len(v), *v.shape[1:])]) for v in rows])
        if acc.num_processes > 1:  # [A, micro, ...] from each rank, as integers (gloo gathers no bool)
            mine = acc.gather(mine[None].long()).to(mine.dtype)  # [P, A, micro, ...]
            mine = mine.transpose(0, 1)  # [A, P, micro, ...]
        gathered[name] = mine.reshape(-1, *rows[0].shape[1:])  # [G, ...]
    return gathered


def peer_failed(err: BaseException) -> bool:
    """An error raised because a peer process died or hung (gloo/NCCL timeouts and closed connections)."""
    if isinstance(err, torch.distributed.DistError):
        return True
    text = str(err)
    return any(sign in text for sign in ("gloo", "NCCL", "Timed out", "timed out", "Connection closed"))
