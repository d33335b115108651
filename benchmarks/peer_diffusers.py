"""genforge's default preset against the diffusers example recipe on one image folder, at equal wall time, by FID.

The peer is the recipe of huggingface/diffusers `examples/unconditional_image_generation/train_unconditional.py` as
its README runs it (`--center_crop --random_flip --use_ema`, every other setting at the script's default):
`UNet2DModel` with the script's block layout (widths 128, 128, 256, 256, 512, 512, two ResNet layers per block,
self-attention at the 4x4 level, at 64 px), scaled to the resolution by dropping (or adding) 128-wide levels at the
top so that attention stays at 4x4 and the deepest level at 2x2 (32 px: 128, 256, 256, 512, 512); `DDPMScheduler`
with 1000 steps of linear betas and epsilon prediction, the MSE to the noise; AdamW at lr 1e-4, betas (0.95, 0.999),
weight decay 1e-6, eps 1e-8, gradient norm clipped to 1; a cosine schedule with 500 warm-up steps over the run's
steps; `EMAModel` with warm-up (inv_gamma 1, power 3/4, max decay 0.9999), stepped after every optimizer step; a
random horizontal flip; batch 16 (`--batch`); fp32. Its samples come from `DDPMPipeline` with the EMA weights, at
the script's 1000 steps unless `--peer-sample-steps` says fewer (the table says which).

genforge is its default preset (`unet-shapes`, what `make demo` trains) pointed at the same folder (`data.source:
folder`): class-conditional when the folder has class sub-folders (sampled with the preset's guidance), and
unconditional (`model.conditioning=none`) like the peer; both rows are trained and scored.

Each recipe trains for `--minutes` of wall time: a short probe times its step (`--probe-steps`, on a throwaway
model), and the run is then given that many steps (genforge: `train.steps`; the peer: the cosine schedule's length).
The minutes reported are the measured wall time of the training call (genforge's includes its start-up, final
preview grid and checkpoint). Both are scored by genforge's FID (`genforge.eval`: the FID Inception-v3 pool3
features, `FID.compare`) on `--n` samples against ONE reference: the statistics of the folder's held-out images
(`--val-fraction`; 0: all its images), computed and cached as `genforge eval RUN --metrics fid` computes them for the
genforge runs.

    python benchmarks/peer_diffusers.py --data digits --minutes 10 --n 1000       # sklearn's digits at 32 px
    python benchmarks/peer_diffusers.py --data shapes --minutes 10 --n 1000       # genforge data shapes, 32 px
    python benchmarks/peer_diffusers.py --data PATH --image-size 64 --minutes 30  # any image folder
    python benchmarks/peer_diffusers.py --tiny                                    # tiny models, seconds (tests)

`--data digits` needs scikit-learn (`pip install -c constraints.txt -e ".[examples]"`); the folders are written under
`--out` (default runs/peer-<data>) beside the runs, and reused when already there.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel
from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import DataLoader

from common import ModelSpec, bench_trainer, device_type, doc_parser, time_trainer
from genforge.app.config import RunConfig, load_config
from genforge.app.runs import load_run, make_trainer
from genforge.core.config import DataConfig
from genforge.data.loader import build_dataset
from genforge.data.shapes import write_shapes_folder
from genforge.eval.metrics import FID, feature_network
from genforge.eval.reference import Reference, pool_features, reference_source, reference_stats
from genforge.sampling import generate

PRESET = "unet-shapes"  # genforge's default (make demo)
# what the genforge runs must not do while timed: no TensorBoard, no progress bar, no evaluation, no
# intermediate previews or checkpoints (the final step still writes one of each)
GENFORGE_QUIET = ["train.sample_every=0", "train.checkpoint_every=0", "eval.every=0", "log.tensorboard=false",
                  "log.progress=false"]
# --tiny: a genforge U-Net of width 8 sampled in 4 steps
GENFORGE_TINY = ["model.backbone.dim=8", "model.backbone.head_dim=8", "model.diffusion.sample_steps=4"]


# ------------------------------------------------------------------------------------------- the peer recipe
@dataclass(frozen=True)
class PeerRecipe:
    """train_unconditional.py's defaults (its argparse defaults; flip and EMA on as its README runs it)."""

    lr: float = 1e-4
    adam_betas: tuple[float, float] = (0.95, 0.999)
    weight_decay: float = 1e-6
    adam_eps: float = 1e-8
    lr_schedule: str = "cosine"
    warmup_steps: int = 500
    grad_clip: float = 1.0
    ema_inv_gamma: float = 1.0
    ema_power: float = 0.75
    ema_max_decay: float = 0.9999
    train_timesteps: int = 1000
    beta_schedule: str = "linear"
    prediction: str = "epsilon"
    sample_steps: int = 1000  # DDPMPipeline's (and the script's ddpm_num_inference_steps) default


