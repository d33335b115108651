"""DiT-S/2 training-step throughput on 4x32x32 latents (what 256-px images become through the SD VAE).

A step = IDDPM loss (hybrid, learned sigma) forward + backward + fused AdamW step + EMA update, as the
trainer does it. Prints ms/step and images/s, median of --steps steps after --warmup, for each batch size
and precision. Reference on the 2-core CPU machine: facebookresearch/DiT's implementation of the same model
runs at about 6 images/s (fp32) and 12 images/s (bf16 autocast) at batch 32.

    python benchmarks/train_step.py [--threads 2] [--batch 8 32] [--precision fp32 bf16] [--compile]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from genforge.config import load_config
from genforge.data.loader import DataInfo
from genforge.engine.ema import EMA
from genforge.engine.random import BatchRandom


def bench(batch: int, precision: str, steps: int, warmup: int, device: str, compile_model: bool) -> float:
    cfg = load_config("dit-shapes", ["model.size=S/2", "model.depth=null", "model.hidden_size=null",
                                     "model.num_heads=null", "model.patch_size=null", "model.num_classes=1000",
                                     "data.image_size=32"])
    torch.manual_seed(0)
    task = cfg.model.build_task(cfg, DataInfo(num_classes=1000, channels=4, image_size=32)).to(device)
    opt = torch.optim.AdamW(task.parameters(), lr=1e-4, weight_decay=0, fused=True)
    ema = EMA(task.model, 0.9999)
    if compile_model:
        task.model = torch.compile(task.model)
    latent = torch.randn(batch, 4, 32, 32, device=device)
    label = torch.randint(0, 1000, (batch,), device=device)
    dtype = {"fp32": None, "bf16": torch.bfloat16}[precision]
    times = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        b = {"latent": latent, "label": label, "rng": BatchRandom(0, step, 0, batch, 0, batch, device)}
        with torch.autocast(device_type=torch.device(device).type, dtype=dtype, enabled=dtype is not None):
            loss, _ = task.loss(b, "main", step)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema.update(step)
        if device == "cuda":
            torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_gflops(threads_note: str, dtype: torch.dtype = torch.float32, size: int = 1024, repeats: int = 5) -> float:
    """The machine's practical ceiling: GFLOP/s of a size×size matmul in `dtype` (median of `repeats`). A CPU
    without native bf16 (AVX-512-BF16 / AMX) runs bf16 matmuls far slower than fp32."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    gflops = 2 * size**3 / statistics.median(times) / 1e9
    print(f"  {str(dtype).removeprefix('torch.')} matmul {size}x{size} ({threads_note}): {gflops:.1f} GFLOP/s")
    return gflops


def train_flops_per_image() -> float:
    """Forward + backward FLOPs of one DiT-S/2 training image on 4x32x32 latents (256 tokens), ~3x the forward:
    2 FLOPs per multiply-add of every per-token weight (the adaLN regressions act once per image), plus
    attention's two N×N×D products per layer."""
    cfg = load_config("dit-shapes", ["model.size=S/2", "model.depth=null", "model.hidden_size=null",
                                     "model.num_heads=null", "model.patch_size=null", "data.image_size=32"])
    with torch.device("meta"):
        task = cfg.model.build_task(cfg, DataInfo(num_classes=1000, channels=4, image_size=32))
    model, tokens = task.model, 256
    per_image = {id(p) for name, p in model.named_parameters() if "adaLN" in name or "embedder" in name}
    per_token = sum(p.numel() for p in model.parameters() if id(p) not in per_image)
    width, depth = model.blocks[0].attn.qkv.in_features, len(model.blocks)
    forward = 2 * per_token * tokens + depth * 2 * 2 * tokens * tokens * width
    return 3 * forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"DiT-S/2, 4x32x32 latents, {device}, {args.threads} threads, median of {args.steps} steps")
    ceiling = matmul_gflops(f"{args.threads} threads") if device == "cpu" else None
    if device == "cpu" and "bf16" in args.precision:
        matmul_gflops(f"{args.threads} threads", torch.bfloat16)
    flops = train_flops_per_image()
    print(f"  one training image = {flops / 1e9:.1f} GFLOP (forward + backward)"
          + (f": at most {ceiling * 1e9 / flops:.1f} images/s at the matmul rate" if ceiling else ""))
    for precision in args.precision:
        for batch in args.batch:
            sec = bench(batch, precision, args.steps, args.warmup, device, args.compile)
            print(f"  {precision:>4}  batch {batch:>3}: {sec * 1000:8.1f} ms/step  {batch / sec:7.1f} images/s  "
                  f"({batch / sec * flops / 1e9:.0f} GFLOP/s)")


if __name__ == "__main__":
    main()
