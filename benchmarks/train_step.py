"""DiT-S/2 training-step throughput on 4x32x32 latents (what 256-px images become through the SD VAE).

A step = IDDPM loss (hybrid, learned sigma) forward + backward + fused AdamW step + EMA update, as the
trainer does it. Prints ms/step and images/s, median of --steps steps after --warmup, for each batch size
and precision. The foundation issue quotes facebookresearch/DiT at about 6 images/s (fp32) and 12 images/s
(bf16 autocast) at batch 32; measured beside genforge on the 2-core CPU machine with `--reference`, it runs at
2.5 images/s fp32, as genforge does: both at the CPU's matmul rate (docs/diffusion.md).

`--reference DIR` also times facebookresearch/DiT itself, from a checkout at DIR (`git clone
https://github.com/facebookresearch/DiT`), in the same run: its `models.py` DiT-S/2 and its `diffusion`
package (`create_diffusion(timestep_respacing="")`, learned sigma, linear schedule), with AdamW and the
per-parameter EMA loop of its `train.py`. Its `models.py` imports three layers from timm, which needs
torchvision (never installed here), so `ReferenceTimmLayers` stands in for them: the same modules,
parameters and maths (timm's fused SDPA attention).

    python benchmarks/train_step.py [--threads 2] [--batch 8 32] [--precision fp32 bf16] [--compile]
                                    [--reference ~/src/DiT]
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from genforge.app.runs import build_task
from genforge.app.config import load_config
from genforge.data.loader import DataInfo
from genforge.engine.ema import EMA
from genforge.core.random import BatchRandom


# The paper's DiT-S/2 and its diffusion (ε-prediction, linear schedule, learned sigma with the hybrid loss), on
# 4x32x32 latents with 1000 classes, whatever the dit-shapes preset's own settings are.
DIT_S2 = ["model.size=S/2", "model.depth=null", "model.hidden_size=null", "model.num_heads=null",
          "model.patch_size=null", "model.mlp_ratio=4", "model.num_classes=1000", "data.image_size=32",
          "model.diffusion.prediction=eps", "model.diffusion.noise_schedule=linear",
          "model.diffusion.learn_sigma=true"]


def median_step_time(step: Callable[[int], None], steps: int, warmup: int, device: str) -> float:
    """Median wall time of `step(i)` over `steps` calls after `warmup` calls, in seconds."""
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        step(i)
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def autocast(device: str, precision: str) -> torch.autocast:
    dtype = {"fp32": None, "bf16": torch.bfloat16}[precision]
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype, enabled=dtype is not None)


def bench(batch: int, precision: str, steps: int, warmup: int, device: str, compile_model: bool) -> float:
    """genforge: the DiT task's loss, fused AdamW and genforge's EMA, as the trainer runs them."""
    cfg = load_config("dit-shapes", DIT_S2)
    torch.manual_seed(0)
    task = build_task(cfg, DataInfo(num_classes=1000, channels=4, image_size=32)).to(device)
    opt = torch.optim.AdamW(task.parameters(), lr=1e-4, weight_decay=0, fused=True)
    ema = EMA(task.model, 0.9999)
    if compile_model:
        task.model = torch.compile(task.model)
    latent = torch.randn(batch, 4, 32, 32, device=device)
    label = torch.randint(0, 1000, (batch,), device=device)

    def step(i: int) -> None:
        b = {"latent": latent, "label": label, "rng": BatchRandom(0, i, 0, batch, 0, batch, device)}
        with autocast(device, precision):
            loss, _ = task.loss(b, "main", i)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema.update(i)

    return median_step_time(step, steps, warmup, device)


class ReferenceTimmLayers:
    """The three timm layers facebookresearch/DiT's models.py imports (timm.models.vision_transformer), with
    timm's parameter names and maths, for timing the reference without installing timm (and torchvision)."""

    class PatchEmbed(nn.Module):
        """[B, C, H, W] -> [B, (H/p)(W/p), D] through a stride-p convolution."""

        def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int, bias: bool = True):
            super().__init__()
            self.patch_size = (patch_size, patch_size)
            self.num_patches = (img_size // patch_size) ** 2
            self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size, bias=bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x).flatten(2).transpose(1, 2)

    class Attention(nn.Module):
        """Multi-head self-attention: one qkv projection, SDPA, output projection."""

        def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, **_: object):
            super().__init__()
            self.num_heads = num_heads
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, n, c = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
            return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))

    class Mlp(nn.Module):
        """fc1 -> activation -> fc2."""

        def __init__(self, in_features: int, hidden_features: int, act_layer: Callable[[], nn.Module] = nn.GELU,
                     drop: float = 0.0):
            super().__init__()
            self.fc1 = nn.Linear(in_features, hidden_features)
            self.act = act_layer()
            self.fc2 = nn.Linear(hidden_features, in_features)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.act(self.fc1(x)))


