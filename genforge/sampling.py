"""Sampling a task: `n` samples in batches, reproducible from a seed whatever the number of processes, with the
family's resolved options. `genforge sample`, the Python API's `Run.sample` and evaluation (genforge.eval.run) all
draw their samples here, so a sample grid and the samples a metric scores are the same for the same seed and
options.

Several processes (torchrun / accelerate launch): chunk c of the samples is drawn on rank c % world with a
generator seeded by (seed, c), and the rows are gathered in sample order (`core.collectives`), so every rank gets
what one process draws. `report(done, total)`, when given, is called after each batch with the samples this
process has finished and its share of them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from genforge.core.collectives import gather_rows, rank_and_world
from genforge.core.config import SampleOptions
from genforge.core.precision import autocast
from genforge.core.random import mix_seed
from genforge.core.task import Batch, Task

__all__ = ["Report", "chunk_share", "generate", "sample_chunks"]


Report = Callable[[int, int], None]  # (samples finished by this process, its share of them)


@torch.no_grad()
def sample_chunks(task: Task, cond_all: Batch, n: int, seed: int, device: torch.device | str, batch_size: int = 64,
                  rank: int = 0, world: int = 1, precision: str = "no", options: SampleOptions | None = None,
                  progress: bool = False) -> Iterator[tuple[int, Tensor]]:
    """This rank's chunks of the `n` samples with the resolved `options` (None: the task's defaults): (index of the
    first sample, float32 images on the CPU in [-1, 1]). Chunk c (samples c·batch_size onwards) is drawn with a
    generator seeded by (seed, c) on rank c % world, so the samples are the same for any number of processes."""
    options = options or task.resolve()
    for chunk, start in enumerate(range(0, n, batch_size)):
        if chunk % world != rank:
            continue
        gen = torch.Generator(device=device).manual_seed(mix_seed(seed, chunk))
        cond = {k: v[start : start + batch_size] for k, v in cond_all.items()}
        with autocast(precision, device):
            images = task.sample(cond, gen, min(batch_size, n - start), options, progress)
        yield start, images.float().cpu()


def chunk_share(n: int, batch_size: int, rank: int, world: int) -> int:
    """How many of the `n` samples `sample_chunks` draws on `rank` of `world`."""
    return sum(min(batch_size, n - start) for chunk, start in enumerate(range(0, n, batch_size))
               if chunk % world == rank)


def generate(task: Task, n: int, seed: int, device: torch.device | str, batch_size: int = 64, precision: str = "no",
             report: Report | None = None, options: SampleOptions | None = None, progress: bool = False
             ) -> tuple[Tensor, dict[str, Any]]:
    """`n` samples (CPU, float32, [-1, 1]) in batches with `options` (resolved here by the task), reproducible from
    `seed`, and the conditions used. In a process group every rank must call it: each draws its chunks
    (`sample_chunks`), and every rank gets all `n` samples in order, the same as one process draws."""
    rank, world = rank_and_world()
    options = task.resolve(options)
    cond_all = task.sample_conditions(n, torch.Generator(device=device).manual_seed(seed), options)
    share, index, chunks = chunk_share(n, batch_size, rank, world), [], []
    for start, images in sample_chunks(task, cond_all, n, seed, device, batch_size, rank, world, precision, options,
                                       progress):
        index.append(torch.arange(start, start + len(images)))
        chunks.append(images)
        if report is not None:
            report(sum(len(c) for c in chunks), share)
    order = torch.cat(index) if index else torch.zeros(0, dtype=torch.long)
    return gather_rows(torch.cat(chunks) if chunks else torch.zeros(0), order), cond_all