# The script's layout at its default 64 px: (block width, down block, up block) per level, top to bottom.
LAYOUT_64PX = ((128, "DownBlock2D", "UpBlock2D"), (128, "DownBlock2D", "UpBlock2D"),
               (256, "DownBlock2D", "UpBlock2D"), (256, "DownBlock2D", "UpBlock2D"),
               (512, "AttnDownBlock2D", "AttnUpBlock2D"), (512, "DownBlock2D", "UpBlock2D"))


def peer_layout(resolution: int) -> tuple[tuple[int, str, str], ...]:
    """The 64-px layout scaled to `resolution` (a power of two >= 8): one 128-wide top level fewer per halving (more
    per doubling), so attention stays at 4x4 and the deepest level at 2x2."""
    levels = math.log2(resolution) if resolution > 0 else -1
    if levels != int(levels) or resolution < 8:
        raise ValueError(f"--image-size {resolution}: the peer's U-Net needs a power of two >= 8")
    shift = int(levels) - 6  # log2(resolution / 64)
    return LAYOUT_64PX[-shift:] if shift < 0 else ((128, "DownBlock2D", "UpBlock2D"),) * shift + LAYOUT_64PX


def peer_unet(resolution: int, width_divisor: int = 1, layers_per_block: int = 2) -> UNet2DModel:
    """train_unconditional.py's UNet2DModel at `resolution`; `width_divisor` and `layers_per_block` shrink it
    (--tiny). The down blocks list the levels top to bottom, the up blocks bottom to top."""
    layout = peer_layout(resolution)
    widths = tuple(width // width_divisor for width, _, _ in layout)
    return UNet2DModel(sample_size=resolution, in_channels=3, out_channels=3, layers_per_block=layers_per_block,
                       block_out_channels=widths, norm_num_groups=min(32, min(widths)),  # 32: the default
                       down_block_types=tuple(down for _, down, _ in layout),
                       up_block_types=tuple(up for _, _, up in reversed(layout)))


class PeerTraining:
    """One run of the recipe: the optimizer, its cosine schedule over `horizon` steps, the EMA, the noise
    scheduler; `step` is one iteration of the script's loop (DDPM, Ho et al. 2020, Alg. 1: the MSE between the
    noise and its prediction at a uniform t)."""

    def __init__(self, model: UNet2DModel, recipe: PeerRecipe, horizon: int, seed: int) -> None:
        self.model, self.recipe = model, recipe
        self.device = next(model.parameters()).device
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=recipe.adam_betas,
                                           weight_decay=recipe.weight_decay, eps=recipe.adam_eps)
        self.lr_schedule = get_scheduler(recipe.lr_schedule, optimizer=self.optimizer,
                                         num_warmup_steps=recipe.warmup_steps, num_training_steps=horizon)
        self.ema = EMAModel(model.parameters(), decay=recipe.ema_max_decay, use_ema_warmup=True,
                            inv_gamma=recipe.ema_inv_gamma, power=recipe.ema_power)
        self.noise_scheduler = DDPMScheduler(num_train_timesteps=recipe.train_timesteps,
                                             beta_schedule=recipe.beta_schedule, prediction_type=recipe.prediction)
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.steps = self.images_seen = 0

    def step(self, clean: Tensor) -> float:
        """One optimizer step on clean images [B, 3, H, W] in [-1, 1] (already flipped); returns the loss."""
        clean = clean.to(self.device)
        noise = torch.randn(clean.shape, generator=self.generator, device=self.device)
        t = torch.randint(0, self.recipe.train_timesteps, (len(clean),), generator=self.generator, device=self.device)
        noisy = self.noise_scheduler.add_noise(clean, noise, t)  # sqrt(abar_t) x0 + sqrt(1 - abar_t) eps
        self.model.train()
        loss = F.mse_loss(self.model(noisy, t).sample.float(), noise.float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.grad_clip)
        self.optimizer.step()
        self.lr_schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.ema.step(self.model.parameters())
        self.steps += 1
        self.images_seen += len(clean)
        return float(loss.detach())

    @torch.no_grad()
    def sample(self, n: int, seed: int, steps: int, batch_size: int) -> Tensor:
        """`n` samples [n, 3, H, W] in [-1, 1] (CPU) from DDPMPipeline with the EMA weights in `steps` steps, in
        batches of `batch_size`, batch c drawn with a generator seeded by seed + c."""
        self.ema.copy_to(self.model.parameters())
        self.model.eval()
        pipeline = DDPMPipeline(unet=self.model, scheduler=self.noise_scheduler)
        pipeline.set_progress_bar_config(disable=True)
        chunks = []
        for chunk, start in enumerate(range(0, n, batch_size)):
            generator = torch.Generator(self.device).manual_seed(seed + chunk)
            images = pipeline(batch_size=min(batch_size, n - start), generator=generator, num_inference_steps=steps,
                              output_type="pt").images  # [b, 3, H, W] in [0, 1]
            chunks.append(images.float().cpu() * 2 - 1)
        return torch.cat(chunks)


