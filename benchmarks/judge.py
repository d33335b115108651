"""Train the shapes judge with its defaults; print wall time and held-out accuracy (target >= 0.98 in < 120 s).

    python benchmarks/judge.py [--threads 2]
"""

import argparse
import time

import torch

from genforge.eval.judge import HELDOUT_IMAGES, train_judge

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()
torch.set_num_threads(args.threads)
start = time.perf_counter()
judge, accuracy = train_judge()
elapsed = time.perf_counter() - start
print(f"judge: held-out accuracy {accuracy:.4f} on {HELDOUT_IMAGES} images, trained in {elapsed:.1f} s "
      f"({args.threads} threads)")
