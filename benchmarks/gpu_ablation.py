"""The levers of genforge's DiT training step on a GPU, one row each, in one process (docs/performance.md, "The
GPU ablation"): issue 50's table of batch size, compile mode, the SDPA attention backend, fused against foreach
AdamW, host syncs and CUDA graphs, beside facebookresearch/DiT's step, then a short loss curve of the fastest step
against the eager fp32 one.

Every row is the real Trainer step (benchmarks/common.py: loader, forward + backward, clipping, the non-finite guard,
AdamW, EMA) of DiT-XL/2 (or `--model`) at 256 tokens with the paper's diffusion, in bf16, timed as the median of
`--steps` steps after `--warmup` (the compiling ones). Columns as benchmarks/gpu.py's table (MFU against the dense
bf16 peak of the GPU). The rows:

    eager / compiled at batch 64            the step as it is (train.compile=true: inductor, default mode)
    compiled at batch 128, 256              the batch per GPU (`--batches`); the best of them is B below
    compiled at B, attention flash|cudnn|efficient   SDPA restricted to one backend (torch.nn.attention.sdpa_kernel)
    compiled at B, foreach AdamW            torch's foreach AdamW instead of the fused one (which also costs the host
                                            read a non-fused optimizer needs before its step)
    compiled at B, + host sync per phase    one more device-to-host read per step (what the step saved by keeping
                                            its finite flags on the device)
    compiled at B, max-autotune             inductor's Triton matmul templates, autotuned (no CUDA graphs)
    compiled at B, cuda-graphs              inductor's cudagraph trees (mode reduce-overhead) around each block
    compiled at B, coordinate-descent       inductor's coordinate-descent tuning of its generated kernels
                                            (`--inductor` picks these three; the first two by default)
    combined                                B with each lever that paid over the compiled-at-B row
    facebookresearch/DiT at 64 and B        its step (`--reference DIR`), same call
    DiT-B/2, compiled and the reference at B

Rows run in that order of importance until `--budget-s` is spent (a row not started is printed as skipped); a row
that fails (out of memory, a backend that refuses the shapes) prints its error and the next one runs.

    python benchmarks/gpu_ablation.py --reference .ref/DiT --budget-s 240
    python benchmarks/gpu_ablation.py --tiny        # tiny models, a few steps: the code path on a CPU (a test runs it)

`--report FILE` appends the table to FILE row by row as each row is measured (benchmarks/gpu_session.sh:
$OUT/ablation.md), so a call cut at its limit keeps every finished row.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import signal
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import (ModelSpec, StepTimes, add_report_arg, bench_trainer, compile_overrides, device_type,
                    host_sync_per_phase, note, peak_memory_gib, report_to, reset_peak_memory, row, time_reference,
                    time_trainer, train_flops_per_image)
from genforge.engine.logging import StepLogs
from gpu import COLUMNS, DITS, TINY_DITS, peak_tflops, train_row

ATTENTION = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}
INDUCTOR = {"max-autotune": {"max_autotune": True}, "cuda-graphs": {"triton.cudagraphs": True},
            "coordinate-descent": {"coordinate_descent_tuning": True}}
ROWS = ["eager", "reference", "models", "loss", "attention", "optimizer", "sync", "combined"]


@dataclass
class Lever:
    """One row's step: batch, compiled or not, and what it changes (attention backend, inductor options, foreach
    AdamW, an extra host sync)."""

    batch: int
    compiled: bool = True
    attention: str | None = None
    inductor: str | None = None
    foreach_adamw: bool = False
    host_sync: bool = False
    combined: bool = False  # the row of every lever that paid

    def label(self) -> str:
        parts = (["combined:"] if self.combined else []) + ["compiled" if self.compiled else "eager"]
        parts += [f"attention {self.attention}"] if self.attention else []
        parts += [self.inductor] if self.inductor else []
        parts += ["foreach AdamW"] if self.foreach_adamw else []
        parts += ["+ host sync per phase"] if self.host_sync else []
        return "genforge " + ", ".join(parts).replace(":,", ":")


@contextlib.contextmanager
def foreach_adamw(enabled: bool) -> Iterator[None]:
    """torch.optim.AdamW built as the foreach variant (fused=False) while the trainer is made."""
    if not enabled:
        yield
        return
    fused_adamw = torch.optim.AdamW

    class ForeachAdamW(fused_adamw):
        def __init__(self, *args, fused: bool | None = None, **kwargs) -> None:
            super().__init__(*args, foreach=True, **kwargs)

    torch.optim.AdamW = ForeachAdamW
    try:
        yield
    finally:
        torch.optim.AdamW = fused_adamw


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in this (main) thread after `seconds` (a compile that autotunes for too long)."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"row stopped after its {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def lever_context(lever: Lever) -> Iterator[None]:
    """The process-wide settings of `lever` while its trainer is made and timed (its first steps compile)."""
    with contextlib.ExitStack() as stack:
        if lever.attention:
            stack.enter_context(sdpa_kernel(ATTENTION[lever.attention]))
        if lever.inductor:
            stack.enter_context(torch._inductor.config.patch(INDUCTOR[lever.inductor]))
        stack.enter_context(foreach_adamw(lever.foreach_adamw))
        yield


def time_lever(spec: ModelSpec, lever: Lever, args: argparse.Namespace) -> StepTimes:
    """The median step of `spec` with `lever`, timed as benchmarks/gpu.py times the trainer."""
    extra = [f"data.num_workers={args.workers}", *compile_overrides(lever.compiled)]
    with lever_context(lever), bench_trainer(spec, lever.batch, "bf16", extra) as trainer:
        if lever.host_sync:
            host_sync_per_phase(trainer)
        return time_trainer(trainer, args.steps, args.warmup)


def release() -> None:
    """Forget compiled code and cached memory between rows."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Table:
    """Runs rows until the budget is spent, printing each as it finishes."""

    def __init__(self, specs: dict[str, ModelSpec], args: argparse.Namespace, device: str, peak: float | None) -> None:
        self.specs, self.model_names = specs, list(specs)  # the first is ablated
        self.args, self.device, self.peak = args, device, peak
        self.end = time.monotonic() + args.budget_s
        self.eager_step_s: dict[tuple[str, int], float] = {}

    def left(self) -> float:
        return self.end - time.monotonic()

    def attempt(self, model: str, label: str, batch: int, run: Callable[[], StepTimes],
                compile_s: Callable[[StepTimes], float | None] = lambda t: None) -> StepTimes | None:
        """One row: `run` under the time left (at most `--row-s`), printed; None when skipped or failed."""
        if self.left() < self.args.min_row_s:
            row([model, label, batch, "bf16", "skipped: budget spent", *["–"] * 5])
            return None
        reset_peak_memory(self.device)
        try:
            with deadline(min(self.left(), self.args.row_s)):
                times = run()
        except Exception as err:  # noqa: BLE001 - a row that cannot run says why; the others still run
            message = f"{type(err).__name__}: {err}".replace("|", "/").replace("\n", " ")[:160]
            row([model, label, batch, "bf16", f"failed: {message}", *["–"] * 5])
            return None
        finally:
            release()
        train_row(model, label, times, "bf16", self.flops(model), self.peak, peak_memory_gib(self.device),
                  compile_s(times))
        return times

    def flops(self, model: str) -> float:
        return train_flops_per_image(self.specs[model], self.device)

    def lever(self, model: str, lever: Lever) -> float | None:
        """Time `lever` of `model`; its images/s (None if not measured)."""
        spec = self.specs[model]
        label = lever.label()

        def compile_s(times: StepTimes) -> float | None:
            eager = self.eager_step_s.get((model, lever.batch))
            return times.compile_s(eager) if lever.compiled and eager else None

        times = self.attempt(model, label, lever.batch, lambda: time_lever(spec, lever, self.args), compile_s)
        if times is not None and not lever.compiled:
            self.eager_step_s[(model, lever.batch)] = times.median_s
        return None if times is None else times.images_per_s

    def reference(self, model: str, batch: int) -> None:
        if self.args.reference is None:
            row([model, "facebookresearch/DiT", batch, "bf16", "not run: no --reference DIR", *["–"] * 5])
            return
        spec = self.specs[model]
        self.attempt(model, "facebookresearch/DiT", batch,
                     lambda: time_reference(self.args.reference.expanduser(), spec, batch, "bf16", self.args.steps,
                                            self.args.warmup, self.device))