def peer_batches(data: DataConfig, batch_size: int, seed: int) -> Iterator[Tensor]:
    """The folder's training split as the script's DataLoader gives it, epoch after epoch: shuffled batches (the last
    of an epoch may be short), each image flipped horizontally with probability 1/2; [B, 3, H, W] in [-1, 1]."""
    dataset = build_dataset(data, "train", flip=False)
    generator = torch.Generator().manual_seed(seed)

    def collate(items: list[dict]) -> Tensor:
        images = torch.stack([item["image"] for item in items if "image" in item])
        flip = torch.rand(len(images), generator=generator) < 0.5
        return torch.where(flip[:, None, None, None], images.flip(-1), images)

    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator, collate_fn=collate)
    while True:
        yield from loader


# ------------------------------------------------------------------------------------------------ the rows
@dataclass
class Row:
    """One recipe's line of the table."""

    recipe: str
    fid: float
    minutes: float
    steps: int
    images_seen: int
    parameters: int
    sampling: str

    def cells(self) -> list[str]:
        return [self.recipe, f"{self.fid:.2f}", f"{self.minutes:.2f}", str(self.steps), f"{self.images_seen:,}",
                f"{self.parameters:,}", self.sampling]


HEADER = ["recipe", "FID", "minutes", "steps", "images seen", "parameters", "sampling steps"]


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def steps_for(minutes: float, step_s: float) -> int:
    """How many steps of `step_s` seconds fill `minutes`."""
    return max(1, int(minutes * 60 / step_s))


def probe_seconds(step: Callable[[], object], steps: int, warmup: int, device: str) -> float:
    """Median wall time of `step` over `steps` calls after `warmup`."""
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def score(reference: Reference, images: Tensor, device: str) -> float:
    """genforge's FID of `images` [n, 3, H, W] in [-1, 1] against `reference`."""
    features = pool_features(feature_network(device), images, device)
    return FID().compare(reference, features)["fid"]


