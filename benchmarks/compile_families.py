"""Does `train.compile` work for every family? For each family's debug preset (and the variants its contract tests
train): build the task, compile its trained blocks (Task.compile_blocks, what the trainer does), then one loss +
backward per phase and one sample, eager and compiled from the same weights. Prints per family the compile time
(first compiled step), the loss difference against eager, the largest gradient difference, the step time eager
and compiled, and whether sampling ran. A family that fails here gets `no_compile` in its config (exit 2 at config
time) with the reason printed below.

    python benchmarks/compile_families.py [--threads 2] [--only dit-debug maskgit-debug] [--device cuda]

On a GPU (`--device cuda`, the default when there is one) inductor generates Triton kernels instead of C++.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import traceback

import torch

from common import device_type
from genforge.app.config import load_config
from genforge.app.runs import build_task
from genforge.core.random import BatchRandom
from genforge.core.task import Task
from genforge.data.base import collate
from genforge.data.loader import StepBatchSampler, build_dataset, data_info

# (preset, overrides): one per family, plus the DiT task's U-Net backbone
VARIANTS = [
    ("dit-debug", []),
    ("dit-debug", ["model.backbone={kind: unet, dim: 16, dim_mults: [1, 2], num_res_blocks: 1, "
                   "attention_levels: [1], head_dim: 16}"]),
    ("klvae-debug", []),
    ("vqgan-debug", []),
    ("dvae-debug", []),
    ("maskgit-debug", []),
    ("clip-debug", []),
    ("dalle2-decoder-debug", []),
    ("cvivit-debug", []),
    ("phenaki-debug", []),
]


def losses_and_grads(task: Task, batch: dict, n: int) -> tuple[list[float], dict[str, torch.Tensor], float]:
    """Loss + backward of every phase (fixed noise): the losses, the gradients, and the wall time."""
    t0 = time.perf_counter()
    losses, grads = [], {}
    for i, phase in enumerate(task.phases):
        task.zero_grad(set_to_none=True)
        batch["rng"] = BatchRandom(0, 0, i, n, 0, n, device=next(task.parameters()).device)
        loss, _ = task.loss(batch, phase, 0)
        loss.backward()
        losses.append(loss.item())
        grads.update({f"{phase}/{k}": p.grad.clone() for k, p in task.named_parameters() if p.grad is not None})
    return losses, grads, time.perf_counter() - t0


def check(preset: str, overrides: list[str], repeats: int, device: str) -> str:
    torch.manual_seed(0)
    cfg = load_config(preset, overrides)
    dataset = build_dataset(cfg.data)
    eager = build_task(cfg, data_info(dataset, cfg.data), device=device)
    batch = collate([dataset[i] for i in next(iter(StepBatchSampler(len(dataset), cfg.train.batch_size)))])
    batch.pop("skipped")
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    n = cfg.train.batch_size
    compiled = copy.deepcopy(eager)
    compiled.compile_blocks()
    eager_losses, eager_grads, _ = losses_and_grads(eager, batch, n)
    eager_time = statistics.median(losses_and_grads(eager, batch, n)[2] for _ in range(repeats))
    losses, grads, first = losses_and_grads(compiled, batch, n)
    step = statistics.median(losses_and_grads(compiled, batch, n)[2] for _ in range(repeats))
    loss_diff = max(abs(a - b) for a, b in zip(losses, eager_losses))
    grad_diff = max((grads[k] - eager_grads[k]).abs().max().item() for k in grads)
    sampled = "-"
    if compiled.traits.makes_samples:
        compiled.eval()
        gen = torch.Generator(device).manual_seed(0)
        with torch.no_grad():
            options = compiled.resolve()
            out = compiled.sample(compiled.sample_conditions(2, gen, options), gen, 2, options)
        sampled = "ok" if torch.isfinite(out).all() else "non-finite"
    return (f"| {preset} {' '.join(overrides)[:40]} | {len(compiled.trained_blocks())} | {first:.0f} s | "
            f"{loss_diff:.1e} | {grad_diff:.1e} | {eager_time * 1000:.0f} | {step * 1000:.0f} | {sampled} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="presets to check (default: all)")
    parser.add_argument("--device", default=device_type(), help="cpu | cuda (default: cuda when there is a GPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| preset | blocks | first compiled step | loss diff | grad diff | eager ms | compiled ms | sample |")
    print("|---|---|---|---|---|---|---|---|")
    for preset, overrides in VARIANTS:
        if args.only and preset not in args.only:
            continue
        try:
            print(check(preset, overrides, args.repeats, args.device), flush=True)
        except Exception as err:  # noqa: BLE001 - the point is to report which family fails and why
            print(f"| {preset} {' '.join(overrides)[:40]} | FAILED: {type(err).__name__}: {str(err)[:200]} |",
                  flush=True)
            traceback.print_exc()


if __name__ == "__main__":
    main()
