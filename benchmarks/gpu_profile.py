"""Where DiT-XL/2's training step spends its time (issue 62, part 2): torch.profiler over a few of genforge's real
Trainer steps (benchmarks/common.py's `time_trainer`: loader, forward + backward, clipping, the non-finite guard,
AdamW, EMA), compiled (train.compile=true) unless `--eager`, in bf16, at 256 tokens with the paper's diffusion.
Written as markdown, each line as it is produced: one row per step (the compiling ones included), then the top
kernels by self time and the share of the profiled steps' wall time in each category.

A kernel's category, from its name (on a CPU: the aten operator's), case-insensitive, the first that matches:

    attention      flash, attention, sdpa, fmha (before GEMM: fmha_cutlass kernels are attention)
    GEMM           gemm, matmul, addmm, mm / bmm as a word (aten::mm, triton_tem_fused_mm_0), cutlass, sm90,
                   sm80, xmma, nvjet (Hopper's cuBLAS kernels), cublas, conv (the patch embedding)
    normalisation  norm, not normal (random numbers): layer_norm, group_norm, fused add + norm kernels, the
                   gradient clipping's norms
    elementwise    elementwise, triton_poi (inductor's pointwise kernels), add, mul, div, sub, gelu, silu, copy,
                   fill, memcpy, memset, exp, log, tanh, sigmoid, pow, sqrt, neg, where, clamp
    other          the rest: reductions, the fused optimizer's kernels, host-side wrappers
    idle           the profiled steps' wall time less the busy time

Busy time on a GPU: the CUDA activity (kernels, memcpy, memset: their self device time); on a CPU, which has no
kernels, the operators' self CPU time (the Python between operators counts as idle there). record_function ranges
are not kernels and are left out. When busy exceeds wall (kernels overlapping on streams) idle is 0 and shares are
of the busy time.

Profiled: `--steps` steps after `--warmup` unprofiled ones (the compiling steps) and one profiler warm-up step.

    python benchmarks/gpu_profile.py --report OUT/profile.md            # DiT-XL/2, batch 256, compiled, bf16
    python benchmarks/gpu_profile.py --model B/2 --batch 64 --eager
    python benchmarks/gpu_profile.py --tiny       # a tiny DiT, eager fp32, 2 steps: the path on a CPU (a test runs it)
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from common import (add_report_arg, bench_trainer, compile_overrides, device_type, note, report_to, row,
                    time_trainer)
from gpu import DITS, TINY_DITS

# (category, pattern), the first match wins (the module docstring)
CATEGORIES = [
    ("attention", r"flash|attention|sdpa|fmha"),
    ("GEMM", r"gemm|matmul|addmm|(?<![a-z])b?mm(?![a-z])|cutlass|sm90|sm80|xmma|nvjet|cublas|conv"),
    ("normalisation", r"norm(?!al)"),
    ("elementwise", r"elementwise|triton_poi|add|mul|div|sub|gelu|silu|copy|fill|memcpy|memset|exp|log|tanh|sigmoid|"
                    r"pow|sqrt|neg|where|clamp"),
]
ORDER = [name for name, _ in CATEGORIES] + ["other", "idle"]
NAME_WIDTH = 100  # kernel names (templated CUDA names run to hundreds of characters) cut to this


def category(name: str) -> str:
    """The category of a kernel (or CPU operator) name."""
    for label, pattern in CATEGORIES:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return label
    return "other"


@dataclass
class Kernel:
    """One kernel name's total self time over the profiled steps (microseconds) and its number of calls."""

    name: str
    self_us: float
    calls: int

    @property
    def category(self) -> str:
        return category(self.name)


def kernels(events: list, device: str) -> list[Kernel]:
    """The busy time of `events` (key_averages) by name, largest first: on a GPU its device activity; on a CPU the
    operators' self CPU time. User annotations (record_function ranges: the profiler steps, the optimizer step, the
    loader's `__next__`, compiled regions) are left out, as torch's own table leaves them out of device time: they
    span the kernels, or on a CPU the Python, between the operators."""
    found = []
    for event in events:
        if getattr(event, "is_user_annotation", False) or event.key.startswith("ProfilerStep"):
            continue
        if device == "cuda":
            if event.device_type != DeviceType.CUDA:
                continue
            self_us = event.self_device_time_total
        else:
            self_us = event.self_cpu_time_total
        if self_us > 0:
            found.append(Kernel(event.key, float(self_us), int(event.count)))
    return sorted(found, key=lambda k: -k.self_us)


