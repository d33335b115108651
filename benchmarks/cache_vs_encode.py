"""DiT training steps/s on a latent cache versus encoding the pixels with the tokenizer every step.

Both runs are the real trainer (`genforge train`: data loader, accelerate, clipping, EMA) with the same DiT,
the same batch and the same images: once read from a cache that `genforge encode` wrote (`data.source:
cache`), once rendered or decoded and passed through the KL-VAE's encoder at every step. The rate is that of
the second half of the steps (the first half warms up). fast-DiT reports 1.95x for DiT-XL/2 at 256 px on
an A100.

    python benchmarks/cache_vs_encode.py runs/klvae-shapes                     # a trained KL-VAE run
    python benchmarks/cache_vs_encode.py --tokenizer-preset klvae-debug        # train one for 1 step first
    python benchmarks/cache_vs_encode.py runs/vae --set model.backbone.size=XL/2 --set train.precision=bf16 --batch 64

The tokenizer's own data section (its config.yaml) gives the images, with `data.shapes.n=--n` for shapes.
Timing does not depend on how well the tokenizer is trained, so `--tokenizer-preset` trains it for one step.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from common import doc_parser, train_one_step
from genforge.app.config import RunConfig, load_config
from genforge.app.encode import encode_dataset
from genforge.data.cache import manifest_summary
from genforge.app.runs import load_codec, make_trainer

# DiT-S/2 as in the paper; --set overrides come after these
DEFAULT_DIT = ["model.backbone={kind: dit, size: S/2}"]


def steps_per_second(cfg: RunConfig, run_dir: Path) -> float:
    """Optimizer steps per second over the second half of `cfg.train.steps`, from the run's metrics."""
    make_trainer(cfg, run_dir).fit()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "samples_per_s" in r][-1]["samples_per_s"] / cfg.train.batch_size


def dit_config(args: argparse.Namespace, tokenizer: Path, data: dict, steps: int) -> RunConfig:
    """The DiT preset + overrides, reading `data` (a data section), training `2 * steps` steps."""
    sets = [*DEFAULT_DIT, *args.set, "model.latent.codec=tokenizer", f"model.latent.tokenizer={tokenizer}",
            f"train.batch_size={args.batch}", f"train.steps={2 * steps}", f"train.log_every={steps}",
            "train.sample_every=0", "train.checkpoint_every=0", "train.num_samples=2", "eval.every=0",
            "model.diffusion.sample_steps=2", "log.progress=false", "log.tensorboard=false"]
    cfg = load_config(args.dit, sets)
    return RunConfig.model_validate({**cfg.model_dump(), "data": data})


def main() -> None:
    parser = doc_parser(__doc__)
    parser.add_argument("tokenizer", nargs="?", type=Path, help="run directory of a trained KL-VAE (klvae)")
    parser.add_argument("--tokenizer-preset", help="instead: train this tokenizer preset for one step first")
    parser.add_argument("--tokenizer-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override for --tokenizer-preset")
    parser.add_argument("--dit", default="dit-latent-debug", help="DiT preset (default: %(default)s, made S/2)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="DiT config override")
    parser.add_argument("--batch", type=int, default=32, help="global batch (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps, after as many warm-up steps")
    parser.add_argument("--n", type=int, default=1024, help="images (data.shapes.n; default: %(default)s)")
    parser.add_argument("--workers", type=int, help="data.num_workers of both runs (default: the tokenizer's)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: %(default)s)")
    args = parser.parse_args()
    if (args.tokenizer is None) == (args.tokenizer_preset is None):
        parser.error("give a tokenizer run directory or --tokenizer-preset, not both")
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    with tempfile.TemporaryDirectory(prefix="cache-vs-encode-") as tmp:
        tmp = Path(tmp)
        tokenizer = args.tokenizer or train_one_step(args.tokenizer_preset, args.tokenizer_set, tmp / "tokenizer")
        codec, info = load_codec(tokenizer, device)
        sets = [f"data.shapes.n={args.n}"] + ([f"data.num_workers={args.workers}"] if args.workers is not None else [])
        data = load_config(str(tokenizer / "config.yaml"), sets).data

        start = time.perf_counter()
        manifest = encode_dataset(codec, info, data, tmp / "cache", flip=data.flip, batch_size=args.batch,
                                  device=device)
        encode_s = time.perf_counter() - start
        del codec
        pixels = dit_config(args, tokenizer, data.model_dump(), args.steps)
        cached = dit_config(args, tokenizer, {**data.model_dump(), "source": "cache", "path": str(tmp / "cache")},
                            args.steps)
        dit = pixels.model.backbone
        print(f"DiT {dit.size} {dit.dims()} on {'x'.join(map(str, manifest.shape))} latents of "
              f"{data.image_size} px {data.source} images ({info.family} {tokenizer}), batch {args.batch}, "
              f"train.precision={cached.train.precision}, {device}, {args.threads} threads, "
              f"{data.num_workers} data workers")
        print(f"  encoding once: {manifest_summary(manifest)} in {encode_s:.1f} s "
              f"({manifest.count * (2 if manifest.flip else 1) / encode_s:.0f} images/s)")
        from_cache = steps_per_second(cached, tmp / "dit-cache")
        print(f"  from the cache:         {from_cache:8.2f} steps/s")
        encoding = steps_per_second(pixels, tmp / "dit-pixels")
        print(f"  encoding every step:    {encoding:8.2f} steps/s")
        print(f"  ratio: {from_cache / encoding:.2f}x  (fast-DiT: 1.95x, DiT-XL/2 at 256 px on GPU)")


if __name__ == "__main__":
    main()
