"""Sampling at scale (docs/performance.md, "Sampling at scale"): images/s of DiT-XL/2's 250-step DDPM sampling
with classifier-free guidance, genforge (bf16, compiled blocks) beside facebookresearch/DiT's sample_ddp.py loop on
the same GPU, and what a 50 000-sample FID evaluation's sampling would take.

genforge: `task.sample` of the diffusion family (the DDPM sampler respaced to `--steps`, guidance `--cfg-scale`:
the conditional and unconditional halves in one batch of 2 x `--batch`), after one short call that compiles the
blocks; the timed call runs every step. facebookresearch/DiT: its `p_sample_loop_progressive` with
`model.forward_with_cfg` on [2 x batch, 4, 32, 32] latents as sample_ddp.py runs it (fp32 with TF32 matmuls, its
default), and under bf16 autocast; its first `--reference-steps` steps are timed after two and scaled to `--steps`
(every step of the loop is the same network call). Both on 256 tokens (32 x 32 inputs, patch 2: 256-px images'
SD-VAE latents) with random weights (the time does not depend on them); the VAE decode (about 1 % of a
250-step sample's FLOPs) and the Inception features of FID are left out of both.

    python benchmarks/gpu_sampling.py --reference .ref/DiT
    python benchmarks/gpu_sampling.py --tiny        # tiny model, a few steps: the code path on a CPU (a test runs it)

`--report FILE` appends the table to FILE row by row as each is measured (benchmarks/gpu_session.sh: $OUT/sampling.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from common import add_report_arg, autocast, device_type, load_reference, note, report_to, row, synchronize
from genforge.app.runs import build_task
from genforge.core.config import SampleOptions
from gpu import DITS, TINY_DITS

FID_SAMPLES = 50_000


def seconds_of(fn, device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def genforge_seconds(size: str, args: argparse.Namespace, device: str) -> tuple[float, float]:
    """(seconds of one `--steps`-step sampling call of `--batch` images, seconds of the compiling call)."""
    spec = (TINY_DITS if args.tiny else DITS)[size]
    torch.manual_seed(0)
    task = build_task(spec.config(), device=device).eval()
    if args.compile:
        task.compile_blocks()
    options = task.resolve(SampleOptions(sampler="ddpm", steps=args.steps, cfg_scale=args.cfg_scale))
    short = task.resolve(SampleOptions(sampler="ddpm", steps=2, cfg_scale=args.cfg_scale))
    cond = task.sample_conditions(args.batch, torch.Generator(device).manual_seed(0), options)

    def sample(opts: SampleOptions) -> None:
        with torch.no_grad(), autocast(device, "bf16"):
            task.sample(cond, torch.Generator(device).manual_seed(1), args.batch, opts)

    first = seconds_of(lambda: sample(short), device)
    return seconds_of(lambda: sample(options), device), first


def reference_seconds(size: str, args: argparse.Namespace, device: str, precision: str) -> float:
    """Seconds of facebookresearch/DiT's `--steps`-step guided sampling loop for `--batch` images, from its first
    `--reference-steps` steps timed after two."""
    models, diffusion_pkg = load_reference(args.reference.expanduser())
    spec = (TINY_DITS if args.tiny else DITS)[size]
    cfg = spec.config()
    torch.manual_seed(0)
    model = models.DiT(input_size=cfg.data.image_size, num_classes=1000, mlp_ratio=cfg.model.backbone.mlp_ratio,
                       **cfg.model.backbone.dims()).to(device).eval()
    diffusion = diffusion_pkg.create_diffusion(str(args.steps))
    size_px = cfg.data.image_size
    z = torch.randn(args.batch, 4, size_px, size_px, device=device)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    z, y = torch.cat([z, z]), torch.cat([y, torch.full_like(y, 1000)])
    timed = min(args.reference_steps, args.steps - 2)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True  # sample_ddp.py's default (--tf32)
    try:
        with torch.no_grad(), autocast(device, precision):
            loop = diffusion.p_sample_loop_progressive(model.forward_with_cfg, z.shape, z, clip_denoised=False,
                                                       model_kwargs=dict(y=y, cfg_scale=args.cfg_scale),
                                                       device=device)
            for _ in range(2):
                next(loop)
            seconds = seconds_of(lambda: [next(loop) for _ in range(timed)], device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return seconds * args.steps / timed


def print_row(size: str, implementation: str, precision: str, seconds: float, args: argparse.Namespace,
              first: float | None = None) -> None:
    rate = args.batch / seconds
    row([f"DiT-{size}" + (" (tiny)" if args.tiny else ""), implementation, args.batch, args.steps, args.cfg_scale,
         precision, f"{seconds:.2f}", f"{rate:.2f}", f"{FID_SAMPLES / rate / 60:.1f}",
         "–" if first is None else f"{first:.1f}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["XL/2"], choices=list(DITS))
    parser.add_argument("--batch", type=int, default=64, help="images per call (the network sees twice as many)")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--cfg-scale", type=float, default=1.5, help="DiT's FID setting")
    parser.add_argument("--reference", type=Path, help="a facebookresearch/DiT checkout to time beside genforge")
    parser.add_argument("--reference-steps", type=int, default=25)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    parser.add_argument("--tiny", action="store_true", help="tiny model, batch 2, 6 steps: the code path on a CPU")
    add_report_arg(parser)
    args = parser.parse_args()
    report_to(args.report)
    if args.tiny:
        args.batch, args.steps, args.reference_steps = 2, 6, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = device_type()
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    note(f"{where}; torch {torch.__version__}; DDPM, {args.steps} steps, guidance {args.cfg_scale}; random weights; "
         f"VAE decode and FID features not included\n")
    row(["model", "implementation", "batch", "steps", "guidance", "precision", "s/call", "images/s",
         f"{FID_SAMPLES} samples, min", "first call s"])
    row(["---"] * 10)
    for size in args.models:
        seconds, first = genforge_seconds(size, args, device)
        print_row(size, "genforge" + (" compiled" if args.compile else ""), "bf16", seconds, args, first)
        if args.reference is None:
            row([f"DiT-{size}", "facebookresearch/DiT", args.batch, "not run: no --reference DIR", *["–"] * 6])
            continue
        print_row(size, "facebookresearch/DiT (sample_ddp.py: fp32, TF32)", "fp32",
                  reference_seconds(size, args, device, "fp32"), args)
        print_row(size, "facebookresearch/DiT under bf16 autocast", "bf16",
                  reference_seconds(size, args, device, "bf16"), args)


if __name__ == "__main__":
    main()
