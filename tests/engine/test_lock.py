"""One trainer per run directory (genforge.engine.lock): a second `genforge train` on a directory another process is
training into exits 2 naming the holder and touches nothing; a lock left by a killed process never blocks; --fresh
picks a new directory; sample/eval read without the lock."""

import json
import os
import signal
import subprocess
import sys
import time

from typer.testing import CliRunner

from genforge.cli import app
from genforge.engine.lock import LOCK_FILE, RunDirectoryLocked, RunLock, is_locked

runner = CliRunner()
TINY = ["--set", "train.steps=2", "--set", "train.checkpoint_every=2", "--set", "train.sample_every=0"]


def test_a_second_trainer_exits_2_naming_the_holder_and_leaves_the_run_untouched(tmp_path):
    run = tmp_path / "run"
    assert runner.invoke(app, ["train", "dit-debug", "--run-dir", str(run), *TINY]).exit_code == 0
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != LOCK_FILE}
    held = RunLock.acquire(run)  # another trainer, as far as the CLI can tell
    try:
        out = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(run), "--set", "train.steps=4"])
        assert out.exit_code == 2 and "is in use by another `genforge train`" in out.output
        assert f"pid {os.getpid()}" in out.output
        after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != LOCK_FILE}
        assert after == before  # no config.yaml rewritten, no metrics, no checkpoint
        sampled = runner.invoke(app, ["sample", str(run), "--n", "2", "--out", str(tmp_path / "s.png")])
        assert sampled.exit_code == 0, sampled.output  # readers take no lock
        fresh = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(run), "--fresh", *TINY])
        assert fresh.exit_code == 0 and (tmp_path / "run-1" / "checkpoints" / "latest").is_file()
    finally:
        held.release()
    assert not is_locked(run)
    resumed = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(run), "--set", "train.steps=4",
                                  "--set", "train.checkpoint_every=2", "--set", "train.sample_every=0"])
    assert resumed.exit_code == 0, resumed.output


def test_two_real_processes_and_a_killed_holder(tmp_path):
    """A training process holds the lock; a second process is refused (exit 2, the holder's pid), the first's
    metrics stay monotonic; after kill -9 of the first the lock is free and the run resumes."""
    run = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    first = subprocess.Popen([sys.executable, "-m", "genforge", "train", "dit-debug", "--run-dir", str(run),
                              "--set", "train.steps=100000", "--set", "train.checkpoint_every=5",
                              "--set", "train.sample_every=0", "--set", "train.log_every=1"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoints" / "latest").is_file():
            assert time.monotonic() < deadline and first.poll() is None, "the first trainer did not start"
            time.sleep(0.2)
        assert is_locked(run)
        second = subprocess.run([sys.executable, "-m", "genforge", "train", "dit-debug", "--run-dir", str(run)],
                                env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and f"pid {first.pid}" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert steps == sorted(steps) and len(steps) == len(set(steps))
    assert not is_locked(run)  # the kernel released the killed process's lock
    resumed = subprocess.run([sys.executable, "-m", "genforge", "train", "dit-debug", "--run-dir", str(run),
                              "--set", "train.steps=6", "--set", "train.checkpoint_every=3",
                              "--set", "train.sample_every=0"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr


def test_the_lock_refuses_a_second_holder_in_the_same_process(tmp_path):
    held = RunLock.acquire(tmp_path / "run")
    try:
        try:
            RunLock.acquire(tmp_path / "run")
            raise AssertionError("a second holder got the lock")
        except RunDirectoryLocked as err:
            assert f"pid {os.getpid()}" in str(err)
    finally:
        held.release()
    RunLock.acquire(tmp_path / "run").release()
