"""Diffusion samplers side by side on one trained run: for each `SAMPLER:STEPS`, the judge accuracy of `--n` samples
over `--seeds` sampling seeds (the demo's metric) and samples per second (wall time of the sampling, judge
excluded, on this machine's `--threads` threads).

    python benchmarks/samplers.py runs/demo ddim:50 euler:50 heun:25 dpmpp_2m:20 --n 256 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from genforge.app.runs import load_run
from genforge.core.config import SampleOptions
from genforge.eval.judge import judge_predictions, load_or_train_judge, prediction_report
from genforge.sampling import generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("samplers", nargs="+", help="SAMPLER:STEPS, e.g. euler:50")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cfg-scale", type=float, default=None, help="default: the run's model.diffusion.cfg_scale")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = load_run(args.run_dir)
    judge = load_or_train_judge()
    cfg_scale = args.cfg_scale or run.config.model.diffusion.cfg_scale
    print(f"{run.config.model.diffusion.objective} run {args.run_dir} (step {run.step}), n={args.n} per seed, "
          f"cfg_scale {cfg_scale}")
    print(f"{'sampler':>16} {'steps':>5} {'judge (per seed)':>28} {'mean':>6} {'samples/s':>10}")
    for spec in args.samplers:
        name, _, steps = spec.partition(":")
        accuracies, seconds = [], 0.0
        for seed in args.seeds:
            start = time.perf_counter()
            options = SampleOptions(sampler=name, steps=int(steps), cfg_scale=args.cfg_scale)
            images, cond = generate(run.task, args.n, seed, "cpu", options=options)
            seconds += time.perf_counter() - start
            accuracies.append(prediction_report(judge_predictions(judge, images), cond["label"])["judge_accuracy"])
        per_seed = " / ".join(f"{a:.3f}" for a in accuracies)
        print(f"{name:>16} {steps:>5} {per_seed:>28} {statistics.mean(accuracies):6.3f} "
              f"{args.n * len(args.seeds) / seconds:10.1f}")


if __name__ == "__main__":
    main()