@functools.cache
def load_reference(repo: Path) -> tuple[types.ModuleType, types.ModuleType]:
    """facebookresearch/DiT's `models` and `diffusion` modules from the checkout at `repo`."""
    if not (repo / "models.py").is_file() or not (repo / "diffusion").is_dir():
        sys.exit(f"--reference {repo}: not a facebookresearch/DiT checkout (no models.py and diffusion/)")
    timm_vit = types.ModuleType("timm.models.vision_transformer")
    for name in ("PatchEmbed", "Attention", "Mlp"):
        setattr(timm_vit, name, getattr(ReferenceTimmLayers, name))
    sys.modules.update({"timm": types.ModuleType("timm"), "timm.models": types.ModuleType("timm.models"),
                        "timm.models.vision_transformer": timm_vit})
    sys.path.insert(0, str(repo))
    return importlib.import_module("models"), importlib.import_module("diffusion")


def bench_reference(repo: Path, batch: int, precision: str, steps: int, warmup: int, device: str) -> float:
    """facebookresearch/DiT: its DiT-S/2 and training loss, AdamW and per-parameter EMA, as its train.py runs
    them (the VAE encode excluded, as genforge's latents are given too)."""
    models, diffusion_pkg = load_reference(repo)
    torch.manual_seed(0)
    model = models.DiT_models["DiT-S/2"](input_size=32, num_classes=1000).to(device)
    ema = copy.deepcopy(model).requires_grad_(False)
    diffusion = diffusion_pkg.create_diffusion(timestep_respacing="")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
    ema_params, params = dict(ema.named_parameters()), dict(model.named_parameters())
    latent = torch.randn(batch, 4, 32, 32, device=device)
    label = torch.randint(0, 1000, (batch,), device=device)

    def step(i: int) -> None:
        t = torch.randint(0, diffusion.num_timesteps, (batch,), device=device)
        with autocast(device, precision):
            loss = diffusion.training_losses(model, latent, t, dict(y=label))["loss"].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for name, param in params.items():
                ema_params[name].mul_(0.9999).add_(param.data, alpha=1 - 0.9999)

    return median_step_time(step, steps, warmup, device)


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
    cfg = load_config("dit-shapes", DIT_S2)
    with torch.device("meta"):
        task = build_task(cfg, DataInfo(num_classes=1000, channels=4, image_size=32))
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
    parser.add_argument("--reference", type=Path, help="a facebookresearch/DiT checkout to time beside genforge")
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
            report("genforge", precision, batch, sec, flops)
            if args.reference:
                ref = bench_reference(args.reference.expanduser(), batch, precision, args.steps, args.warmup, device)
                report("reference", precision, batch, ref, flops, f", genforge {ref / sec:.2f}x as fast")


def report(name: str, precision: str, batch: int, sec: float, flops: float, extra: str = "") -> None:
    print(f"  {name:>9}  {precision:>4}  batch {batch:>3}: {sec * 1000:8.1f} ms/step  {batch / sec:7.1f} images/s  "
          f"({batch / sec * flops / 1e9:.0f} GFLOP/s{extra})", flush=True)


if __name__ == "__main__":
    main()
