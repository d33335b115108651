"""Fault injection for `benchmarks/faults.py` and genforge's own tests: kill -9 a training run or a
checkpoint writer at a random moment, resume, and compare with an uninterrupted run. Not part of the package.

    python benchmarks/kill_harness.py write-checkpoints RUN_DIR   # child process: save checkpoints forever
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.engine.checkpoint import CheckpointDir, load_state, load_tensors, read_json

# a tiny run that checkpoints often, so a kill can land anywhere: start-up, a step, a checkpoint write
KILL_RUN = ["train.steps=12", "train.checkpoint_every=2", "train.log_every=1", "train.sample_every=0"]


def nan_in(path: Path) -> None:
    """One weight of a safetensors file NaN, the file otherwise intact (what a bit flip or another tool leaves)."""
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(path))


def train_argv(run_dir: Path, overrides: list[str], preset: str = "dit-debug") -> list[str]:
    """The `genforge train` command line, run with this interpreter."""
    sets = [arg for o in overrides for arg in ("--set", o)]
    return [sys.executable, "-m", "genforge", "train", preset, "--run-dir", str(run_dir), *sets]


def child_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=timeout)


def start_and_kill(argv: list[str], delay_s: float, sig: int = signal.SIGKILL,
                   when_line: Path | None = None, lines: int = 0) -> subprocess.CompletedProcess:
    """Start `argv`; send `sig` after `delay_s` seconds, or once file `when_line` holds `lines` lines."""
    proc = subprocess.Popen(argv, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + delay_s
    while proc.poll() is None:
        if when_line is not None:
            if when_line.is_file() and len(when_line.read_text().splitlines()) >= lines:
                break
        elif time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def losses(run_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of every logged step in metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """Live and EMA weights of the latest checkpoint."""
    ckpt = CheckpointDir(run_dir / "checkpoints").latest()
    model = load_tensors(ckpt / "model.safetensors")
    ema = load_tensors(ckpt / "ema.safetensors")
    return {**{f"model.{k}": v for k, v in model.items()}, **{f"ema.{k}": v for k, v in ema.items()}}


def same_run(a: Path, b: Path) -> bool:
    """Bit-identical per-step losses and final weights."""
    wa, wb = final_weights(a), final_weights(b)
    return losses(a) == losses(b) and wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def kill_resume_trial(reference: Path, run_dir: Path, rng: random.Random, ref_seconds: float) -> dict:
    """kill -9 a run at a random moment (by time, or right after a random logged step), re-run the same
    command to the end, and compare with `reference`."""
    if rng.random() < 0.5:
        how = {"delay_s": rng.uniform(0, ref_seconds)}
    else:
        how = {"delay_s": 0, "when_line": run_dir / "metrics.jsonl", "lines": rng.randint(1, 11)}
    start_and_kill(train_argv(run_dir, KILL_RUN), **how)
    done = run(train_argv(run_dir, KILL_RUN))
    if done.returncode != 0:
        return {"ok": False, "how": str(how), "error": done.stderr[-2000:]}
    return {"ok": same_run(reference, run_dir), "how": str(how)}


# ------------------------------------------------------------------------- checkpoint writes under kill -9
def write_checkpoints_forever(run_dir: Path) -> None:
    """Child: a real trainer saving checkpoint after checkpoint (model, EMA, optimizer, RNG, JSON)."""
    trainer = make_trainer(load_config("dit-debug", ["train.keep_last=2"]), run_dir)
    trainer.fit(stop_at=1)
    trainer.save_checkpoint()
    print("ready", flush=True)
    while True:
        trainer.state.step += 1
        trainer.save_checkpoint()


def check_checkpoint(path: Path) -> None:
    """Read every file of a checkpoint the way a resume does; raises CheckpointReadError if one is torn."""
    state = read_json(path / "trainer_state.json")
    if path.name != f"step-{state['step']:06d}":
        raise AssertionError(f"{path.name} holds step {state['step']}")
    load_tensors(path / "model.safetensors")
    load_tensors(path / "ema.safetensors")
    for stem in {p.with_suffix("") for p in (path / "optim").iterdir()} | {
            p.with_suffix("") for p in (path / "rng").iterdir()}:
        load_state(stem)


def kill_checkpoint_trial(run_dir: Path, rng: random.Random) -> dict:
    """kill -9 the writer at a random moment of its checkpoint loop; `latest` must name a loadable checkpoint
    and a restart must clean up whatever was half written."""
    proc = subprocess.Popen([sys.executable, __file__, "write-checkpoints", str(run_dir)],
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        return {"ok": False, "error": proc.communicate()[1][-2000:]}
    time.sleep(rng.uniform(0, 0.5))
    proc.kill()
    proc.wait()
    ckpts = CheckpointDir(run_dir / "checkpoints")
    latest = ckpts.latest()
    try:
        check_checkpoint(latest)
    except Exception as err:  # noqa: BLE001 - report, the caller counts
        return {"ok": False, "latest": latest.name, "error": repr(err)}
    debris = [p.name for p in ckpts.clean_incomplete()]
    return {"ok": True, "latest": latest.name, "debris": debris}


if __name__ == "__main__":
    if sys.argv[1:2] == ["write-checkpoints"]:
        write_checkpoints_forever(Path(sys.argv[2]))
    else:
        sys.exit(f"usage: python benchmarks/kill_harness.py write-checkpoints RUN_DIR (got {sys.argv[1:]})")
