"""The GPU table of docs/performance.md, printed as markdown: DiT-XL/2 and DiT-B/2 training, genforge beside
facebookresearch/DiT, and MaskGIT sampling.

Training rows: genforge's real Trainer step (benchmarks/common.py: loader, forward + backward, clipping, the
non-finite guard, fused AdamW, EMA) in bf16, eager and with `--compile` compiled (train.compile=true), for each
DiT on 256 tokens (patch 2 over 32x32 inputs, as 256-px images' SD-VAE latents: genforge reads 3x32x32 shapes
through its loader, the reference random 4x32x32 latents), 1000 classes, the paper's diffusion. Columns: median
ms/step and images/s after the warm-up; MFU = images/s x FLOPs per training image (counted by FlopCounterMode on
genforge's model; the reference's rows use the same count) / the peak dense bf16 FLOP/s of the GPU
(`--peak-tflops`, default from a table by GPU name; on a CPU the measured matmul rate in the step's precision);
peak memory (torch.cuda.max_memory_allocated; n/a on a CPU); loader stall
(share of the step spent waiting for the next batch); compile time (warm-up steps minus as many eager steps).
facebookresearch/DiT's step (`--reference DIR`, a checkout) runs in the same process at the same batch under bf16
autocast.

MaskGIT rows: seconds per image of `sample` at batch 1 and 32 for a transformer of the MaskGIT paper's size
(24 layers, width 768, 8 heads, 16x16 ids of 1000 codes, 8 decoding steps, class-conditional, guidance 3 as the
preset) over the colour stand-in tokenizer (its decoding costs next to nothing: a trained VQGAN's decoder would
add its own time).

    python benchmarks/gpu.py [--batch 64] [--compile] [--reference ~/src/DiT] [--steps 20] [--warmup 5]
    python benchmarks/gpu.py --tiny        # tiny models, a few steps: the code path on a CPU (a test runs it)

`--report FILE` appends the table to FILE row by row as it is measured (benchmarks/gpu_session.sh: $OUT/table.md).
"""

from __future__ import annotations

import argparse
import resource
from pathlib import Path

import torch

from common import (ModelSpec, StepTimes, add_report_arg, bench_trainer, bf16_native, compile_overrides, device_type,
                    dit, matmul_gflops, note, peak_memory_gib, report_to, reset_peak_memory, row, sampling_seconds,
                    time_reference, time_trainer, train_flops_per_image)
from genforge.app.config import load_config
from genforge.app.runs import build_task

# dense (no sparsity) bf16 tensor-core peak per GPU, TFLOP/s, from the vendor's data sheets; first match of all the
# name's parts wins
PEAK_BF16_TFLOPS = [(("H100", "PCIe"), 756.0), (("H100",), 989.0), (("H200",), 989.0), (("A100",), 312.0)]
DITS = {"XL/2": dit("XL/2"), "B/2": dit("B/2")}
TINY_DITS = {"XL/2": dit("XL/2", image_size=16, depth=2, hidden_size=64, num_heads=2),
             "B/2": dit("B/2", image_size=16, depth=1, hidden_size=32, num_heads=2)}
# maskgit-shapes' model made standalone (colour stand-in ids, class labels of the shapes data) at the MaskGIT
# paper's size
MASKGIT_STANDALONE = ["model.tokens.codec=colour", "model.tokens.tokenizer=null", "data.source=shapes",
                      "data.path=null", "model.conditioning=class"]
MASKGIT = ["model.tokens.factor=16", "model.tokens.levels=10", "data.image_size=256", "model.depth=24",
           "model.width=768", "model.num_heads=8", "model.sample_steps=8"]
TINY_MASKGIT = ["model.tokens.factor=4", "model.tokens.levels=4", "data.image_size=32", "model.depth=2",
                "model.width=64", "model.num_heads=2", "model.sample_steps=4"]
COLUMNS = ["model", "implementation", "batch", "precision", "ms/step", "images/s", "MFU", "peak memory",
           "loader stall", "compile s"]


def peak_tflops(device: str, precision: str, given: float | None) -> tuple[float | None, str]:
    """The peak FLOP/s MFU is measured against, in TFLOP/s, and where it comes from."""
    if given is not None:
        return given, "--peak-tflops"
    if device == "cpu":
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        size = 1024 if precision == "fp32" or bf16_native(device) else 512  # emulated bf16: ~100x slower
        return matmul_gflops(dtype, device, size) / 1e3, f"measured {precision} matmul rate of this CPU"
    name = torch.cuda.get_device_name()
    for parts, tflops in PEAK_BF16_TFLOPS:
        if all(part in name for part in parts):
            return tflops, f"dense bf16 peak of the {' '.join(parts)}"
    return None, f"unknown GPU {name!r}: pass --peak-tflops for MFU"


