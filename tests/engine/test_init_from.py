"""train.init_from: a fresh run starts from another run's model and EMA weights (fine-tuning), with a fresh optimizer,
step 0 and a strict fit; a resume ignores it. Tiny dit-debug runs of a few seconds each."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.core.config import ConfigError
from genforge.engine.verify import read_weights
from genforge.engine.trainer import Trainer

HERE = Path(__file__).parent
QUICK = ["train.sample_every=0", "train.num_samples=1"]  # a one-image preview at the end only


def _trainer(run_dir, overrides=()):
    return make_trainer(load_config("dit-debug", [*QUICK, *overrides]), run_dir)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """dit-debug trained 2 steps (its one checkpoint: step-000002), and the same under train.sharding=fsdp on one
    process (a sharded checkpoint, shards/)."""
    root = tmp_path_factory.mktemp("source")
    _trainer(root / "run", ["train.steps=2"]).fit()
    _trainer(root / "sharded", ["train.steps=2", "train.sharding=fsdp"]).fit()
    return root


@pytest.fixture
def no_steps(monkeypatch):
    """Trainer.fit builds, loads and logs, but trains no step: what a run starts with."""
    monkeypatch.setattr(Trainer, "_loop", lambda self, stop, stop_at: None)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def _checkpoint(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


@pytest.mark.parametrize("where", ["run", "checkpoint", "sharded"])
def test_a_fresh_run_starts_from_the_weights_and_ema_with_a_fresh_optimizer(source, tmp_path, no_steps, status, where):
    """A run directory, one checkpoint folder, or a sharded run's directory: the model and EMA weights are the
    checkpoint's, the step, optimizer and schedule are fresh."""
    path = {"run": source / "run", "checkpoint": _checkpoint(source / "run", 2), "sharded": source / "sharded"}[where]
    checkpoint = _checkpoint(path, 2) if where != "checkpoint" else path
    trainer = _trainer(tmp_path / "ft", [f"train.init_from={path}", "train.steps=4"])
    trainer.fit()
    model, ema = read_weights(checkpoint, "model"), read_weights(checkpoint, "ema")
    assert not _equal(model, ema)  # two steps of EMA warm-up: they differ, so each is checked for itself
    assert _equal(trainer.task.state_dict(), model)
    assert _equal(trainer.state.ema.state_dict(), ema)
    assert trainer.state.step == 0 and trainer.state.data_position == 0
    assert all(not optimizer.state for optimizer in trainer.state.optimizers.values())  # no moments, no step count
    assert trainer.state.schedulers["main"].last_epoch == 0
    assert f"initialised from {checkpoint} (step 2)" in status.messages
    events = [json.loads(line) for line in open(tmp_path / "ft" / "metrics.jsonl")]
    assert [(e["step"], e["event"]) for e in events if "event" in e] == [(0, "init_from")]
    assert f"init_from: {path}\n" in (tmp_path / "ft" / "config.yaml").read_text()  # as written


def test_it_trains_on_from_there_and_a_resume_ignores_it(source, tmp_path, monkeypatch):
    """The fine-tuned run trains from step 0 and writes its own checkpoints; the same command again resumes from
    them, init_from ignored (and a resume may change it: here to a path that does not exist)."""
    command = [f"train.init_from={source / 'run'}", "train.steps=2", "train.log_every=1"]
    trainer = _trainer(tmp_path / "ft", command)
    trainer.fit()
    assert trainer.state.step == 2 and (tmp_path / "ft" / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert all(len(optimizer.state) for optimizer in trainer.state.optimizers.values())
    own = load_file(str(_checkpoint(tmp_path / "ft", 2) / "model.safetensors"))
    own_ema = load_file(str(_checkpoint(tmp_path / "ft", 2) / "ema.safetensors"))
    assert not _equal(own, read_weights(_checkpoint(source / "run", 2), "model"))

    monkeypatch.setattr(Trainer, "_loop", lambda self, stop, stop_at: None)
    for again in (command, [*command[:-1], "train.init_from=/nonexistent/run"]):
        resumed = _trainer(tmp_path / "ft", [*again, "train.steps=3"])
        resumed.fit()
        assert resumed.state.step == 2
        assert _equal(resumed.task.state_dict(), own) and _equal(resumed.state.ema.state_dict(), own_ema)
    events = [json.loads(line) for line in open(tmp_path / "ft" / "metrics.jsonl") if '"event"' in line]
    assert [e["event"] for e in events] == ["init_from", "config_change", "config_change"]


def test_another_model_size_is_refused_naming_the_key_and_shapes(source, tmp_path):
    trainer = _trainer(tmp_path / "big", [f"train.init_from={source / 'run'}", "model.backbone.depth=3",
                                              "model.backbone.hidden_size=96"])
    with pytest.raises(ConfigError) as err:
        trainer.fit()
    message = str(err.value)
    assert message.startswith(f"train.init_from={source / 'run'}: the model weights of ")
    assert "missing: model.blocks.2.adaLN_modulation.1.bias [576]" in message
    assert "model.blocks.0.attn.proj.bias [64] (this model: [96])" in message
    assert not (tmp_path / "big" / "checkpoints" / "latest").exists()
    assert not (tmp_path / "big" / "config.yaml").exists()


def test_no_usable_checkpoint_there_is_refused(source, tmp_path):
    (tmp_path / "empty-run").mkdir()
    damaged = tmp_path / "damaged"
    shutil.copytree(_checkpoint(source / "run", 2), damaged)
    (damaged / "model.safetensors").write_bytes(b"\x00" * 4)  # a torn file
    for path, why in ((tmp_path / "nowhere", "does not exist"), (tmp_path / "empty-run", "no `latest`"),
                      (damaged, "not a readable safetensors file")):
        with pytest.raises(ConfigError, match=re.escape(f"train.init_from={path}: ") + f".*{re.escape(why)}"):
            _trainer(tmp_path / "ft", [f"train.init_from={path}"]).fit()


@pytest.mark.dist  # several processes: make test-dist
@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_every_rank_starts_from_the_same_weights(source, tmp_path, sharding):
    """torchrun with 2 CPU processes, DDP and FSDP2: every rank holds the source's weights at step 0 (the shards of
    them, gathered here)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]), GENFORGE_TEST_FAULT="no_steps")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(HERE / "ddp_worker.py"), str(tmp_path / "ft"), str(tmp_path),
                           f"train.init_from={source / 'run'}", f"train.sharding={sharding}", *QUICK],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    want = {"model": read_weights(_checkpoint(source / "run", 2), "model"),
            "ema": read_weights(_checkpoint(source / "run", 2), "ema")}
    for rank in (0, 1):
        assert _equal(load_file(str(tmp_path / f"rank{rank}-of2.safetensors")), want["model"])
        assert _equal(load_file(str(tmp_path / f"ema-rank{rank}-of2.safetensors")), want["ema"])