def shares(found: list[Kernel], wall_us: float) -> dict[str, float]:
    """Microseconds per category in ORDER, idle = wall less busy (at least 0)."""
    by_category: dict[str, float] = defaultdict(float)
    for kernel in found:
        by_category[kernel.category] += kernel.self_us
    by_category["idle"] = max(wall_us - sum(by_category.values()), 0.0)
    return {name: by_category[name] for name in ORDER}


def cell(name: str) -> str:
    """A kernel name fit for a table cell: no pipes, at most NAME_WIDTH characters."""
    name = name.replace("|", "/")
    return name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH - 1] + "…"


def write_tables(found: list[Kernel], wall_us: float, steps: int, top: int, device: str) -> None:
    """The top kernels and the categories' shares, per profiled step."""
    busy_us = sum(k.self_us for k in found)
    unit = "device kernel" if device == "cuda" else "CPU operator"
    note(f"\nTop {min(top, len(found))} of {len(found)} {unit}s by self time ({busy_us / steps / 1e3:.1f} ms busy "
         f"per step of {wall_us / steps / 1e3:.1f} ms wall):\n")
    row(["rank", "kernel", "category", "ms per step", "share of busy", "calls per step"])
    row(["---"] * 6)
    for rank, kernel in enumerate(found[:top], start=1):
        row([rank, cell(kernel.name), kernel.category, f"{kernel.self_us / steps / 1e3:.3f}",
             f"{kernel.self_us / busy_us:.1%}", f"{kernel.calls / steps:g}"])
    rest = found[top:]
    if rest:
        rest_us = sum(k.self_us for k in rest)
        row(["–", f"({len(rest)} more)", "–", f"{rest_us / steps / 1e3:.3f}", f"{rest_us / busy_us:.1%}", "–"])
    total_us = max(wall_us, busy_us)
    note(f"\nShare of the step ({'wall' if wall_us >= busy_us else 'busy: kernels overlapped'} time), by category:\n")
    row(["category", "ms per step", "share"])
    row(["---"] * 3)
    for name, us in shares(found, wall_us).items():
        row([name, f"{us / steps / 1e3:.2f}", f"{us / total_us:.1%}"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="XL/2", choices=list(DITS))
    parser.add_argument("--batch", type=int, default=256, help="per-GPU batch (the ablation's fastest: 256)")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--steps", type=int, default=3, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=3, help="unprofiled steps first (the compiling ones)")
    parser.add_argument("--eager", action="store_true", help="the eager step (default: train.compile=true)")
    parser.add_argument("--workers", type=int, default=12, help="data.num_workers of genforge's loader")
    parser.add_argument("--top", type=int, default=25, help="kernels in the table")
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    parser.add_argument("--tiny", action="store_true", help="a tiny DiT, batch 4, eager fp32, 2 steps after 1, no "
                                                            "loader workers: the code path on a CPU")
    add_report_arg(parser)
    args = parser.parse_args(argv)
    report_to(args.report)
    if args.tiny:
        args.batch, args.steps, args.warmup, args.workers, args.eager, args.top = 4, 2, 1, 0, True, 10
        args.precision = "fp32"  # bf16 is emulated on most CPUs: 100x slower matmuls
    if args.threads:
        torch.set_num_threads(args.threads)
    device = device_type()
    spec = (TINY_DITS if args.tiny else DITS)[args.model]
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    note(f"{where}; torch {torch.__version__}; DiT-{args.model}{' (tiny)' if args.tiny else ''}, batch {args.batch}, "
         f"{args.precision}, {'eager' if args.eager else 'compiled'}; {args.steps} steps profiled after {args.warmup} "
         f"and 1 profiler warm-up; data.num_workers={args.workers}\n")
    row(["step", "what", "ms"])
    row(["---"] * 3)

    def step_row(i: int, seconds: float) -> None:
        what = "warm-up" if i < args.warmup else "profiler warm-up" if i == args.warmup else "profiled"
        row([i + 1, what, f"{seconds * 1e3:.1f}"])
        profiler.step()

    captured: list = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    extra = [f"data.num_workers={args.workers}", *compile_overrides(not args.eager)]
    with bench_trainer(spec, args.batch, args.precision, extra) as trainer, profile(
            activities=activities, schedule=schedule(skip_first=args.warmup, wait=0, warmup=1, active=args.steps, repeat=1),
            on_trace_ready=lambda p: captured.extend(p.key_averages())) as profiler:
        times = time_trainer(trainer, args.steps, args.warmup + 1, step_row)
    if not captured:
        raise SystemExit("the profiler returned no events")
    write_tables(kernels(captured, device), sum(times.step_s) * 1e6, args.steps, args.top, device)


if __name__ == "__main__":
    main()
