import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from short_clips import short_clip_folder

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.engine.checkpoint import FORMAT_VERSION

HERE = Path(__file__).parent


def _train(run_dir, overrides=(), stop_at=None):
    trainer = make_trainer(load_config("dit-debug", list(overrides)), run_dir)
    trainer.fit(stop_at=stop_at)
    return trainer


def _weights(run_dir, step):
    ckpt = Path(run_dir) / "checkpoints" / f"step-{step:06d}"
    return load_file(str(ckpt / "model.safetensors")), load_file(str(ckpt / "ema.safetensors"))


def _losses(run_dir):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(Path(run_dir) / "metrics.jsonl")) if "loss" in r]


def test_run_directory_layout(tmp_path):
    _train(tmp_path)
    assert (tmp_path / "config.yaml").is_file()
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000006"
    ckpt = tmp_path / "checkpoints" / "step-000006"
    for name in ("model.safetensors", "ema.safetensors", "optim/main.json", "optim/main.safetensors",
                 "trainer_state.json", "rng/rank-0.json"):
        assert (ckpt / name).is_file(), name
    saved = json.loads((ckpt / "trainer_state.json").read_text())
    assert saved["step"] == 6 and saved["format_version"] == FORMAT_VERSION
    assert sorted(p.name for p in (tmp_path / "samples").glob("*.png")) == ["step-000003.png", "step-000006.png"]
    records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in records] == [2, 4, 6]
    assert all({"loss", "lr", "samples_per_s", "grad_norm"} <= set(r) for r in records)
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_resume_is_bit_identical(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    per_step = ["train.log_every=1"]
    _train(straight, per_step)
    _train(resumed, per_step, stop_at=3)  # "killed" after the step-3 checkpoint
    assert (resumed / "checkpoints" / "latest").read_text().strip() == "step-000003"
    _train(resumed, per_step)  # the same command again
    for a, b in zip(_weights(straight, 6), _weights(resumed, 6)):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(straight) == _losses(resumed)


def test_grad_accumulation_matches_full_batch(tmp_path):
    _train(tmp_path / "full")
    _train(tmp_path / "accum", ["train.grad_accum=2"])
    for a, b in zip(_weights(tmp_path / "full", 6), _weights(tmp_path / "accum", 6)):
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_fresh_starts_a_new_run_directory(tmp_path):
    _train(tmp_path / "run", ["train.steps=3"])
    trainer = make_trainer(load_config("dit-debug", ["train.steps=3"]), tmp_path / "run", fresh=True)
    assert trainer.run_dir == tmp_path / "run-1"


@pytest.mark.dist  # several processes: make test-dist
def test_two_processes_match_one(tmp_path):
    """torchrun with 2 CPU processes (gloo): ranks agree, and equal 1 process with the same global batch."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]))
    worker = str(HERE / "ddp_worker.py")
    subprocess.run([sys.executable, worker, str(tmp_path / "one"), str(tmp_path)], env=env, check=True,
                   timeout=300)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                    worker, str(tmp_path / "two"), str(tmp_path)], env=env, check=True, timeout=300)
    one = load_file(str(tmp_path / "rank0-of1.safetensors"))
    r0 = load_file(str(tmp_path / "rank0-of2.safetensors"))
    r1 = load_file(str(tmp_path / "rank1-of2.safetensors"))
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    for k in one:
        torch.testing.assert_close(one[k], r0[k], rtol=1e-4, atol=1e-5)


@pytest.mark.dist  # several processes: make test-dist
def test_two_processes_keep_every_buffer_identical(tmp_path):
    """klvae's running latent variance is a buffer updated from the data: with 2 processes it is all-reduced, so
    both ranks hold the same one (the trainer's consistency check after each checkpoint would stop the run)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]), GENFORGE_TEST_PRESET="klvae-debug")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(HERE / "ddp_worker.py"), str(tmp_path / "run"), str(tmp_path), "train.steps=4",
                           "train.checkpoint_every=2", "train.sample_every=0"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = load_file(str(tmp_path / "rank0-of2.safetensors")), load_file(str(tmp_path / "rank1-of2.safetensors"))
    assert r0.keys() == r1.keys() and all(torch.equal(r0[k], r1[k]) for k in r0)
    assert r0["autoencoder.latent_var_updates"] == 4 and r0["autoencoder.latent_var"] != 1.0


@pytest.mark.dist  # several processes: make test-dist
def test_two_processes_gather_the_frame_masks_of_padded_clips(tmp_path):
    """phenaki divides its loss by the real positions of the whole global batch (its traits' global_fields): 2 processes
    with a padded clip (data.video.min_frames) and 2 accumulation steps gather every micro-batch's frame masks in
    the global batch's order and train as 1 process does."""
    data = short_clip_folder(tmp_path / "clips", n=3)  # 4 clips, one of 3 frames: in every batch of 4
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]), GENFORGE_TEST_PRESET="phenaki-debug")
    settings = ["data.source=video_folder", f"data.path={data}", "data.video.min_frames=2", "train.steps=2",
                "train.grad_accum=2", "train.checkpoint_every=2", "train.sample_every=0"]
    worker = str(HERE / "ddp_worker.py")
    for command in ([sys.executable, worker], [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                               "--nproc_per_node", "2", worker]):
        done = subprocess.run([*command, str(tmp_path / f"run{len(command)}"), str(tmp_path), *settings], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    one = load_file(str(tmp_path / "rank0-of1.safetensors"))
    r0, r1 = load_file(str(tmp_path / "rank0-of2.safetensors")), load_file(str(tmp_path / "rank1-of2.safetensors"))
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    for k in one:
        torch.testing.assert_close(one[k], r0[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.dist  # several processes: make test-dist
def test_ranks_that_drift_apart_are_named_at_the_checkpoint(tmp_path):
    """Rank 1 nudges one weight at step 1: the checkpoint at step 2 is followed by a TrainingError naming it."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]), GENFORGE_TEST_FAULT="diverge")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(HERE / "ddp_worker.py"), str(tmp_path / "run"), str(tmp_path), "train.steps=4",
                           "train.checkpoint_every=2", "train.sample_every=0"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "rank 1 holds another ema.final_layer.linear.bias than rank 0" in done.stderr, done.stderr[-3000:]


def test_evaluation_during_training(tmp_path):
    _train(tmp_path, ["eval.every=3", "eval.n=4", "train.steps=3"])
    result = json.loads((tmp_path / "eval" / "3.json").read_text())
    assert result["step"] == 3 and result["n"] == 4 and 0.0 <= result["judge_accuracy"] <= 1.0
    logged = [r for r in map(json.loads, open(tmp_path / "metrics.jsonl")) if "eval/judge_accuracy" in r]
    assert [r["step"] for r in logged] == [3]


@pytest.mark.dist  # several processes: make test-dist
@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_dead_or_hung_rank_ends_the_run(tmp_path, fault):
    """Rank 1 dies (SIGKILL) or hangs at step 3: the run exits non-zero within 60 s, naming the rank."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]), GENFORGE_TEST_FAULT=fault)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(HERE / "ddp_worker.py"), str(tmp_path / "run"), str(tmp_path),
                           "train.dist_timeout_s=10", "train.steps=20"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and time.monotonic() - start < 60
    if fault == "hang":  # rank 0 gave up on its own, after the collective timeout, and says who it is
        assert "rank 0: a collective operation failed" in done.stderr, done.stderr[-3000:]


@pytest.mark.dist  # several processes: make test-dist
def test_sigterm_to_torchrun_checkpoints_on_every_rank(tmp_path):
    """torchrun forwards SIGTERM: both ranks agree, finish the step, write one checkpoint and exit."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(HERE / "ddp_worker.py"), str(run_dir), str(tmp_path), "train.steps=500",
                             "train.checkpoint_every=0", "train.log_every=1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    step = json.loads((run_dir / "checkpoints" / latest / "trainer_state.json").read_text())["step"]
    assert 2 <= step < 500 and "stopped by SIGTERM" in err, err[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints" / latest / "rng").glob("*.json")) == [
        "rank-0.json", "rank-1.json"]
