"""Exact resume has teeth: every piece of saved state is needed, and non-finite steps change nothing."""

import json
from functools import partialmethod

import pytest
import torch

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.core.config import ConfigError
from genforge.engine.checkpoint import CheckpointError
from genforge.engine.trainer import STATE_PIECES, Trainer, TrainingError
from genforge.families.diffusion.task import DiffusionTask

# warm-up + cosine so the scheduler matters; a checkpoint at step 4 to resume from
OVERRIDES = ["train.steps=8", "train.checkpoint_every=4", "train.log_every=1", "train.sample_every=0",
             "train.warmup_steps=6", "train.lr_schedule=cosine", "train.ema_decay=0.9"]


def _run(run_dir, overrides=(), stop_at=None):
    trainer = make_trainer(load_config("dit-debug", OVERRIDES + list(overrides)), run_dir)
    trainer.fit(stop_at=stop_at)
    return trainer


def _result(trainer):
    losses = [(r["step"], r["loss"]) for r in map(json.loads, open(trainer.run_dir / "metrics.jsonl"))
              if "loss" in r]
    return losses, trainer.task.state_dict(), trainer.state.ema.state_dict()


def _same(a, b) -> bool:
    return a[0] == b[0] and all(torch.equal(a[1][k], b[1][k]) for k in a[1]) and \
        all(torch.equal(a[2][k], b[2][k]) for k in a[2])


def _global_rng_in_loss(monkeypatch):
    """A task that also draws from the global torch RNG, as a family with dropout would."""
    plain = DiffusionTask.loss

    def loss(self, batch, phase, step):
        value, extra = plain(self, batch, phase, step)
        return value * (1 + 0.5 * torch.rand(())), extra

    monkeypatch.setattr(DiffusionTask, "loss", loss)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        _global_rng_in_loss(monkeypatch)
        return _result(_run(tmp_path_factory.mktemp("straight")))


@pytest.mark.parametrize("dropped", [None, *[p for p in STATE_PIECES if p not in ("grad_scaler", "family")]])
def test_resume_needs_every_piece_of_state(straight, tmp_path, monkeypatch, dropped):
    """Uninterrupted vs stop at 4 + resume: identical, and different as soon as one piece is not restored.
    (DiT has no family state; the grad scaler exists only with fp16 on a GPU.)"""
    _global_rng_in_loss(monkeypatch)
    _run(tmp_path, stop_at=4)
    if dropped:
        monkeypatch.setattr(Trainer, "load_checkpoint", partialmethod(Trainer.load_checkpoint, skip={dropped}))
    assert _same(straight, _result(_run(tmp_path))) == (dropped is None)


def _optimizer_state(trainer):
    state = trainer.state.optimizers["main"].state_dict()["state"]
    return {f"{i}.{k}": v.clone() for i, s in state.items() for k, v in s.items() if isinstance(v, torch.Tensor)}


def test_nonfinite_step_is_skipped_and_changes_nothing(tmp_path, monkeypatch, status):
    trainer = make_trainer(load_config("dit-debug", OVERRIDES), tmp_path)
    trainer.fit(stop_at=3)
    before = (_optimizer_state(trainer), trainer.task.state_dict(), trainer.state.ema.state_dict())
    before = tuple({k: v.clone() for k, v in part.items()} for part in before)
    lr_before = trainer.state.schedulers["main"].get_last_lr()
    plain = DiffusionTask.loss
    monkeypatch.setattr(DiffusionTask, "loss", lambda self, batch, phase, step: (
        plain(self, batch, phase, step)[0] * float("nan") if step == 3 else plain(self, batch, phase, step)[0], {}))
    trainer.fit(stop_at=4)
    after = (_optimizer_state(trainer), trainer.task.state_dict(), trainer.state.ema.state_dict())
    for old, new in zip(before, after):
        assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)
    assert trainer.state.schedulers["main"].get_last_lr() == lr_before
    assert trainer.state.step == 4 and "step 3: non-finite loss or gradient, step skipped" in status.text
    logged = [r for r in map(json.loads, open(tmp_path / "metrics.jsonl")) if r["step"] == 4]
    assert logged[0]["grad_norm"] == 0.0


def _always_nan(monkeypatch, from_step):
    plain = DiffusionTask.loss

    def loss(self, batch, phase, step):
        value, extra = plain(self, batch, phase, step)
        return (value * float("nan") if step >= from_step else value), extra

    monkeypatch.setattr(DiffusionTask, "loss", loss)


def test_too_many_nonfinite_steps_stop_the_run(tmp_path, monkeypatch):
    _always_nan(monkeypatch, from_step=5)
    with pytest.raises(TrainingError, match="3 non-finite steps in a row"):
        _run(tmp_path, ["train.max_nonfinite_skips=3"])
    latest = (tmp_path / "checkpoints" / "latest").read_text().strip()
    assert latest == "step-000004"  # nothing non-finite was ever written


def test_rollback_reloads_the_checkpoint_and_skips_the_bad_data(tmp_path, monkeypatch, status):
    plain = DiffusionTask.loss
    seen = []

    def loss(self, batch, phase, step):  # NaN for the batches at data positions 5 and 6, once
        value, extra = plain(self, batch, phase, step)
        seen.append(step)
        return (value * float("nan") if len(seen) in (6, 7) else value), extra

    monkeypatch.setattr(DiffusionTask, "loss", loss)
    trainer = _run(tmp_path, ["train.max_nonfinite_skips=2", "train.on_nonfinite=rollback"])
    assert trainer.state.step == 8 and trainer.state.rollbacks == 1
    assert trainer.state.data_position == 8 + 3  # steps 4, 5 (skipped) and 6 (failed) consumed data once more
    assert "rolled back to step-000004" in status.text
    assert json.loads((tmp_path / "checkpoints" / "step-000008" / "trainer_state.json").read_text())[
        "data_position"] == 11


def test_fp16_without_a_gpu_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="train.precision=fp16 needs a CUDA GPU"):
        make_trainer(load_config("dit-debug", ["train.precision=fp16"]), tmp_path)


def test_a_checkpoint_missing_weights_of_a_trained_phase_is_refused(tmp_path):
    """Only weights of a phase the checkpoint never trained may be absent (they start fresh, e.g. a token critic
    added to a trained generator); weights the checkpoint has but the model does not are an error."""
    base = ["train.steps=2", "train.checkpoint_every=2", "train.sample_every=0", "eval.every=0"]
    make_trainer(load_config("phenaki-debug", [*base, "model.critic.depth=1"]), tmp_path).fit()
    with pytest.raises(ConfigError, match="model.critic: .* -> None"):  # the config says what changed ...
        make_trainer(load_config("phenaki-debug", [*base, "train.steps=4"]), tmp_path).fit()
    (tmp_path / "config.yaml").unlink()  # ... and without it, the checkpoint check
    with pytest.raises(CheckpointError, match="does not match this model.*unexpected \\['model.critic"):
        make_trainer(load_config("phenaki-debug", [*base, "train.steps=4"]), tmp_path).fit()
