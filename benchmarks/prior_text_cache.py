"""The DALL·E 2 prior's training step with the captions' CLIP text-tower states read from a `genforge encode` cache
versus the text tower run on every batch's captions.

Three trainers of the same prior (the real Trainer step, benchmarks/common.py: loader, forward, backward, clipping,
AdamW, EMA), in turn, each timed for `--steps` steps after `--warmup`: on the images (both CLIP towers every step),
on a cache of the clip run's image embeddings written with `--text-encoder none` (the text tower every step), and
on the cache `genforge encode CLIP_RUN` writes by default (image embeddings and the text tower's states of each
distinct caption: neither tower runs). Printed: the median ms/step and samples/s of each.

    python benchmarks/prior_text_cache.py runs/clip-shapes                     # a trained clip run
    python benchmarks/prior_text_cache.py --clip-preset clip-shapes            # train one for 1 step first
    python benchmarks/prior_text_cache.py --clip-preset clip-debug --prior dalle2-prior-debug --steps 5

Timing does not depend on how well the CLIP is trained, so `--clip-preset` trains it for one step.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from common import ModelSpec, bench_trainer, doc_parser, time_trainer, train_one_step
from genforge.app.config import load_config
from genforge.app.encode import encode_dataset
from genforge.app.runs import load_codec


def main() -> None:
    parser = doc_parser(__doc__)
    parser.add_argument("clip", nargs="?", type=Path, help="run directory of a trained clip model")
    parser.add_argument("--clip-preset", help="instead: train this clip preset for one step first")
    parser.add_argument("--prior", default="dalle2-prior-shapes", help="prior preset (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps (the median is printed)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--n", type=int, default=1024, help="images (data.shapes.n; default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    args = parser.parse_args()
    if (args.clip is None) == (args.clip_preset is None):
        parser.error("give a clip run directory or --clip-preset, not both")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="genforge-prior-bench-") as tmp:
        clip = args.clip.resolve() if args.clip else train_one_step(args.clip_preset, [], Path(tmp) / "clip")
        codec, info = load_codec(clip)
        on_clip = [f"model.embedder.path={clip}", f"data.shapes.n={args.n}"]
        cfg = load_config(args.prior, on_clip)
        data = cfg.data
        caches = {}
        for name, codec_text in (("image embeddings", False), ("+ text states", True)):
            caches[name] = Path(tmp) / name.replace(" ", "-")
            encode_dataset(codec, info, data, caches[name], flip=data.flip, codec_text=codec_text)
        runs = [("images", "both towers", []),
                *((f"cache: {name}", what, ["data.source=cache", f"data.path={caches[name]}"])
                  for name, what in (("image embeddings", "text tower"), ("+ text states", "neither")))]
        print(f"{args.prior} on {clip} (torch {torch.__version__}, cpu, {args.threads} thread(s)), median of "
              f"{args.steps} steps after {args.warmup}")
        print("| data | CLIP run each step | ms/step | samples/s |\n|---|---|---|---|")
        for label, runs_each_step, overrides in runs:
            spec = ModelSpec(label, args.prior, (*on_clip, *overrides))
            with bench_trainer(spec, cfg.train.batch_size, "fp32") as trainer:
                times = time_trainer(trainer, args.steps, args.warmup)
            print(f"| {label} | {runs_each_step} | {times.median_s * 1e3:.0f} | {times.images_per_s:.0f} |")


if __name__ == "__main__":
    main()
