"""Cross-rank consistency (as EDM2's `check_ddp_consistency`): after each checkpoint every rank should hold the
same weights, buffers and EMA. Each rank hashes every tensor's exact bits into two int64s; the hashes (not the
tensors) are gathered, so the check costs one small collective, and the first tensor that differs is named."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
POSITION_MODULUS = 1_000_003  # position weights: a hash that also changes when values swap places


def fingerprint(tensor: Tensor) -> Tensor:
    """int64 [2]: the sum of the tensor's elements read as integers of their own width, and the same sum with
    position weights; any change of a bit changes it (sums wrap around, exactly, like a checksum)."""
    bits = tensor.detach().contiguous().view(INT_OF_SIZE[tensor.element_size()]).reshape(-1).to(torch.int64)
    weights = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % POSITION_MODULUS + 1
    return torch.stack([bits.sum(), (bits * weights).sum()])


def first_difference(tensors: dict[str, Tensor], gather: Callable[[Tensor], list[Tensor]]) -> tuple[str, int] | None:
    """(name, rank) of the first tensor, in name order, whose fingerprint on some rank differs from rank 0's; None
    when every rank agrees. `gather` maps this rank's fingerprints [N, 2] to every rank's, in rank order."""
    names = sorted(tensors)
    if not names:
        return None
    every = gather(torch.stack([fingerprint(tensors[name]) for name in names]))
    for index, name in enumerate(names):
        for rank, other in enumerate(every[1:], start=1):
            if not torch.equal(every[0][index], other[index]):
                return name, rank
    return None
