"""This host's fp32 GEMM rate on 2 threads, the figure that makes a CPU wall time travel between hosts (README:
`make demo` took 9 min 08 s on a host at ~147 GFLOP/s and 21 min 44 s on one at ~64).

    python benchmarks/gemm.py      # prints: fp32 GEMM 2048x2048, 2 threads: <rate> GFLOP/s (median of 9)
"""

from __future__ import annotations

import argparse

import torch

from common import matmul_gflops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the project's machines: 2)")
    parser.add_argument("--size", type=int, default=2048, help="square matrices of this side")
    parser.add_argument("--repeats", type=int, default=9, help="timed products; the median is printed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rate = matmul_gflops(torch.float32, "cpu", args.size, args.repeats)
    print(f"fp32 GEMM {args.size}x{args.size}, {args.threads} threads: {rate:.1f} GFLOP/s (median of {args.repeats})")


if __name__ == "__main__":
    main()