def run_ablation(table: Table, args: argparse.Namespace) -> Lever:
    """The rows of the module docstring that `--rows` names, the ones the issue must show first (the batches, the
    reference, DiT-B/2, the loss curve), then the levers at the best batch and the combined rows; returns the
    fastest step's lever."""
    xl, others, compiled, rows = table.model_names[0], table.model_names[1:], not args.no_compile, set(args.rows)
    first = args.batches[0]
    if "eager" in rows:
        table.lever(xl, Lever(first, compiled=False))
    by_batch = {batch: table.lever(xl, Lever(batch, compiled)) for batch in args.batches}
    measured = {b: v for b, v in by_batch.items() if v}
    best_batch = max(measured, key=measured.get) if measured else first
    if "reference" in rows:
        for batch in dict.fromkeys([first, best_batch]):
            table.reference(xl, batch)
    for model in others if "models" in rows else []:
        table.lever(model, Lever(best_batch, compiled))
        table.reference(model, best_batch)
    if "loss" in rows:
        loss_curve(table, Lever(args.loss_batch, compiled), args)
    base_rate = measured.get(best_batch, 0.0)
    best, paid = Lever(best_batch, compiled, combined=True), {"attention": base_rate, "inductor": base_rate}

    def pays(kind: str, rate: float | None) -> bool:
        if rate and rate > base_rate * (1 + args.pays) and rate > paid[kind]:
            paid[kind] = rate
            return True
        return False

    for attention in ATTENTION if "attention" in rows else []:
        if pays("attention", table.lever(xl, Lever(best_batch, compiled, attention=attention))):
            best.attention = attention
    if "optimizer" in rows:
        table.lever(xl, Lever(best_batch, compiled, foreach_adamw=True))
    if "sync" in rows:
        table.lever(xl, Lever(best_batch, compiled, host_sync=True))
    for inductor in args.inductor if compiled else []:
        if pays("inductor", table.lever(xl, Lever(best_batch, compiled, inductor=inductor))):
            best.inductor = inductor
    if not (best.attention or best.inductor):
        best.combined = False  # nothing paid over the compiled step at the best batch
        return best
    for model in table.model_names if "combined" in rows else []:
        table.lever(model, best)
    return best