def run_peer(args: argparse.Namespace, data: DataConfig, reference: Reference, device: str) -> Row:
    recipe = PeerRecipe()
    sample_steps = args.peer_sample_steps or recipe.sample_steps
    divisor, layers = (16, 1) if args.tiny else (args.peer_width_divisor, 2)

    def fresh(horizon: int) -> PeerTraining:
        torch.manual_seed(args.seed)
        return PeerTraining(peer_unet(data.image_size, divisor, layers).to(device), recipe, horizon, args.seed)

    probe, batches = fresh(1_000_000), peer_batches(data, args.batch, args.seed)
    step_s = probe_seconds(lambda: probe.step(next(batches)), args.probe_steps, 1, device)
    del probe
    steps = steps_for(args.minutes, step_s)
    print(f"diffusers recipe: {step_s * 1000:.0f} ms/step at batch {args.batch} -> {steps} steps"
          + (f" (all inside the recipe's {recipe.warmup_steps}-step warm-up)" if steps <= recipe.warmup_steps else ""),
          flush=True)
    t0 = time.perf_counter()
    training, batches = fresh(steps), peer_batches(data, args.batch, args.seed)
    for _ in range(steps):
        training.step(next(batches))
    if device == "cuda":
        torch.cuda.synchronize()
    minutes = (time.perf_counter() - t0) / 60
    images = training.sample(args.n, args.seed, sample_steps, args.sample_batch)
    narrowed = f", widths / {divisor}" if divisor > 1 and not args.tiny else ""
    return Row(f"diffusers train_unconditional (unconditional{narrowed})", score(reference, images, device), minutes,
               steps, training.images_seen, sum(p.numel() for p in training.model.parameters()),
               f"{sample_steps} (DDPMPipeline)")


def run_genforge(args: argparse.Namespace, overrides: list[str], label: str, reference: Reference,
                 device: str) -> Row:
    spec = ModelSpec(label, PRESET, tuple(overrides))
    batch = spec.config().train.batch_size
    with bench_trainer(spec, batch, "fp32") as probe:
        step_s = time_trainer(probe, args.probe_steps, 1).median_s
    steps = steps_for(args.minutes, step_s)
    print(f"genforge {label}: {step_s * 1000:.0f} ms/step at batch {batch} -> {steps} steps", flush=True)
    run_dir = args.out / "runs" / label.replace(" ", "-").replace(",", "")
    cfg = spec.config([*GENFORGE_QUIET, f"train.steps={steps}", f"train.seed={args.seed}", "train.precision='no'"])
    t0 = time.perf_counter()
    run_dir = make_trainer(cfg, run_dir, fresh=True).fit()  # beside an earlier run of the same name
    minutes = (time.perf_counter() - t0) / 60
    loaded = load_run(run_dir, device)
    images, _ = generate(loaded.task, args.n, args.seed, device, batch_size=args.sample_batch)
    sampler = loaded.task.sampler_settings(loaded.task.resolve())
    return Row(f"genforge {PRESET} ({label})", score(reference, images, device), minutes, steps, steps * batch,
               sum(p.numel() for p in loaded.task.parameters()), f"{sampler['steps']} ({sampler['sampler']})")


# ------------------------------------------------------------------------------------------------ the data
def bad_input(message: str) -> None:
    """Exit 2 naming what is wrong (genforge's rule for bad input)."""
    print(f"peer_diffusers: {message}", file=sys.stderr)
    sys.exit(2)


def image_folder(args: argparse.Namespace) -> Path:
    """The folder to train on: written for digits / shapes (kept and reused), else the path given."""
    if args.data not in ("digits", "shapes"):
        folder = Path(args.data)
        if not folder.is_dir():
            bad_input(f"--data {args.data}: not digits, shapes or an image folder")
        return folder
    folder = args.out / f"data-{args.data}-{args.image_size}px"
    if folder.is_dir():
        return folder
    if args.data == "shapes":
        write_shapes_folder(folder, args.shapes_n, args.image_size, seed=args.seed)
    else:
        if importlib.util.find_spec("sklearn") is None:
            bad_input("--data digits needs scikit-learn: pip install -c constraints.txt -e \".[examples]\"")
        from digits_folder import write_digits  # the optional dependency: imported only for --data digits

        write_digits(folder, args.image_size)
    return folder


