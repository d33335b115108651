"""Fault injection with real processes: kill -9, preemption signals, storage errors, pickles, bad data.
The heavier sweeps (20 kill -9 resumes, 100 kills during checkpoint writes) are benchmarks/faults.py."""

import errno
import json
import pickle
import random
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from genforge.app.config import load_config
from genforge.engine import checkpoint as checkpoint_module
from genforge.engine.checkpoint import CheckpointDir, CheckpointError
from genforge.app.runs import make_trainer
from genforge.engine.trainer import TrainingError
from kill_harness import (KILL_RUN, child_env, kill_checkpoint_trial, kill_resume_trial, run, same_run,
                              start_and_kill, train_argv)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    start = time.monotonic()
    done = run(train_argv(run_dir, KILL_RUN))
    assert done.returncode == 0, done.stderr
    return run_dir, time.monotonic() - start


def test_kill9_then_resume_is_bit_identical(reference, tmp_path):
    ref_dir, seconds = reference
    rng = random.Random(0)
    for trial in range(2):
        result = kill_resume_trial(ref_dir, tmp_path / f"trial{trial}", rng, seconds)
        assert result["ok"], result


def test_kill9_during_checkpoint_writes_never_tears_latest(tmp_path):
    rng = random.Random(1)
    results = [kill_checkpoint_trial(tmp_path / "run", rng) for _ in range(3)]
    assert all(r["ok"] for r in results), results


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGUSR1, 138), (signal.SIGINT, 130)])
def test_preemption_signal_checkpoints_and_exits(reference, tmp_path, sig, code):
    run_dir = tmp_path / "run"
    argv = train_argv(run_dir, KILL_RUN + ["train.checkpoint_every=0"])  # only the signal writes one early
    proc = start_and_kill(argv, 0, sig=sig, when_line=run_dir / "metrics.jsonl", lines=3)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert signal.Signals(sig).name in proc.stderr and "run the same command again" in proc.stderr
    latest = CheckpointDir(run_dir / "checkpoints").latest()
    assert latest is not None and 3 <= json.loads((latest / "trainer_state.json").read_text())["step"] < 12
    done = run(argv)
    assert done.returncode == 0, done.stderr
    assert same_run(reference[0], run_dir)


def test_checkpoint_write_error_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    cfg = load_config("dit-debug", ["train.checkpoint_every=2", "train.sample_every=0"])
    calls = {"n": 0}
    real = checkpoint_module.save_tensors

    def fails_second_time(path, tensors):
        calls["n"] += 1
        if calls["n"] == 3:  # model + ema of the first checkpoint went through
            path.write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, tensors)

    monkeypatch.setattr(checkpoint_module, "save_tensors", fails_second_time)
    with pytest.raises(CheckpointError) as info:
        make_trainer(cfg, tmp_path).fit()
    message = str(info.value)
    assert "step 4" in message and "[Errno 28]" in message and str(tmp_path) in message
    assert "still step-000002" in message
    ckpts = CheckpointDir(tmp_path / "checkpoints")
    assert ckpts.latest().name == "step-000002" and [p.name for p in ckpts.complete()] == ["step-000002"]
    assert not [p for p in ckpts.root.iterdir() if p.name.startswith(".tmp")]


