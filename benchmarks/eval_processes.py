"""FID of `genforge eval RUN --metrics fid -n N` on 1 process and on 2 (torchrun), and the wall time of each.

    python benchmarks/eval_processes.py runs/dit-shapes                   # n 256, the Inception-v3 FID features
    python benchmarks/eval_processes.py runs/dit-shapes --n 32 --steps 5  # a quicker check
    python benchmarks/eval_processes.py --train dit-debug --n 32          # trains a tiny run first (a temp folder)

The two commands it times (from launch to exit: start-up, loading the run and the feature network included):

    genforge eval RUN --metrics fid -n N --seed S [--steps T]
    torchrun --standalone --nproc_per_node 2 -m genforge eval RUN --metrics fid -n N --seed S [--steps T]

Each gets an empty GENFORGE_CACHE, so both compute the reference statistics of the held-out images (split over the
ranks too) instead of one reading what the other cached. torchrun gives each process OMP_NUM_THREADS=1 unless it is
set; --threads sets it for both commands (without it, 1 process uses torch's default threads, all cores). Prints
both FIDs, their difference and the wall-time ratio. Like any `genforge eval`, each writes RUN/eval/<step>.json (the
second overwrites the first; both are printed).

Samples are drawn in chunks of 64, each from its own seed, chunk c on rank c % 2: with n <= 64 rank 1 draws nothing
(only the reference images are split), so the ratio says something from n = 128 on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_eval(run: Path, processes: int, args: argparse.Namespace, cache: Path) -> tuple[dict, float]:
    """The results JSON of one `genforge eval` on `processes` processes, and its wall time in seconds."""
    launch = [sys.executable] if processes == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                      "--nproc_per_node", str(processes)]
    command = [*launch, "-m", "genforge", "eval", str(run), "--metrics", "fid", "-n", str(args.n),
               "--seed", str(args.seed), *(["--steps", str(args.steps)] if args.steps else [])]
    env = dict(os.environ, GENFORGE_CACHE=str(cache), HF_HUB_OFFLINE="1")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    written = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("wrote ")]
    results = json.loads(Path(written[-1]).read_text())
    launcher = "" if processes == 1 else f"torchrun --standalone --nproc_per_node {processes} -m "
    print(f"$ {launcher}genforge {' '.join(command[command.index('genforge') + 1:])}", flush=True)
    summary = [line for line in done.stderr.splitlines() if line.startswith("genforge: evaluated ")]
    print(f"  {summary[-1] if summary else ''}", flush=True)
    return results, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", type=Path, help="a generator's run directory")
    parser.add_argument("--train", metavar="PRESET", help="train PRESET into a temp folder first and evaluate that")
    parser.add_argument("--n", type=int, default=256, help="generated samples (and reference images)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, help="sampling steps (default: the run's)")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of every process")
    args = parser.parse_args()
    if (args.run is None) == (args.train is None):
        parser.error("give a RUN directory or --train PRESET")
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run
        if args.train:
            run = Path(tmp) / "run"
            subprocess.run([sys.executable, "-m", "genforge", "train", args.train, "--run-dir", str(run)], check=True,
                           capture_output=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        one, one_s = timed_eval(run, 1, args, Path(tmp) / "cache-1")
        two, two_s = timed_eval(run, 2, args, Path(tmp) / "cache-2")
    difference = two["fid"] - one["fid"]
    print(f"\ngenforge eval {args.run or args.train} --metrics fid -n {args.n} --seed {args.seed}"
          f"{f' --steps {args.steps}' if args.steps else ''} ({one['features']}; reference: {one['ref_n']} images)")
    print(f"{'processes':>9}  {'fid':>18}  {'wall s':>8}")
    print(f"{1:>9}  {one['fid']:>18.10f}  {one_s:>8.1f}")
    print(f"{2:>9}  {two['fid']:>18.10f}  {two_s:>8.1f}")
    print(f"FID difference (2 - 1 processes): {difference:.3g} (relative {abs(difference) / abs(one['fid']):.3g})")
    print(f"wall-time ratio (1 process / 2 processes): {one_s / two_s:.2f}")


if __name__ == "__main__":
    main()
