"""train.sharding=fsdp on 2 CPU processes (torchrun, gloo): the same training as DDP, exact resume, resume at
another world size, a rank killed while writing its shards, and sampling a sharded run on one process.
Multi-process and slow: `make test-dist` runs them (`pytest -m dist`)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.engine.checkpoint import CheckpointReadError
from genforge.engine.verify import read_weights, sharded_tensors, verify_checkpoint

pytestmark = pytest.mark.dist
HERE = Path(__file__).parent
STEPS = ["--set", "train.checkpoint_every=10", "--set", "train.log_every=1", "--set", "train.sample_every=10"]


def _torchrun(nproc: int, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    done = subprocess.run([*launcher, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    return done


def _train(run_dir: Path, preset: str, sharding: str, steps: int, nproc: int = 2, *extra: str) -> str:
    done = _torchrun(nproc, "-m", "genforge", "train", preset, "--run-dir", str(run_dir), "--set",
                     f"train.sharding={sharding}", "--set", f"train.steps={steps}", *STEPS, *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def _losses(run_dir: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [{k: v for k, v in r.items() if k.endswith("loss")} for r in rows if "event" not in r]


@pytest.fixture(scope="module")
def dit_runs(tmp_path_factory):
    """dit-debug for 20 steps on 2 processes, under fsdp and under DDP."""
    root = tmp_path_factory.mktemp("dit")
    for sharding in ("fsdp", "none"):
        _train(root / sharding, "dit-debug", sharding, 20)
    return root


def _relative_gap(a: list[dict[str, float]], b: list[dict[str, float]]) -> list[float]:
    return [max(abs(x[k] - y[k]) / max(abs(y[k]), 1e-12) for k in y) for x, y in zip(a, b, strict=True)]


def test_fsdp_trains_as_ddp_does(dit_runs, tmp_path):
    """Per-step losses of fsdp equal DDP's up to the order of float reductions (1e-5 relative). A GAN tokenizer's
    adversarial game amplifies that rounding (about x3 per step, with or without its gradient penalty): vqgan is held
    to 1e-5 for its first 10 steps and 1e-2 over 20."""
    assert max(_relative_gap(_losses(dit_runs / "fsdp"), _losses(dit_runs / "none"))) < 1e-5
    for preset, early, late in (("maskgit-debug", 1e-5, 1e-5), ("vqgan-debug", 1e-5, 1e-2)):
        for sharding in ("fsdp", "none"):
            _train(tmp_path / f"{preset}-{sharding}", preset, sharding, 20)
        gaps = _relative_gap(_losses(tmp_path / f"{preset}-fsdp"), _losses(tmp_path / f"{preset}-none"))
        assert len(gaps) == 20 and max(gaps[:10]) < early and max(gaps) < late, (preset, gaps)


def test_compiled_blocks_train_under_ddp_and_fsdp(dit_runs, tmp_path):
    """train.compile on 2 processes: the compiled blocks run inside DDP and inside FSDP2's per-block units (their
    hooks outside the compiled forward); the first losses are the eager runs' up to kernel rounding."""
    for sharding in ("none", "fsdp"):
        _train(tmp_path / sharding, "dit-debug", sharding, 4, 2, "--set", "train.compile=true")
        compiled, eager = _losses(tmp_path / sharding), _losses(dit_runs / sharding)[:4]
        assert len(compiled) == 4 and max(_relative_gap(compiled, eager)) < 1e-4


def test_a_sharded_checkpoint_is_written_by_every_rank_and_verifies(dit_runs):
    checkpoint = dit_runs / "fsdp" / "checkpoints" / "step-000020"
    assert sorted(p.name for p in (checkpoint / "shards").iterdir()) == [
        "shard-00001-model-00001-of-00001.safetensors", "shard-00002-model-00001-of-00001.safetensors"]
    assert not (checkpoint / "model.safetensors").exists()
    verify_checkpoint(checkpoint, resume=True)
    names = sharded_tensors(checkpoint / "shards")
    assert "model.model.final_layer.linear.weight" in names and any(n.startswith("optim.main.") for n in names)
    torn = dit_runs / "torn"
    shutil.copytree(checkpoint, torn)
    (torn / "shards" / "shard-00002-model-00001-of-00001.safetensors").unlink()  # one rank's pieces
    with pytest.raises(CheckpointReadError, match="2 processes wrote it: a rank's shard file is missing"):
        verify_checkpoint(torn)