def test_a_real_file_size_limit_fails_cleanly(tmp_path):
    """RLIMIT_FSIZE makes the kernel refuse the write (EFBIG): exit 1 with the errno, nothing half-written."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    argv = train_argv(tmp_path / "run", ["train.sample_every=0"])
    done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "could not write the checkpoint of step 3" in done.stderr and "File too large" in done.stderr
    root = tmp_path / "run" / "checkpoints"
    assert not (root / "latest").exists() and list(root.iterdir()) == []


class _RunsCode:
    def __reduce__(self):
        return (exec, ("open(__import__('os').environ['GENFORGE_PWNED'], 'w').write('ran')",))


def test_a_pickle_as_checkpoint_is_refused_and_never_run(tmp_path):
    run_dir = tmp_path / "run"
    done = run(train_argv(run_dir, ["train.steps=3", "train.sample_every=0"]))
    assert done.returncode == 0, done.stderr
    evil = pickle.dumps({"state": _RunsCode()})
    marker = tmp_path / "pwned"
    latest = CheckpointDir(run_dir / "checkpoints").latest()
    (latest / "model.safetensors").write_bytes(evil)
    env = dict(child_env(), GENFORGE_PWNED=str(marker))
    for argv in (train_argv(run_dir, ["train.steps=6"]),
                 [sys.executable, "-m", "genforge", "sample", str(run_dir), "--n", "2"],
                 [sys.executable, "-m", "genforge", "eval", str(run_dir), "--n", "2"]):
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 2, out.stderr[-2000:]
        assert "model.safetensors is not a readable safetensors file" in out.stderr
        assert not marker.exists()
    (run_dir / "evil.pt").write_bytes(evil)
    out = subprocess.run([sys.executable, "-m", "genforge", "sample", str(run_dir / "evil.pt")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and not marker.exists()


def _odd_mode_folder(root, n=40, bad=2, seed=0):
    """`n` valid images in odd modes (P with transparency, LA, CMYK, I;16, 1-bit, RGBA) in 2 classes, and
    `bad` corrupt files of several kinds. Returns the relative paths of the corrupt ones."""
    rng = np.random.default_rng(seed)
    modes = ["P", "LA", "CMYK", "I;16", "1", "RGBA", "L", "RGB"]
    for i in range(n):
        rgb = Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8))
        mode = modes[i % len(modes)]
        img = {"P": lambda: rgb.convert("P"), "I;16": lambda: rgb.convert("L").convert("I;16")}.get(
            mode, lambda: rgb.convert(mode))()
        if mode == "P":
            img.info["transparency"] = 0
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        img.save(folder / f"img{i:03d}.{'jpg' if mode in ('CMYK', 'L', 'RGB') else 'png'}")
    corrupt = []
    kinds = [b"", b"\xff\xd8\xff\xe0" + bytes(rng.integers(0, 256, 50, dtype=np.uint8)),
             bytes(rng.integers(0, 256, 400, dtype=np.uint8)), b"not an image at all"]
    for j in range(bad):
        path = root / "a" / f"bad{j}.jpg"
        path.write_bytes(kinds[j % len(kinds)])
        corrupt.append(f"a/bad{j}.jpg")
    return corrupt


def test_corrupt_files_are_skipped_and_listed_exactly(tmp_path):
    corrupt = _odd_mode_folder(tmp_path / "data", n=38, bad=2)  # 5% corrupt
    # 3 epochs of 40 images, so every file is read
    argv = train_argv(tmp_path / "run", ["data.source=folder", f"data.path={tmp_path / 'data'}", "train.steps=15",
                                         "train.sample_every=0", "data.image_size=16"])
    done = run(argv)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = [json.loads(line)["key"] for line in (tmp_path / "run" / "skipped.jsonl").read_text().splitlines()]
    assert sorted(listed) == sorted(corrupt)  # precision = recall = 1, each listed once


def test_too_much_bad_data_stops_the_run(tmp_path):
    _odd_mode_folder(tmp_path / "data", n=30, bad=10)  # 25% corrupt
    cfg = load_config("dit-debug", ["data.source=folder", f"data.path={tmp_path / 'data'}", "train.steps=30",
                                    "data.max_bad_fraction=0.1", "train.sample_every=0"])
    with pytest.raises(TrainingError, match="data.max_bad_fraction=0.1"):
        make_trainer(cfg, tmp_path / "run").fit()


def test_missing_or_empty_data_folder_fails_before_any_model(tmp_path):
    (tmp_path / "empty").mkdir()
    for path, says in ((tmp_path / "missing", "does not exist"), (tmp_path / "empty", "holds no images")):
        done = run(train_argv(tmp_path / "run", ["data.source=folder", f"data.path={path}"]))
        assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
        assert not (tmp_path / "run" / "checkpoints").exists()


def test_decompression_bomb_is_refused(tmp_path):
    from genforge.data.images import DecompressionBomb, load_rgb

    Image.new("L", (400, 300)).save(tmp_path / "big.png")
    with pytest.raises(DecompressionBomb, match="400x300"):
        load_rgb(tmp_path / "big.png", max_pixels=100_000)
    assert load_rgb(tmp_path / "big.png", max_pixels=120_000).size == (400, 300)


def test_killed_before_the_first_checkpoint_logs_each_step_once(reference, tmp_path):
    """A kill right after step 1 (no checkpoint yet): the re-run starts at 0 and drops the old records."""
    run_dir = tmp_path / "run"
    start_and_kill(train_argv(run_dir, KILL_RUN), 0, when_line=run_dir / "metrics.jsonl", lines=1)
    assert not (run_dir / "checkpoints" / "latest").exists()
    done = run(train_argv(run_dir, KILL_RUN))
    assert done.returncode == 0, done.stderr
    assert same_run(reference[0], run_dir)
