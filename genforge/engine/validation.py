"""The validation loss: every phase's loss on fixed held-out batches with fixed noise, comparable across steps."""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch import Tensor

from genforge.core.config import DataConfig, TrainConfig
from genforge.core.random import BatchRandom
from genforge.core.task import Task
from genforge.data.base import collate
from genforge.data.loader import heldout_samples
from genforge.engine.state import TrainingError


@torch.no_grad()
def validation_loss(task: Task, data: DataConfig, train: TrainConfig, batches: int, step: int,
                    accelerator: Accelerator) -> dict[str, float]:
    """The loss of every phase on the first `batches` held-out batches of train.batch_size (the val split where the
    data has one), each with the same noise at every evaluation: `val/<phase>/loss` and their sum `val_loss`."""
    samples = list(heldout_samples(data, batches * train.batch_size))
    if not samples:
        raise TrainingError(f"eval.val_loss_batches={batches}: no readable held-out samples")
    totals = {phase: 0.0 for phase in task.phases}
    chunks = [samples[i : i + train.batch_size] for i in range(0, len(samples), train.batch_size)]
    for index, chunk in enumerate(chunks):
        batch = collate(chunk)
        batch.pop("skipped")
        batch.pop("missing", None)
        batch = {k: v.to(accelerator.device) if isinstance(v, Tensor) else v for k, v in batch.items()}
        for phase_index, phase in enumerate(task.phases):
            batch["rng"] = BatchRandom(train.seed, index, phase_index, len(chunk), 0, len(chunk), accelerator.device)
            with accelerator.autocast():
                totals[phase] += float(task.loss(batch, phase, step)[0]) / len(chunks)
    results = {f"val/{phase}/loss": value for phase, value in totals.items()}
    results["val_loss"] = sum(totals.values())
    return results
