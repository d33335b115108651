"""Resuming with a changed config (issue 35 item 5): what may change takes effect from the resumed step and is
recorded; anything else is refused before the checkpoint is touched, naming each field with its old and new value."""

import json
import shutil

import pytest
import torch
import yaml

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.core.config import ConfigError
from genforge.engine.optim import lr_factor

BASE = ["train.steps=2", "train.checkpoint_every=2", "train.sample_every=0", "train.log_every=1",
        "train.ema_decay=0.9"]


def _fit(run_dir, overrides=()):
    trainer = make_trainer(load_config("dit-debug", BASE + list(overrides)), run_dir)
    trainer.fit()
    return trainer


def _files(run_dir):
    """Every file of a run and its bytes, but the lock (which names its last holder)."""
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}


def _logged_lr(run_dir):
    return {r["step"]: r["lr"] for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "lr" in r}


def test_a_changed_lr_takes_effect_and_is_recorded(tmp_path):
    _fit(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    same = _fit(tmp_path / "a", ["train.steps=4"])
    changed = _fit(tmp_path / "b", ["train.steps=4", "train.lr=3e-4"])
    assert [g["lr"] for g in changed.state.optimizers["main"].param_groups] == [3e-4] * 2
    assert _logged_lr(tmp_path / "b")[3] == pytest.approx(3e-4) and _logged_lr(tmp_path / "a")[3] == 1e-3
    assert not torch.equal(same.task.state_dict()["model.final_layer.linear.weight"],
                           changed.task.state_dict()["model.final_layer.linear.weight"])
    history = [json.loads(line) for line in open(tmp_path / "b" / "config-history.jsonl")]
    assert history == [{"step": 2, "time": history[0]["time"],
                        "changes": [{"field": "train.lr", "old": 1e-3, "new": 3e-4},
                                    {"field": "train.steps", "old": 2, "new": 4}]}]
    events = [r for r in map(json.loads, open(tmp_path / "b" / "metrics.jsonl")) if r.get("event") == "config_change"]
    assert events[0]["step"] == 2 and "train.lr: 0.001 -> 0.0003" in events[0]["message"]
    assert yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())["train"]["lr"] == 3e-4


def test_a_longer_cosine_schedule_continues_from_the_resumed_step(tmp_path):
    cosine = ["train.lr_schedule=cosine", "train.warmup_steps=1"]
    _fit(tmp_path, cosine)
    _fit(tmp_path, [*cosine, "train.steps=6"])
    new = load_config("dit-debug", BASE + [*cosine, "train.steps=6"]).train
    logged = _logged_lr(tmp_path)
    assert [logged[s] for s in (3, 4, 5)] == pytest.approx([1e-3 * lr_factor(s, new) for s in (3, 4, 5)], rel=1e-6)


def test_a_changed_model_or_batch_is_refused_naming_each_field(tmp_path):
    _fit(tmp_path)
    before = _files(tmp_path)
    with pytest.raises(ConfigError) as refused:
        make_trainer(load_config("dit-debug", BASE + ["model.backbone.depth=3", "train.batch_size=4", "train.steps=4"]),
                     tmp_path).fit()
    message = str(refused.value)
    assert "model.backbone.depth: 2 -> 3" in message and "train.batch_size: 8 -> 4" in message and "--fresh" in message
    assert "train.steps" not in message  # allowed, so not listed
    assert _files(tmp_path) == before  # config.yaml, checkpoints and metrics untouched