def step_losses(spec: ModelSpec, batch: int, precision: str, extra: list[str], steps: int,
                lever: Lever | None = None) -> list[float]:
    """The loss of each of the first `steps` steps of a fresh trainer (seeded: the same weights, data and noise
    for every call)."""
    losses = []
    with lever_context(lever or Lever(batch, compiled=False)), bench_trainer(spec, batch, precision, extra) as trainer:
        trainer.task.train()
        logs = StepLogs()
        batches = trainer.batches()
        try:
            for _ in range(steps):
                trainer.advance(batches, logs)
                losses.append(logs.reduce(trainer.accelerator)["loss"])
        finally:
            batches.close()
    return losses


def loss_curve(table: Table, fast: Lever, args: argparse.Namespace) -> None:
    """The first `--loss-steps` losses of the eager fp32 step against those of `fast` in bf16 (same seed, weights,
    data and noise), at batch `fast.batch`."""
    spec, model = table.specs[table.model_names[0]], table.model_names[0]
    note(f"\nLoss curve, {model} batch {fast.batch}: eager fp32 against {fast.label()} in bf16 (same seed, weights, "
         "data and noise)\n")
    if table.left() < args.min_row_s:
        note("skipped: budget spent")
        return
    workers = [f"data.num_workers={args.workers}"]
    try:
        with deadline(min(table.left(), args.row_s)):
            fp32 = step_losses(spec, fast.batch, "fp32", workers, args.loss_steps)
            release()
            bf16 = step_losses(spec, fast.batch, "bf16", [*workers, *compile_overrides(fast.compiled)],
                               args.loss_steps, fast)
    except Exception as err:  # noqa: BLE001 - the table's other rows still print
        note(f"failed: {type(err).__name__}: {err}")
        return
    finally:
        release()
    row(["step", "eager fp32", fast.label() + ", bf16", "relative difference"])
    row(["---"] * 4)
    differences = []
    for step, (a, b) in enumerate(zip(fp32, bf16), start=1):
        differences.append(abs(b - a) / abs(a))
        row([step, f"{a:.5f}", f"{b:.5f}", f"{differences[-1]:.2%}"])
    note(f"\nmean loss: eager fp32 {statistics.fmean(fp32):.5f}, bf16 {statistics.fmean(bf16):.5f}; largest step "
         f"difference {max(differences):.2%}\n")
    row(COLUMNS)
    row(["---"] * len(COLUMNS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["XL/2", "B/2"], choices=list(DITS),
                        help="the first is ablated; the others get the combined step and the reference")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256], help="per-GPU batches, first = base")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--workers", type=int, default=12, help="data.num_workers of genforge's loader")
    parser.add_argument("--reference", type=Path, help="a facebookresearch/DiT checkout to time beside genforge")
    parser.add_argument("--peak-tflops", type=float, help="peak dense bf16 FLOP/s of the device, for MFU")
    parser.add_argument("--budget-s", type=float, default=250.0, help="wall time for all rows")
    parser.add_argument("--row-s", type=float, default=75.0, help="the most one row may take")
    parser.add_argument("--min-row-s", type=float, default=12.0, help="no row starts with less time left")
    parser.add_argument("--pays", type=float, default=0.01, help="a lever pays when it is this much faster")
    parser.add_argument("--loss-steps", type=int, default=10)
    parser.add_argument("--loss-batch", type=int, default=32)
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    parser.add_argument("--rows", nargs="+", default=ROWS, choices=ROWS,
                        help="which rows beside the compiled batches (default all)")
    parser.add_argument("--inductor", nargs="*", default=["max-autotune", "cuda-graphs"], choices=list(INDUCTOR),
                        help="inductor options timed as levers")
    parser.add_argument("--no-compile", action="store_true", help="every row eager (the levers' code paths without "
                                                                  "compiling: a quick check on a CPU)")
    parser.add_argument("--tiny", action="store_true", help="tiny models, batches 4 and 8, 2 steps after 1, no "
                                                            "loader workers: the code path on a CPU")
    add_report_arg(parser)
    args = parser.parse_args()
    report_to(args.report)
    if args.tiny:
        args.batches, args.steps, args.warmup, args.workers = [4, 8], 2, 1, 0
        args.loss_steps, args.loss_batch, args.min_row_s = 3, 4, 0.0
    if args.threads:
        torch.set_num_threads(args.threads)
    device = device_type()
    peak, peak_source = peak_tflops(device, "bf16", args.peak_tflops)
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    note(f"{where}; torch {torch.__version__}; bf16; median of {args.steps} steps after {args.warmup}; "
         f"data.num_workers={args.workers}; budget {args.budget_s:.0f} s")
    note(f"MFU against {'n/a' if peak is None else f'{peak:.4g} TFLOP/s'} ({peak_source})\n")
    row(COLUMNS)
    row(["---"] * len(COLUMNS))
    dits = TINY_DITS if args.tiny else DITS
    table = Table({f"DiT-{m}" + (" (tiny)" if args.tiny else ""): dits[m] for m in args.models}, args, device, peak)
    best = run_ablation(table, args)
    note(f"\nfastest step: {best.label()} at batch {best.batch}")


if __name__ == "__main__":
    main()
