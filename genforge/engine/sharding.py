"""FSDP2 sharding of a task's trained networks (`train.sharding: fsdp`) and its sharded checkpoints.

`shard_task` applies PyTorch's `fully_shard` (FSDP2, as torchtitan does) to each block the task names
(`Task.trained_blocks`), then to the task itself with its frozen networks left out (`ignored_params`): a codec, a text
encoder or a feature network stays whole on every rank and has no optimizer state. Each rank then holds 1/N of
every trained parameter, gradient, optimizer moment and EMA weight (DTensors); a block's weights are gathered for its
forward and backward and freed after. Sampling and evaluation run on every rank inside `full_weights`.

Checkpoints are torch.distributed.checkpoint (DCP) saves in the safetensors format of DCP's
`HuggingFaceStorageWriter`: every rank writes its own pieces in parallel into `shards/`, and each file's header
says where its pieces lie in the whole tensors. So a checkpoint loads at another world size (DCP reshards), and on
one process without a launcher (`genforge sample`), and nothing is unpickled.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from genforge.core.task import Task


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """bf16: parameters gathered and computed in bf16, gradients reduced in fp32 (FSDP2's MixedPrecisionPolicy);
    otherwise fp32 throughout."""
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_task(task: Task, device: torch.device, precision: str) -> None:
    """fully_shard every block of `task.trained_blocks()`, then the task (the root: the weights outside those blocks),
    over all processes of the default group. Frozen parameters stay whole (not sharded, no optimizer state)."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = mixed_precision(precision)
    for block in task.trained_blocks():
        fully_shard(block, mesh=mesh, mp_policy=policy)
    frozen = {p for p in task.parameters() if not p.requires_grad}
    fully_shard(task, mesh=mesh, mp_policy=policy, ignored_params=frozen or None)


def whole(tensor: Tensor) -> Tensor:
    """The whole value of a (possibly sharded) tensor; a collective for a DTensor."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local(tensor: Tensor) -> Tensor:
    """This rank's piece of a (possibly sharded) tensor."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def laid_out_like(full: Tensor, target: Tensor) -> Tensor:
    """The whole tensor `full` laid out as `target` is, in its dtype and on its device: for a DTensor this rank's
    shard of it (cut locally, no communication: every rank holds the same `full`), else `full` itself."""
    full = full.to(device=local(target).device, dtype=target.dtype)
    if not isinstance(target, DTensor):
        return full
    return distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)


@contextmanager
def full_weights(task: Task) -> Iterator[None]:
    """Every rank holds the whole weights of a sharded task until the block ends (a collective): any method works,
    not only forward, so sampling and evaluation run unchanged; a task that is not sharded is left as it is."""
    units = [m for m in task.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


def gradient_sync(task: Task, enabled: bool) -> None:
    """Whether the next backward reduce-scatters the gradients (off for all but the last micro-batch of a step)."""
    if isinstance(task, FSDPModule):
        task.set_requires_gradient_sync(enabled, recurse=True)


def save_shards(folder: Path, tensors: Mapping[str, Tensor]) -> None:
    """Every rank writes its pieces of `tensors` (DTensors: this rank's shards; plain tensors: written once) into
    `folder`, in parallel (a collective with several processes)."""
    writer = HuggingFaceStorageWriter(str(folder), save_distributed=True)
    with warnings.catch_warnings():  # DCP warns that one process saves alone, which is what it is asked to do
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(dict(tensors), storage_writer=writer, no_dist=not _distributed())


def load_shards(folder: Path, tensors: dict[str, Tensor], collective: bool = True) -> None:
    """Fill `tensors` in place from a `shards/` folder, each as it is laid out here (DTensors: this rank's shards, at
    any world size; plain tensors: whole). A collective with several processes, unless not `collective` (this
    process reads alone, into plain tensors)."""
    reader = HuggingFaceStorageReader(str(folder))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(tensors, storage_reader=reader, no_dist=not (collective and _distributed()))


def _distributed() -> bool:
    """Whether a process group of several processes is running (else DCP reads and writes on this process alone)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
