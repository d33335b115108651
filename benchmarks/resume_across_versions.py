"""Does a run written by an older genforge resume bit-identically with this one? For each preset: the old checkout
(`--old-tree`, e.g. a `git worktree add` of an earlier commit) trains steps 1-2 of 4 and stops after its checkpoint;
this checkout resumes that run to step 4; this checkout also trains the same 4 steps straight. Prints whether the
model and EMA weights of both step-4 checkpoints are equal bit for bit.

    git worktree add /tmp/genforge-old e6d4f29
    python benchmarks/resume_across_versions.py --old-tree /tmp/genforge-old --presets dit-debug vqgan-debug
    python benchmarks/resume_across_versions.py --old-tree /tmp/genforge-old --presets cvivit-debug \
        --set train.phases.discriminator.grad_clip=0.5    # a default changed between the two: pin the old one

A default that changed between the two checkouts makes the runs differ by design (the resumed run trained its first
half with the old default); `--set KEY=VALUE` pins it in all three runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parents[1]
OVERRIDES = ["train.steps=4", "train.checkpoint_every=2", "train.sample_every=0", "train.log_every=1",
             "data.num_workers=0"]
STOPPED_RUN = ("import sys; from pathlib import Path; from genforge.app.config import load_config; "
               "from genforge.app.runs import make_trainer; "
               "make_trainer(load_config(sys.argv[1], sys.argv[3:]), Path(sys.argv[2])).fit(stop_at=2)")


def run(tree: Path, argv: list[str]) -> None:
    """`python argv` with `tree`'s genforge first on the path."""
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(argv[:4])} failed:\n{done.stderr[-3000:]}")


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    step = run_dir / "checkpoints" / "step-000004"
    return {f"{part}.{k}": v for part in ("model", "ema") for k, v in load_file(str(step / f"{part}.safetensors")).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-tree", type=Path, required=True, help="a checkout of the older genforge")
    parser.add_argument("--presets", nargs="+", default=["dit-debug", "vqgan-debug"])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every run (e.g. pinning a default that changed)")
    args = parser.parse_args()
    overrides = OVERRIDES + args.overrides
    sets = [a for o in overrides for a in ("--set", o)]
    with tempfile.TemporaryDirectory(prefix="genforge-versions-") as tmp:
        for preset in args.presets:
            resumed, straight = Path(tmp) / f"{preset}-resumed", Path(tmp) / f"{preset}-straight"
            run(args.old_tree.resolve(), ["-c", STOPPED_RUN, preset, str(resumed), *overrides])
            run(HERE, ["-m", "genforge", "train", preset, "--run-dir", str(resumed), *sets])
            run(HERE, ["-m", "genforge", "train", preset, "--run-dir", str(straight), *sets])
            a, b = weights(resumed), weights(straight)
            same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            print(f"{preset}: steps 1-2 by {args.old_tree}, 3-4 by this checkout vs 1-4 by this checkout: "
                  f"{'bit-identical' if same else 'DIFFERENT'} ({len(a)} tensors)")


if __name__ == "__main__":
    main()
