"""This host's fp32 GEMM rate on 2 threads, the figure that makes a CPU wall time travel between hosts (README:
`make demo` took 9 min 08 s on a host at ~147 GFLOP/s and 21 min 44 s on one at ~64).

    python benchmarks/gemm.py      # prints: fp32 GEMM 2048x2048, 2 threads: <rate> GFLOP/s (median of 9)
                                   #         bf16 GEMM ...: <rate> GFLOP/s (native|emulated) (median of 9)

The bf16 line says whether `train.precision: auto` (the demo's) trains in bf16 on this host: where bf16 is native
(AVX-512-BF16 / AMX) the demo's step takes about half the fp32 one; where it is emulated, auto keeps float32.
"""

from __future__ import annotations

import argparse

import torch

from common import bf16_native, matmul_gflops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the project's machines: 2)")
    parser.add_argument("--size", type=int, default=2048, help="square matrices of this side")
    parser.add_argument("--repeats", type=int, default=9, help="timed products; the median is printed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rate = matmul_gflops(torch.float32, "cpu", args.size, args.repeats)
    print(f"fp32 GEMM {args.size}x{args.size}, {args.threads} threads: {rate:.1f} GFLOP/s (median of {args.repeats})")
    native = bf16_native("cpu")
    size = args.size if native else min(args.size, 512)  # emulated bf16 is far slower: a smaller probe
    rate = matmul_gflops(torch.bfloat16, "cpu", size, args.repeats)
    print(f"bf16 GEMM {size}x{size}, {args.threads} threads: {rate:.1f} GFLOP/s "
          f"({'native' if native else 'emulated'}) (median of {args.repeats})")


if __name__ == "__main__":
    main()
