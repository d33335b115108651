"""Per-rank memory of the trained state and checkpoint write time, DDP vs train.sharding=fsdp, on 2 CPU processes.

    python benchmarks/sharding.py                       # dit-shapes and maskgit-shapes
    python benchmarks/sharding.py --presets dit-debug   # any presets
    python benchmarks/sharding.py --presets dit-shapes --set model.backbone.size=B/2   # overrides for every preset

maskgit-shapes runs on the colour stand-in tokens (4x4 blocks, 64 ids) instead of its VQGAN run's cache, so that
nothing has to be trained first; its transformer (6 x 128) is the preset's.

For each preset and strategy it launches `torchrun --nproc_per_node 2` on this file; every rank trains 2 steps, runs
one more forward + backward so that gradients exist, and counts the bytes its own tensors hold (parameters that are
trained, their gradients, the optimizer's moments, the EMA), then times one checkpoint write. Prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.core.random import BatchRandom
from genforge.engine.sharding import local


def _bytes(tensors) -> int:
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


# presets whose inputs come from earlier runs, made self-contained
STANDALONE = {"maskgit-shapes": ["model.tokens.codec=colour", "model.tokens.tokenizer=null", "model.tokens.factor=4",
                                 "model.tokens.levels=4", "data.source=shapes", "data.path=null"]}


def measure(preset: str, sharding: str, run_dir: Path, extra: list[str]) -> dict[str, float]:
    """What this rank holds after training (a torchrun worker)."""
    overrides = [*STANDALONE.get(preset, []), *extra, f"train.sharding={sharding}", "train.steps=2", "train.sample_every=0",
                 "train.checkpoint_every=0", "eval.every=0", "train.log_every=1", "log.tensorboard=false",
                 "log.progress=false"]
    trainer = make_trainer(load_config(preset, overrides), run_dir)
    trainer.fit()
    phase = trainer.task.phases[0]
    batch = next(trainer.batches())
    batch.pop("missing", None)
    batch["rng"] = BatchRandom(0, 0, 0, len(batch.get("key", [0])), 0, len(batch.get("key", [0])),
                               trainer.accelerator.device)
    loss, _ = trainer.parallel_task(batch, phase, trainer.state.step)
    loss.backward()
    trained = [p for p in trainer.task.parameters() if p.requires_grad]
    optimizer_state = [t for opt in trainer.state.optimizers.values() for s in opt.state.values() for t in s.values()
                       if isinstance(t, torch.Tensor)]
    sizes = {"parameters": _bytes(trained), "gradients": _bytes(p.grad for p in trained if p.grad is not None),
             "optimizer": _bytes(optimizer_state), "ema": _bytes(trainer.state.ema.shadow.values())}
    trainer.state.optimizers[phase].zero_grad(set_to_none=True)
    torch.distributed.barrier()
    start = time.perf_counter()
    trainer.save_checkpoint()
    torch.distributed.barrier()
    sizes["checkpoint_s"] = time.perf_counter() - start
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="dit-shapes,maskgit-shapes")
    parser.add_argument("--set", action="append", default=[], help="a config override for every preset")
    parser.add_argument("--worker", nargs=3, metavar=("PRESET", "SHARDING", "RUN_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sizes = measure(args.worker[0], args.worker[1], Path(args.worker[2]) / "run", args.set)
        (Path(args.worker[2]) / f"sizes-rank{os.environ['RANK']}.json").write_text(json.dumps(sizes))
        return
    print(f"{'preset':24} {'strategy':8} {'params MB':>10} {'grads MB':>9} {'optim MB':>9} {'EMA MB':>8} "
          f"{'total MB':>9} {'vs DDP':>7} {'ckpt write s':>12}")
    for preset in args.presets.split(","):
        ddp_total = None
        for sharding in ("none", "fsdp"):
            with tempfile.TemporaryDirectory() as tmp:
                done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                       "--nproc_per_node", "2", __file__, "--worker", preset, sharding, tmp,
                                       *(f"--set={s}" for s in args.set)],
                                      capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
                rows = [json.loads(path.read_text()) for path in sorted(Path(tmp).glob("sizes-rank*.json"))]
            if done.returncode or len(rows) != 2:
                sys.exit(f"{preset} {sharding} failed:\n{done.stderr[-3000:]}")
            rank = max(rows, key=lambda r: r["parameters"] + r["optimizer"])  # the rank holding the most
            mb = {k: rank[k] / 2**20 for k in ("parameters", "gradients", "optimizer", "ema")}
            total = sum(mb.values())
            ddp_total = ddp_total or total
            seconds = max(r["checkpoint_s"] for r in rows)
            name = preset + "".join(f" {s.split('=')[-1]}" for s in args.set)
            print(f"{name:24} {'ddp' if sharding == 'none' else sharding:8} {mb['parameters']:10.2f} "
                  f"{mb['gradients']:9.2f} {mb['optimizer']:9.2f} {mb['ema']:8.2f} {total:9.2f} "
                  f"{total / ddp_total:7.2f} {seconds:12.3f}", flush=True)


if __name__ == "__main__":
    main()
