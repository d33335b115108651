"""What the training-step benchmarks share (benchmarks/train_step.py, benchmarks/gpu.py, benchmarks/maskgit_sampling.py).

Tables are printed row by row (`row`, `note`); with `--report FILE` (`add_report_arg`, `report_to`) each line is
also appended to FILE as it is printed, so a run stopped at any point (a time limit, a killed call) leaves every
finished row there.

genforge's step is the real `Trainer`'s: a trainer is built from a preset + overrides (`make_trainer`) in a temporary
run directory, and `time_trainer` runs what one iteration of `Trainer._loop` runs, in its order: the micro-batches
from the trainer's own data loader (`Trainer._batches`, so the loader is timed), `train_step` (forward, backward,
clipping, the non-finite guard, the optimizer step), `_finish_step` (the step's one host read), `task.end_step`,
the EMA update and, every `train.log_every` steps, the reduction of the logged scalars. Left out: what the loop
does only at its cadences (writing logs, preview grids, evaluation, checkpoints).

facebookresearch/DiT's step is timed from a checkout (`load_reference`): its `models.py` DiT and its `diffusion`
package with the AdamW and per-parameter EMA loop of its `train.py`, on random 4-channel latents (no loader).
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import importlib
import statistics
import sys
import tempfile
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from genforge.app.config import RunConfig, load_config
from genforge.app.runs import build_task, make_trainer
from genforge.core.config import SampleOptions, TrainConfig
from genforge.core.random import BatchRandom
from genforge.core.task import Task
from genforge.data.base import collate
from genforge.data.loader import build_dataset, data_info
from genforge.engine.logging import StepLogs
from genforge.engine.trainer import Trainer

def doc_parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser whose description is a script docstring's first paragraph and whose epilog the rest."""
    head, *rest = doc.split("\n\n")
    return argparse.ArgumentParser(description=head, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="\n\n".join(rest))


_REPORT: list[Path] = []  # where `note` appends besides stdout (report_to)


def add_report_arg(parser: argparse.ArgumentParser) -> None:
    """`--report FILE`: the printed table, also appended to FILE line by line as it is measured."""
    parser.add_argument("--report", type=Path, help="also append each table line to this file as it is printed")


def report_to(path: Path | None) -> None:
    """Append every later `note` / `row` to `path` too (None: stdout only)."""
    _REPORT[:] = [] if path is None else [path]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)


def note(text: str = "") -> None:
    """Print `text` (flushed) and append it to the report file, opened and closed per line: nothing waits in a
    buffer when the process is killed."""
    print(text, flush=True)
    for path in _REPORT:
        with open(path, "a") as report:
            report.write(text + "\n")


def row(cells: Sequence[object]) -> None:
    """A markdown table row, as `note`."""
    note("| " + " | ".join(str(c) for c in cells) + " |")