def train_row(model: str, impl: str, times: StepTimes, precision: str, flops: float, peak: float | None,
              memory: float | None, compile_s: float | None = None) -> None:
    """A training row of the table."""
    mfu = "n/a" if peak is None else f"{times.images_per_s * flops / (peak * 1e12):.1%}"
    row([model, impl, times.batch, precision, f"{times.median_s * 1000:.1f}", f"{times.images_per_s:.1f}", mfu,
         "n/a (CPU)" if memory is None else f"{memory:.1f} GiB",
         "–" if times.stall_share is None else f"{times.stall_share:.1%}",
         "–" if compile_s is None else f"{compile_s:.1f}"])


def bench_dit(size: str, spec: ModelSpec, args: argparse.Namespace, device: str, peak: float | None) -> None:
    """The rows of one DiT: genforge eager, compiled (--compile), facebookresearch/DiT (--reference)."""
    model = f"DiT-{size}" + (" (tiny)" if args.tiny else "")
    flops = train_flops_per_image(spec, device)
    workers = [f"data.num_workers={args.workers}"]
    reset_peak_memory(device)
    with bench_trainer(spec, args.batch, args.precision, workers) as trainer:
        eager = time_trainer(trainer, args.steps, args.warmup)
    train_row(model, "genforge", eager, args.precision, flops, peak, peak_memory_gib(device))
    if args.compile:
        reset_peak_memory(device)
        with bench_trainer(spec, args.batch, args.precision, [*workers, *compile_overrides(True)]) as trainer:
            compiled = time_trainer(trainer, args.steps, args.warmup)
        train_row(model, "genforge compiled", compiled, args.precision, flops, peak, peak_memory_gib(device),
                  compiled.compile_s(eager.median_s))
    if args.reference is None:
        row([model, "facebookresearch/DiT", args.batch, args.precision, "not run: no --reference DIR", *["–"] * 5])
        return
    reset_peak_memory(device)
    ref = time_reference(args.reference.expanduser(), spec, args.batch, args.precision, args.steps, args.warmup,
                         device)
    train_row(model, "facebookresearch/DiT", ref, args.precision, flops, peak, peak_memory_gib(device))


def bench_maskgit(args: argparse.Namespace, device: str) -> None:
    """MaskGIT sampling rows: seconds per image at each of `--maskgit-batch`."""
    cfg = load_config("maskgit-shapes", [*MASKGIT_STANDALONE, *(TINY_MASKGIT if args.tiny else MASKGIT)])
    torch.manual_seed(0)
    task = build_task(cfg, device=device).eval()
    model = (f"MaskGIT {cfg.model.depth}x{cfg.model.width}, {task.grid}x{task.grid} ids"
             + (" (tiny)" if args.tiny else ""))
    note()
    row(["MaskGIT sampling", "batch", "steps", "precision", "s/image", "images/s", "first call s"])
    row(["---"] * 7)
    for batch in args.maskgit_batch:
        seconds, first = sampling_seconds(task, batch, args.maskgit_repeats, args.precision)
        row([model, batch, cfg.model.sample_steps, args.precision, f"{seconds / batch:.4f}",
             f"{batch / seconds:.1f}", f"{first:.2f}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(DITS), choices=list(DITS))
    parser.add_argument("--batch", type=int, default=64, help="global batch of the training rows")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="also genforge compiled (train.compile=true)")
    parser.add_argument("--reference", type=Path, help="a facebookresearch/DiT checkout to time beside genforge")
    parser.add_argument("--workers", type=int, default=8, help="data.num_workers of genforge's loader")
    parser.add_argument("--peak-tflops", type=float, help="peak dense FLOP/s of the device, for MFU")
    parser.add_argument("--maskgit-batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--maskgit-repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny models, batch 4, 2 steps after 1, no loader workers: the code path on a CPU")
    add_report_arg(parser)
    args = parser.parse_args()
    report_to(args.report)
    if args.tiny:
        args.batch, args.steps, args.warmup, args.workers, args.maskgit_repeats = 4, 2, 1, 0, 1
    if args.compile and args.warmup < 1:
        parser.error("--compile needs --warmup 1 or more (the compiling steps)")
    compile_overrides(args.compile)  # before any work: is there a train.compile to time?
    if args.threads:
        torch.set_num_threads(args.threads)
    device = device_type()
    peak, peak_source = peak_tflops(device, args.precision, args.peak_tflops)
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    note(f"{where}; torch {torch.__version__}; median of {args.steps} steps after {args.warmup}; "
         f"data.num_workers={args.workers}")
    note(f"MFU against {'n/a' if peak is None else f'{peak:.4g} TFLOP/s'} ({peak_source})")
    note()
    row(COLUMNS)
    row(["---"] * len(COLUMNS))
    for size in args.models:
        bench_dit(size, (TINY_DITS if args.tiny else DITS)[size], args, device, peak)
    bench_maskgit(args, device)
    if device == "cpu":
        note(f"\nprocess peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