def test_stop_and_resume_equals_a_straight_run_bit_for_bit(dit_runs, tmp_path):
    _train(tmp_path, "dit-debug", "fsdp", 10)
    _train(tmp_path, "dit-debug", "fsdp", 20)
    assert _losses(tmp_path) == _losses(dit_runs / "fsdp")
    for part in ("model", "ema"):
        resumed = read_weights(tmp_path / "checkpoints" / "step-000020", part)
        straight = read_weights(dit_runs / "fsdp" / "checkpoints" / "step-000020", part)
        assert resumed.keys() == straight.keys() and all(torch.equal(resumed[k], straight[k]) for k in resumed)


def test_a_sharded_checkpoint_resumes_on_one_process_and_back_on_two(dit_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(dit_runs / "fsdp", run)
    trainer = make_trainer(load_config("dit-debug", ["train.sharding=fsdp", "train.steps=30", "train.log_every=1",
                                                     "train.checkpoint_every=10", "train.sample_every=10"]), run)
    trainer.fit()  # one process: DCP gathers the two ranks' pieces into whole tensors
    assert trainer.state.step == 30 and (run / "checkpoints" / "latest").read_text().strip() == "step-000030"
    weights = read_weights(dit_runs / "fsdp" / "checkpoints" / "step-000020", "model")
    assert [r["loss"] for r in _losses(run)[:20]] == [r["loss"] for r in _losses(dit_runs / "fsdp")]
    assert not torch.equal(trainer.task.state_dict()["model.final_layer.linear.weight"],
                           weights["model.final_layer.linear.weight"])  # it trained on
    _train(run, "dit-debug", "fsdp", 40)  # and the one-process checkpoint is sharded again over two
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000040"


def test_a_rank_killed_while_writing_its_shards_leaves_the_previous_checkpoint(tmp_path):
    """Rank 1 dies (SIGKILL) inside the write of step 4's shards; torchrun ends the run. The re-run finds
    step-000002, removes the half-written folder, and finishes as a straight run does."""
    worker = str(HERE / "ddp_worker.py")
    settings = ["train.sharding=fsdp", "train.steps=6", "train.checkpoint_every=2", "train.sample_every=0",
                "train.log_every=1", "train.dist_timeout_s=30"]
    killed = _torchrun(2, worker, str(tmp_path / "run"), str(tmp_path / "out"), *settings,
                       env={"GENFORGE_TEST_FAULT": "kill_in_shards"})
    assert killed.returncode != 0
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-000002"
    (tmp_path / "out").mkdir()
    again = _torchrun(2, worker, str(tmp_path / "run"), str(tmp_path / "out"), *settings)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "step-000002 (step 2)" in again.stderr
    (tmp_path / "straight-out").mkdir()
    straight = _torchrun(2, worker, str(tmp_path / "straight"), str(tmp_path / "straight-out"), *settings)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert [r["loss"] for r in _losses(tmp_path / "run")] == [r["loss"] for r in _losses(tmp_path / "straight")]
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "run" / "checkpoints").iterdir())


