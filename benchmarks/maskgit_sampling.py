"""MaskGIT sampling and training-step throughput on this machine.

Sampling: images/s of `--steps`-iteration parallel decoding at batch `--batch` with classifier-free guidance
(the conditional and unconditional branches in one batched forward), including the tokenizer's decoder, for
a trained run (`RUN_DIR`) or the `maskgit-shapes` preset's model with random weights (speed does not depend on
the weights; its tokenizer run must exist). Training: ms/step of the loss forward + backward + AdamW step at
the preset's batch size. Median of `--repeats` after one warm-up (which also memoises the prompts' text
embeddings).

    python benchmarks/maskgit_sampling.py [RUN_DIR] [--batch 16] [--steps 12] [--threads 2] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from genforge.app.config import load_config
from genforge.core.random import BatchRandom
from genforge.app.runs import build_task, load_run
from genforge.masked.config import MaskedSampleOptions

from common import sampling_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", help="a trained maskgit run (default: the preset, random weights)")
    parser.add_argument("--preset", default="maskgit-shapes")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="preset override")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--cfg-scale", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=10, help="training steps timed (0: skip)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.run_dir:
        run = load_run(args.run_dir)
        cfg, task = run.config, run.task
    else:
        cfg = load_config(args.preset, args.overrides)
        task = build_task(cfg)
    task.eval()
    options = MaskedSampleOptions(steps=args.steps, cfg_scale=args.cfg_scale)
    sample_s, first_s = sampling_seconds(task, args.batch, args.repeats, options=options)
    dims = f"depth {cfg.model.depth}, width {cfg.model.width}, {task.grid}x{task.grid} tokens"
    print(f"sampling ({dims}; {args.steps} steps, cfg {args.cfg_scale}, batch {args.batch}, "
          f"{args.threads} threads): {sample_s * 1000:.0f} ms/batch, {args.batch / sample_s:.1f} images/s "
          f"(first call {first_s * 1000:.0f} ms)")
    if args.train_steps:
        train_step_time(task, cfg, args.train_steps)


def train_step_time(task: torch.nn.Module, cfg, steps: int) -> None:
    """ms/step of loss + backward + AdamW at the preset's batch, on random token ids and the held-out captions."""
    b = cfg.train.batch_size
    task.train()
    opt = torch.optim.AdamW([p for p in task.parameters() if p.requires_grad], lr=1e-4)
    batch = {"tokens": torch.randint(0, task.model.codebook_size, (b, task.grid**2))}
    cond = task.sample_conditions(b, torch.Generator().manual_seed(0), task.resolve())
    batch.update({k: v for k, v in cond.items() if k in ("text", "label")})
    times = []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        batch["rng"] = BatchRandom(0, step, 0, b, 0, b)
        loss, _ = task.loss(batch, "main", step)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times[1:])
    print(f"training step (batch {b}): {step_s * 1000:.0f} ms/step, {b / step_s:.0f} images/s")


if __name__ == "__main__":
    main()