def genforge_rows(data_cfg: RunConfig) -> list[tuple[str, list[str]]]:
    """The genforge runs: unconditional always; class-conditional when the folder has classes."""
    rows = [("unconditional", ["model.conditioning=none"])]
    if build_dataset(data_cfg.data, "all", flip=False).num_classes:
        rows.append(("class-conditional", []))
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = doc_parser(__doc__)
    parser.add_argument("--data", default="digits", help="digits | shapes | PATH of an image folder")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--minutes", type=float, default=10.0, help="training wall time of each recipe")
    parser.add_argument("--n", type=int, default=1000, help="samples per recipe for FID (and reference images)")
    parser.add_argument("--val-fraction", type=float, default=0.2,
                        help="held-out share of the folder: the FID reference (0: every image)")
    parser.add_argument("--batch", type=int, default=16, help="the peer's batch (genforge keeps its preset's)")
    parser.add_argument("--peer-sample-steps", type=int, default=None,
                        help="DDPMPipeline steps (default: the script's 1000)")
    parser.add_argument("--peer-width-divisor", type=int, default=1,
                        help="divide the peer's block widths by this (8 at 32 px: about genforge's parameter count, "
                             "for a CPU); 1: the script's widths")
    parser.add_argument("--sample-batch", type=int, default=64)
    parser.add_argument("--probe-steps", type=int, default=5, help="timed steps of each recipe's probe")
    parser.add_argument("--shapes-n", type=int, default=5000, help="images written for --data shapes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=None, help="data folders and runs (default runs/peer-<data>)")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny models and data, seconds of training, n 8: the code path in under a minute")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.n < 2 or min(args.batch, args.probe_steps, args.sample_batch,
                                              args.peer_width_divisor) < 1:
        parser.error("--minutes must be > 0, --n >= 2 (FID), --batch, --probe-steps, --sample-batch and "
                     "--peer-width-divisor >= 1")
    if 128 % args.peer_width_divisor:
        parser.error(f"--peer-width-divisor {args.peer_width_divisor}: must divide the peer's widths (128, 256, 512)")
    if not 0 <= args.val_fraction < 1:
        parser.error(f"--val-fraction {args.val_fraction}: must be in [0, 1)")
    if args.tiny:
        args.data = "shapes" if args.data == "digits" else args.data
        args.image_size, args.shapes_n, args.minutes, args.n, args.probe_steps = 16, 48, 0.05, 8, 2
        args.peer_sample_steps = 4
    args.out = args.out or Path("runs") / f"peer-{Path(args.data).name}"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = device_type()
    try:
        peer_layout(args.image_size)
    except ValueError as err:
        bad_input(str(err))
    folder = image_folder(args).resolve()
    folder_overrides = ["data.source=folder", f"data.path={folder}", f"data.image_size={args.image_size}",
                        f"data.val_fraction={args.val_fraction}", *(GENFORGE_TINY if args.tiny else [])]
    cfg = load_config(PRESET, folder_overrides)
    # the one reference of every row: what `genforge eval RUN --metrics fid --n N` uses for the genforge runs
    reference = reference_stats(feature_network(device), reference_source(cfg.data, None), args.n, device)
    print(f"data: {folder} at {args.image_size} px, {len(build_dataset(cfg.data, 'train', flip=False))} training "
          f"images; FID reference: {reference.n} held-out images ({reference.path}); device {device}", flush=True)
    rows = [run_peer(args, cfg.data, reference, device)]
    for label, overrides in genforge_rows(cfg):
        rows.append(run_genforge(args, [*folder_overrides, *overrides], label, reference, device))
    print(f"\nFID@{args.n} against {reference.n} held-out images of {folder.name}, {args.minutes:g} min of training "
          f"each ({device})\n")
    print(markdown([row.cells() for row in rows]))
    for row in rows[1:]:
        print(f"\nFID ratio, diffusers / {row.recipe}: {rows[0].fid / row.fid:.2f}x")


if __name__ == "__main__":
    main()
