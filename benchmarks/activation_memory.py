"""Activation memory of one training step with and without model.grad_checkpointing.

    python benchmarks/activation_memory.py                                   # dit-shapes (DiT-S/2), unet-shapes
    python benchmarks/activation_memory.py --presets dit-shapes --batch 32
    python benchmarks/activation_memory.py --presets dit-shapes --set model.backbone.size=S/2   # DiT-S/2 itself

The bytes a step keeps for backward are counted exactly: every tensor autograd saves passes through
`torch.autograd.graph.saved_tensors_hooks`, which adds up its size (what a CUDA allocator's peak would add on top of
the weights, gradients and optimizer state). With checkpointing each block keeps only its inputs and runs again in
backward, so the step also takes longer; both are printed, with the largest gradient difference to the plain step.
"""

from __future__ import annotations

import argparse
import time

import torch

from genforge.app.config import load_config
from genforge.app.runs import build_task
from genforge.core.random import BatchRandom
from genforge.data.base import collate
from genforge.data.loader import build_dataset, data_info


def step(preset: str, batch_size: int, checkpointing: bool,
         extra: list[str]) -> tuple[int, float, dict[str, torch.Tensor]]:
    """(bytes saved for backward, seconds, gradients) of one forward + backward of the first phase."""
    torch.manual_seed(0)
    cfg = load_config(preset, [*extra, f"train.batch_size={batch_size}",
                               f"model.grad_checkpointing={str(checkpointing).lower()}"])
    dataset = build_dataset(cfg.data)
    task = build_task(cfg, data_info(dataset, cfg.data))
    batch = collate([dataset[i] for i in range(batch_size)])
    batch.pop("skipped")
    batch["rng"] = BatchRandom(0, 0, 0, batch_size, 0, batch_size)
    saved = [0]

    def count(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
        loss, _ = task.loss(batch, task.phases[0], 0)
    loss.backward()
    seconds = time.perf_counter() - start
    return saved[0], seconds, {n: p.grad for n, p in task.named_parameters() if p.grad is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="dit-shapes,unet-shapes")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--set", action="append", default=[], help="a config override for every preset")
    args = parser.parse_args()
    print(f"{'preset':14} {'batch':>5} {'saved MB plain':>15} {'checkpointed':>13} {'ratio':>6} "
          f"{'step s plain':>13} {'checkpointed':>13} {'max |grad diff|':>16}")
    for preset in args.presets.split(","):
        step(preset, args.batch, False, args.set)  # warm-up (first-call overheads)
        plain_bytes, plain_s, plain_grads = step(preset, args.batch, False, args.set)
        bytes_, seconds, grads = step(preset, args.batch, True, args.set)
        diff = max(float((grads[k] - plain_grads[k]).abs().max()) for k in grads)
        print(f"{preset:14} {args.batch:5d} {plain_bytes / 2**20:15.1f} {bytes_ / 2**20:13.1f} "
              f"{bytes_ / plain_bytes:6.2f} {plain_s:13.2f} {seconds:13.2f} {diff:16.2e}", flush=True)


if __name__ == "__main__":
    main()