def run_table_args(doc: str, tool: str, probe_steps: int, argv: list[str] | None,
                   extra: Callable[[argparse.ArgumentParser], None] = lambda parser: None) -> argparse.Namespace:
    """The arguments of a table over run directories (benchmarks/lever_table.py, video_levers.py): the runs, the step
    probe's threads and steps, --no-probe, and `extra`'s; exit 2 naming the arguments that are not run directories;
    torch set to the probe's threads."""
    parser = doc_parser(doc)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories with RUN/eval/<step>.json")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of the step probe")
    parser.add_argument("--probe-steps", type=int, default=probe_steps)
    parser.add_argument("--no-probe", action="store_true", help="use each run's logged samples/s")
    extra(parser)
    args = parser.parse_args(argv)
    missing = [str(run) for run in args.runs if not (run / "config.yaml").is_file()]
    if missing:
        print(f"{tool}: not a run directory (no config.yaml): {', '.join(missing)}", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    return args


def train_one_step(preset: str, overrides: list[str], run_dir: Path) -> Path:
    """A run of `preset` (+ `overrides`) trained for one step, quietly: an input run (a tokenizer, a CLIP) whose
    networks a benchmark times, not what they learned."""
    cfg = load_config(preset, [*overrides, "train.steps=1", "train.sample_every=0", "train.checkpoint_every=0",
                               "eval.every=0", "log.progress=false", "log.tensorboard=false"])
    make_trainer(cfg, run_dir).fit()
    return run_dir


# The paper's DiT diffusion (ε-prediction, linear schedule, learned sigma with the hybrid loss) and 1000 classes, at
# 32x32 inputs with patch 2 (256 tokens, as 256-px images through the SD VAE give), whatever dit-shapes sets itself.
DIT_PAPER = ["model.num_classes=1000", "model.diffusion.prediction=eps", "model.diffusion.noise_schedule=linear",
             "model.diffusion.learn_sigma=true"]
# A benchmark's trainer: nothing at the cadences, no progress bar, no TensorBoard
QUIET = ["train.steps=1000000", "train.sample_every=0", "train.checkpoint_every=0", "eval.every=0",
         "log.tensorboard=false", "log.progress=false"]
PRECISIONS = {"fp32": "'no'", "bf16": "bf16"}  # benchmark name -> train.precision (quoted: YAML reads no as false)


@dataclass(frozen=True)
class ModelSpec:
    """A model to time: a preset and overrides for genforge; `reference`: facebookresearch/DiT has the same model
    (a DiT), built with the same dimensions."""

    name: str
    preset: str
    overrides: tuple[str, ...]
    reference: bool = False

    def config(self, extra: list[str] = ()) -> RunConfig:
        return load_config(self.preset, [*self.overrides, *extra])


def dit(size: str, image_size: int = 32, **dims: int) -> ModelSpec:
    """DiT-`size` with the paper's diffusion and 1000 classes on the dit-shapes data at `image_size` px (3-channel
    pixels; at 32 px patch 2 gives the 256 tokens of 256-px images' 4x32x32 latents); `dims` override depth,
    hidden_size, num_heads, patch_size (tiny models)."""
    label = f"DiT-{size}" + ("" if not dims else " (" + ", ".join(f"{k} {v}" for k, v in dims.items()) + ")")
    overrides = [f"model.backbone={{kind: dit, size: {size}}}", *DIT_PAPER, f"data.image_size={image_size}",
                 *(f"model.backbone.{k}={v}" for k, v in dims.items())]
    return ModelSpec(label, "dit-shapes", tuple(overrides), reference=True)


def unet(**unet_fields: Any) -> ModelSpec:
    """The default preset's model (unet-shapes: the ADM U-Net, rectified flow, 32 px); `unet_fields` override
    model.backbone (tiny models)."""
    label = "U-Net (unet-shapes)" + ("" if not unet_fields else
                                     " (" + ", ".join(f"{k} {v}" for k, v in unet_fields.items()) + ")")
    return ModelSpec(label, "unet-shapes", tuple(f"model.backbone.{k}={v}" for k, v in unet_fields.items()))


def compile_overrides(compiled: bool) -> list[str]:
    """`train.compile=true` for a compiled step; exits naming what is missing when this checkout's TrainConfig has
    no such key yet."""
    if not compiled:
        return []
    if "compile" not in TrainConfig.model_fields:
        sys.exit("--compile times the trainer with --set train.compile=true, and this checkout's TrainConfig has no "
                 "`compile` field yet; run without --compile")
    return ["train.compile=true"]


def device_type() -> str:
    """Where the trainer runs: cuda when there is a GPU (accelerate's choice), else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def bf16_native(device: str) -> bool:
    """Whether bf16 matmuls run natively: a GPU with bf16, a CPU with AVX-512-BF16 or AMX (oneDNN's check)."""
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_gflops(dtype: torch.dtype, device: str, size: int = 1024, repeats: int = 5) -> float:
    """The machine's practical ceiling: GFLOP/s of a size×size matmul in `dtype` (median of `repeats`). A CPU
    without native bf16 (AVX-512-BF16 / AMX) runs bf16 matmuls far slower than fp32."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    a @ b
    synchronize(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return 2 * size**3 / statistics.median(times) / 1e9


def autocast(device: str, precision: str) -> torch.autocast:
    """bf16 autocast, or nothing for fp32."""
    return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=precision == "bf16")


@dataclass
class StepTimes:
    """Wall times of timed steps (after the warm-up) and of the warm-up steps; `loader_s`: of the timed steps, the
    time spent waiting for the data loader's next batch."""

    batch: int
    step_s: list[float] = field(default_factory=list)
    warmup_s: list[float] = field(default_factory=list)
    loader_s: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_s)

    @property
    def images_per_s(self) -> float:
        return self.batch / self.median_s

    @property
    def stall_share(self) -> float | None:
        """Share of the step time spent waiting for data (None: no loader)."""
        return sum(self.loader_s) / sum(self.step_s) if self.loader_s else None

    def compile_s(self, eager_step_s: float) -> float:
        """The warm-up's extra time over `eager_step_s` per step: what compiling cost (the first steps of a
        compiled trainer compile)."""
        return sum(self.warmup_s) - len(self.warmup_s) * eager_step_s


@contextmanager
def bench_trainer(spec: ModelSpec, batch: int, precision: str, extra: list[str] = ()) -> Iterator[Trainer]:
    """A fresh trainer of `spec` at global batch `batch` in `precision` (fp32 | bf16), in a temporary run
    directory; `extra`: more overrides (train.compile=true, data.num_workers=...)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # each trainer its own mixed precision
    GradientState._reset_state()
    cfg = spec.config([*QUIET, f"train.batch_size={batch}", f"train.precision={PRECISIONS[precision]}", *extra])
    with tempfile.TemporaryDirectory(prefix="genforge-bench-") as tmp:
        trainer = make_trainer(cfg, Path(tmp) / "run")
        try:
            yield trainer
        finally:
            del trainer
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def host_sync_per_phase(trainer: Trainer) -> None:
    """Add one host read per phase to `trainer`'s step, before its optimizer step: `bool(finite)`, what the
    non-finite guard did before the step kept its flags on the device (the comparison of `--host-sync`)."""
    optimizer_step = trainer._optimizer_step

    def synced(phase: str, finite: torch.Tensor) -> torch.Tensor:
        bool(finite)
        return optimizer_step(phase, finite)

    trainer._optimizer_step = synced


def time_trainer(trainer: Trainer, steps: int, warmup: int,
                 after_step: Callable[[int, float], None] = lambda i, seconds: None) -> StepTimes:
    """Run `warmup` + `steps` optimizer steps of `trainer` as `Trainer._loop` runs them (see the module docstring);
    the wall time of each, and of the timed ones the time waiting for the loader. `after_step(i, seconds)` runs
    after step i's clock stops (a profiler's `step`, a row per step)."""
    tc, device = trainer.run.train, trainer.accelerator.device.type
    times = StepTimes(tc.batch_size)
    logs = StepLogs()
    trainer.task.train()
    batches = trainer.batches()
    try:
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            micro = [next(batches) for _ in range(tc.grad_accum)]
            loaded = time.perf_counter()
            if not trainer.advance(iter(micro), logs)[0]:  # rolled back: the stream restarts past the failure
                batches.close()
                batches = trainer.batches()
            if trainer._due(tc.log_every):
                logs.reduce(trainer.accelerator)
            synchronize(device)
            elapsed = time.perf_counter() - t0
            if i < warmup:
                times.warmup_s.append(elapsed)
            else:
                times.step_s.append(elapsed)
                times.loader_s.append(loaded - t0)
            after_step(i, elapsed)
    finally:
        batches.close()  # stops the loader's workers
    return times


def _sdpa_cpu_flops(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _sdpa_cpu_backward_flops(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             *args: Any, **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


_sdpa_cpu_flops._get_raw = _sdpa_cpu_backward_flops._get_raw = True  # FlopCounterMode: called with the tensors
# torch's counter knows the CUDA attention kernels; these are the CPU's
CPU_ATTENTION_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops,
                       torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flops}


@functools.cache
def train_flops_per_image(spec: ModelSpec, device: str) -> float:
    """FLOPs of one training image (the first phase's forward + backward), counted by torch's FlopCounterMode on
    an eager copy of the model (matmuls, convolutions, attention; elementwise work is not counted, as MFU does)."""
    cfg = spec.config()
    dataset = build_dataset(cfg.data)
    torch.manual_seed(0)
    task = build_task(cfg, data_info(dataset, cfg.data), device=device)
    batch = collate([dataset[0]])
    batch.pop("skipped")
    batch.pop("missing", None)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    batch["rng"] = BatchRandom(0, 0, 0, 1, 0, 1, device)
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
        loss, _ = task.loss(batch, task.phases[0], 0)
        loss.backward()
    del task
    gc.collect()
    return float(counter.get_total_flops())


def reset_peak_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib(device: str) -> float | None:
    """The GPU's peak allocated memory since the last reset, in GiB (None on the CPU: no per-run figure)."""
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


# ------------------------------------------------------------------------------ facebookresearch/DiT
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


def time_reference(repo: Path, spec: ModelSpec, batch: int, precision: str, steps: int, warmup: int,
                   device: str) -> StepTimes:
    """facebookresearch/DiT's step for the DiT of `spec` (its dimensions, on 4-channel latents of the same size,
    1000 classes): its model and training loss, AdamW and per-parameter EMA, as its train.py runs them (the VAE
    encode excluded, as genforge is timed on data it need not encode)."""
    models, diffusion_pkg = load_reference(repo)
    cfg = spec.config()
    size = cfg.data.image_size
    torch.manual_seed(0)
    backbone = cfg.model.backbone
    model = models.DiT(input_size=size, num_classes=1000, mlp_ratio=backbone.mlp_ratio, **backbone.dims())
    model = model.to(device)
    ema = copy.deepcopy(model).requires_grad_(False)
    diffusion = diffusion_pkg.create_diffusion(timestep_respacing="")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
    ema_params, params = dict(ema.named_parameters()), dict(model.named_parameters())
    latent = torch.randn(batch, 4, size, size, device=device)
    label = torch.randint(0, 1000, (batch,), device=device)
    times = StepTimes(batch)
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        t = torch.randint(0, diffusion.num_timesteps, (batch,), device=device)
        with autocast(device, precision):
            loss = diffusion.training_losses(model, latent, t, dict(y=label))["loss"].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for name, param in params.items():
                ema_params[name].mul_(0.9999).add_(param.data, alpha=1 - 0.9999)
        synchronize(device)
        (times.warmup_s if i < warmup else times.step_s).append(time.perf_counter() - t0)
    del model, ema, opt
    gc.collect()
    return times


# ------------------------------------------------------------------------------------------ MaskGIT
def sampling_seconds(task: Task, batch: int, repeats: int, precision: str = "fp32",
                     options: SampleOptions | None = None) -> tuple[float, float]:
    """(median, first) seconds of `task.sample` for `batch` images of its default conditions over `repeats` calls
    after the first (which also memoises text embeddings), on the task's device, with `options` (default: none)."""
    device = next(task.parameters()).device
    options = task.resolve(options)
    cond = task.sample_conditions(batch, torch.Generator(device).manual_seed(0), options)
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        with autocast(device.type, precision):
            task.sample(cond, torch.Generator(device).manual_seed(i), batch, options)
        synchronize(device.type)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), times[0]