def test_sampling_a_sharded_run_on_one_process_equals_the_ddp_run(dit_runs, tmp_path):
    outputs = {}
    for sharding in ("fsdp", "none"):
        out = tmp_path / f"{sharding}.png"
        done = subprocess.run([sys.executable, "-m", "genforge", "sample", str(dit_runs / sharding), "--n", "4",
                               "--seed", "3", "--out", str(out)], capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[sharding] = out.read_bytes()
    assert outputs["fsdp"] == outputs["none"]


def test_a_video_generator_with_a_token_critic_trains_previews_and_evaluates_sharded(tmp_path):
    """Two phases (generator, token critic), previews and in-training evaluation (judge and direction, whose
    samples split unevenly over the ranks) under fsdp on 2 processes."""
    _train(tmp_path, "phenaki-debug", "fsdp", 4, 2, "--set", "model.critic.depth=1", "--set", "eval.every=4",
           "--set", "train.checkpoint_every=2", "--set", "train.sample_every=2")
    results = json.loads((tmp_path / "eval" / "4.json").read_text())
    assert {"judge_accuracy", "direction_accuracy"} <= results.keys(), results
    assert (tmp_path / "samples" / "step-000004.gif").exists()
    assert sorted(p.stem for p in (tmp_path / "checkpoints" / "step-000004" / "optim").iterdir()) == ["critic", "main"]


def test_gradient_accumulation_and_bf16_under_fsdp(tmp_path):
    """Micro-batches reduce their gradients once per step (FSDP2's requires_gradient_sync off for all but the
    last), as DDP's no_sync does; bf16 gathers and computes in bf16 and keeps fp32 master weights."""
    for sharding in ("fsdp", "none"):
        _train(tmp_path / sharding, "dit-debug", sharding, 6, 2, "--set", "train.grad_accum=2")
    assert max(_relative_gap(_losses(tmp_path / "fsdp"), _losses(tmp_path / "none"))) < 1e-5
    _train(tmp_path / "bf16", "dit-debug", "fsdp", 4, 2, "--set", "train.precision=bf16")
    losses = [r["loss"] for r in _losses(tmp_path / "bf16")]
    assert len(losses) == 4 and all(0 < loss < 10 for loss in losses)
    weights = read_weights(tmp_path / "bf16" / "checkpoints" / "step-000004", "model")
    assert {t.dtype for t in weights.values()} == {torch.float32}


def test_a_nonfinite_step_on_one_rank_is_skipped_by_all_and_rolls_back(tmp_path):
    """Rank 1's loss is NaN at steps 3 and 4 (once): the sharded gradient norm is NaN on every rank, so every rank
    skips; after train.max_nonfinite_skips=2 all ranks roll back together to the last checkpoint (step-000004,
    written after the skipped step 3) and finish, and the consistency check after each checkpoint finds the
    replicated state equal."""
    settings = ["train.sharding=fsdp", "train.steps=6", "train.checkpoint_every=2", "train.sample_every=0",
                "train.log_every=1", "train.max_nonfinite_skips=2", "train.on_nonfinite=rollback"]
    (tmp_path / "out").mkdir()
    done = _torchrun(2, str(HERE / "ddp_worker.py"), str(tmp_path / "run"), str(tmp_path / "out"), *settings,
                     env={"GENFORGE_TEST_FAULT": "nan_once"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 3: non-finite loss or gradient, step skipped" in done.stderr
    assert "rolled back to step-000004" in done.stderr
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-000006"


def test_power_ema_snapshots_of_a_sharded_run_resume_exactly_and_synthesise(tmp_path):
    """train.ema.kind=power under fsdp: every rank gathers each average for the snapshot the main process writes;
    the sharded checkpoint holds the other average (power_ema.*); a stop at step 3 and a resume write the snapshots
    of steps 2, 4, 6 bit for bit as a straight run (and one of step 3, the end of the first command); `genforge ema`
    synthesises from them on one process."""
    power = ["--set", "train.ema.kind=power", "--set", "train.ema.snapshot_every=2", "--set",
             "train.checkpoint_every=3"]
    _train(tmp_path / "straight", "dit-debug", "fsdp", 6, 2, *power)
    _train(tmp_path / "split", "dit-debug", "fsdp", 3, 2, *power)
    _train(tmp_path / "split", "dit-debug", "fsdp", 6, 2, *power)
    names = sharded_tensors(tmp_path / "straight" / "checkpoints" / "step-000006" / "shards")
    assert any(n.startswith("power_ema.1/blocks.") for n in names)
    snapshots = {run: {p.name: load_file(str(p)) for p in (tmp_path / run / "ema_snapshots").glob("*.safetensors")}
                 for run in ("straight", "split")}
    assert sorted(snapshots["straight"]) == ["step-000002.safetensors", "step-000004.safetensors",
                                             "step-000006.safetensors"]
    assert sorted(snapshots["split"]) == sorted([*snapshots["straight"], "step-000003.safetensors"])
    for name, tensors in snapshots["straight"].items():
        assert all(torch.equal(t, snapshots["split"][name][k]) for k, t in tensors.items())
    done = subprocess.run([sys.executable, "-m", "genforge", "ema", str(tmp_path / "split"), "--sigma-rel", "0.08"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "at step 6, from 4 snapshots" in done.stdout


def test_the_magnitude_preserving_unets_weight_projection_runs_on_each_ranks_shards(tmp_path):
    """model.backbone.magnitude_preserving under fsdp: the forced weight normalisation after each step works on each
    rank's dim-0 shard (whole output channels), so the losses are DDP's and every stored filter is at RMS 1."""
    mp = ["--set", "data.image_size=16", "--set", "model.backbone.dim=16", "--set", "model.backbone.dim_mults=[1,2]",
          "--set", "model.backbone.attention_levels=[1]", "--set", "model.backbone.head_dim=16", "--set",
          "model.backbone.magnitude_preserving=true", "--set", "train.lr=0.1", "--set", "eval.every=0",
          "--set", "train.precision=no"]  # float32: the preset's auto is bf16 on a CPU with it
    for sharding in ("fsdp", "none"):
        _train(tmp_path / sharding, "unet-shapes", sharding, 6, 2, *mp)
    assert max(_relative_gap(_losses(tmp_path / "fsdp"), _losses(tmp_path / "none"))) < 1e-5
    weights = read_weights(tmp_path / "fsdp" / "checkpoints" / "step-000006", "model")
    filters = [w for w in weights.values() if w.ndim >= 2]
    assert filters and all(torch.allclose(w.flatten(1).pow(2).mean(1).sqrt(), torch.ones(len(w)), atol=2e-4)
                           for w in filters)
