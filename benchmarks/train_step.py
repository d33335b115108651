"""The real Trainer's step, eager and compiled, fp32 and bf16, for DiT-S/2 and the default U-Net, beside
facebookresearch/DiT's step.

What is timed is one iteration of `Trainer._loop` on a trainer built from the preset (benchmarks/common.py): the
next global batch from the trainer's own data loader, forward + backward, gradient clipping, the non-finite guard,
the fused AdamW step, the step's one host read, `end_step`, the EMA update. Printed: median ms/step and images/s
after `--warmup` steps, GFLOP/s (FLOPs of a training image counted by torch's FlopCounterMode), and the share of the
step spent waiting for the loader.

Models (`--models`):
  dit-s2  DiT-S/2 with the paper's diffusion (ε-prediction, linear schedule, learned sigma, hybrid loss) and 1000
          classes on the dit-shapes data at 32 px: 3x32x32 pixels, which with patch 2 are the same 256 tokens as
          the 4x32x32 SD-VAE latents of 256-px images (the input and output layers see 3 channels instead of 4,
          under 0.1 % of the FLOPs). genforge's latent path needs a trained tokenizer to write a cache; the
          transformer's work is the same.
  unet    the default preset's model (unet-shapes: ADM U-Net, rectified flow, 32-px shapes), as `make demo`
          trains it.

`--compile` adds the compiled step: the same trainer with `--set train.compile=true`; its compile time is the wall
time of its warm-up steps minus as many eager steps. `--host-sync` adds the eager step with one extra host read per
phase (`bool(finite)` before the optimizer step, as the guard did before its flags stayed on the device) and prints
the ratio. `--reference DIR` times facebookresearch/DiT's DiT-S/2 step from a checkout at DIR (`git clone
https://github.com/facebookresearch/DiT`) in the same run, with the ratios genforge / reference (images/s). bf16
runs by default only where the CPU or GPU has native bf16 (its matmul rate is printed either way).

    python benchmarks/train_step.py [--models dit-s2 unet] [--precision fp32 bf16] [--batch 8 32] [--steps 10]
                                    [--warmup 3] [--compile] [--host-sync] [--reference ~/src/DiT] [--threads 2]
    python benchmarks/train_step.py --tiny --steps 2 --warmup 1   # tiny models: checks that the script runs
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common import (ModelSpec, StepTimes, bench_trainer, bf16_native, compile_overrides, device_type, dit,
                    host_sync_per_phase, matmul_gflops, time_reference, time_trainer, train_flops_per_image, unet)

MODELS = {"dit-s2": dit("S/2"), "unet": unet()}
TINY = {"dit-s2": dit("S/2", image_size=16, depth=2, hidden_size=64, num_heads=2), "unet": unet(dim=8)}


def report(name: str, times: StepTimes, flops: float, extra: str = "") -> None:
    """One row: ms/step, images/s, GFLOP/s, loader stall share, and `extra`."""
    stall = "" if times.stall_share is None else f", loader {times.stall_share:.1%}"
    print(f"  {name:<26} {times.median_s * 1000:9.1f} ms/step {times.images_per_s:8.1f} images/s "
          f"({times.images_per_s * flops / 1e9:.1f} GFLOP/s{stall}){extra}", flush=True)


def bench(spec: ModelSpec, precision: str, batch: int, args: argparse.Namespace, device: str) -> None:
    """The rows of one model at one precision and batch."""
    flops = train_flops_per_image(spec, device)
    workers = [] if args.workers is None else [f"data.num_workers={args.workers}"]
    print(f"{spec.name}, {precision}, batch {batch} ({flops / 1e9:.3g} GFLOP per training image)")
    with bench_trainer(spec, batch, precision, workers) as trainer:
        eager = time_trainer(trainer, args.steps, args.warmup)
    report("genforge eager", eager, flops)
    compiled = None
    if args.compile:
        with bench_trainer(spec, batch, precision, [*workers, *compile_overrides(True)]) as trainer:
            compiled = time_trainer(trainer, args.steps, args.warmup)
        report("genforge compiled", compiled, flops, f"; {compiled.images_per_s / eager.images_per_s:.2f}x eager, "
               f"compile {compiled.compile_s(eager.median_s):.1f} s")
    if args.host_sync:
        with bench_trainer(spec, batch, precision, workers) as trainer:
            host_sync_per_phase(trainer)
            synced = time_trainer(trainer, args.steps, args.warmup)
        report("genforge eager + host sync", synced, flops,
               f"; the step as is: {eager.images_per_s / synced.images_per_s:.3f}x as fast")
    if args.reference and spec.reference:
        ref = time_reference(args.reference.expanduser(), spec, batch, precision, args.steps, args.warmup, device)
        ratios = f"; genforge eager / reference {eager.images_per_s / ref.images_per_s:.2f}x"
        if compiled is not None:
            ratios += f", genforge compiled / reference {compiled.images_per_s / ref.images_per_s:.2f}x"
        report("facebookresearch/DiT", ref, flops, ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--precision", nargs="+", choices=["fp32", "bf16"],
                        help="default: fp32, and bf16 where the device has native bf16")
    parser.add_argument("--batch", type=int, nargs="+", default=[8])
    parser.add_argument("--steps", type=int, default=10, help="timed steps (the median is printed)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (a compiled step compiles here)")
    parser.add_argument("--compile", action="store_true", help="also the compiled step (train.compile=true)")
    parser.add_argument("--host-sync", action="store_true", help="also the step with a host read per phase")
    parser.add_argument("--reference", type=Path, help="a facebookresearch/DiT checkout to time beside genforge")
    parser.add_argument("--workers", type=int, help="data.num_workers (default: the preset's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="tiny models (checks that the script runs)")
    args = parser.parse_args()
    if args.compile and args.warmup < 1:
        parser.error("--compile needs --warmup 1 or more (the compiling steps)")
    compile_overrides(args.compile)  # before any work: is there a train.compile to time?
    torch.set_num_threads(args.threads)
    device = device_type()
    native = bf16_native(device)
    precisions = args.precision or (["fp32", "bf16"] if native else ["fp32"])
    where = torch.cuda.get_device_name() if device == "cuda" else f"cpu, {args.threads} threads"
    print(f"genforge Trainer step ({where}; torch {torch.__version__}), median of {args.steps} steps after "
          f"{args.warmup}")
    print(f"  fp32 matmul 1024x1024: {matmul_gflops(torch.float32, device):.1f} GFLOP/s")
    bf16_size = 1024 if native else 512  # emulated bf16 is ~100x slower: a smaller probe
    print(f"  bf16 matmul {bf16_size}x{bf16_size}: {matmul_gflops(torch.bfloat16, device, bf16_size):.1f} GFLOP/s "
          f"({'native' if native else 'not native here: bf16 steps run only when asked with --precision bf16'})")
    models = TINY if args.tiny else MODELS
    for name in args.models:
        for precision in precisions:
            for batch in args.batch:
                bench(models[name], precision, batch, args, device)


if __name__ == "__main__":
    main()
