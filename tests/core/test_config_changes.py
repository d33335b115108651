"""Which config fields a resumed run may change (genforge.core.config.config_changes; issue 35 item 5)."""

import re
from pathlib import Path

import pytest

from genforge.app.config import load_config
from genforge.core.config import EvalConfig, OnResume, StrictModel, TrainConfig, config_changes, on_resume
from genforge.masked.config import MaskedTokenConfig


def _changes(preset, old, new):
    return {c.field: (c.old, c.new, c.allowed) for c in config_changes(load_config(preset, old),
                                                                       load_config(preset, new))}


def test_an_unchanged_config_has_no_changes():
    assert _changes("dit-debug", [], []) == {}


@pytest.mark.parametrize("preset, override, field", [
    ("dit-debug", "train.steps=99", "train.steps"),
    ("dit-debug", "train.lr=3e-4", "train.lr"),
    ("dit-debug", "train.lr_schedule=cosine", "train.lr_schedule"),
    ("dit-debug", "train.checkpoint_every=7", "train.checkpoint_every"),
    ("dit-debug", "train.phases.main.lr=3e-4", "train.phases.main"),  # a section new in this config
    ("dit-debug", "eval.every=5", "eval.every"),
    ("dit-debug", "log.tensorboard=true", "log.tensorboard"),
    ("dit-debug", "data.num_workers=1", "data.num_workers"),
    ("dit-debug", "model.diffusion.sample_steps=7", "model.diffusion.sample_steps"),
    ("dit-debug", "model.diffusion.cfg_scale=2.5", "model.diffusion.cfg_scale"),
    ("maskgit-debug", "model.critic.depth=1", "model.critic"),  # a critic added to a trained generator
    ("maskgit-debug", "model.train_phases=[main]", "model.train_phases"),
    ("dalle2-decoder-debug", "model.stages.1.diffusion.sample_steps=3", "model.stages.1.diffusion.sample_steps"),
    ("dalle2-decoder-debug", "model.train_unets=[2]", "model.train_unets"),
])
def test_what_only_acts_from_the_resumed_step_on_may_change(preset, override, field):
    changes = _changes(preset, [], [override])
    assert list(changes) == [field] and changes[field][2], changes


@pytest.mark.parametrize("preset, override, field", [
    ("dit-debug", "model.backbone.depth=3", "model.backbone.depth"),
    ("dit-debug", "model.diffusion.noise_schedule=cosine", "model.diffusion.noise_schedule"),
    ("dit-debug", "train.batch_size=4", "train.batch_size"),
    ("dit-debug", "train.seed=1", "train.seed"),
    ("dit-debug", "data.image_size=32", "data.image_size"),
    ("dit-debug", "data.source=folder", "data.source"),
    ("dalle2-decoder-debug", "model.stages.1.unet.dim=32", "model.stages.1.unet.dim"),
])
def test_what_defines_the_trained_state_may_not(preset, override, field):
    overrides = [override, "data.path=/nowhere"] if override == "data.source=folder" else [override]
    changes = _changes(preset, [], overrides)
    assert field in changes and not changes[field][2], changes


def test_a_critic_once_there_keeps_its_shape_but_not_its_decoding_settings():
    changes = _changes("maskgit-debug", ["model.critic.depth=1"], ["model.critic.depth=2", "model.critic.noise=0.5"])
    assert changes == {"model.critic.depth": (1, 2, False), "model.critic.noise": (1.0, 0.5, True)}
    removed = _changes("maskgit-debug", ["model.critic.depth=1"], [])
    assert list(removed) == ["model.critic"] and not removed["model.critic"][2]  # its trained weights would be lost


def test_the_rule_is_the_fields_marker_or_the_sections():
    assert on_resume(TrainConfig, "lr") is OnResume.CHANGE and on_resume(TrainConfig, "batch_size") is None
    assert on_resume(MaskedTokenConfig, "critic") is OnResume.ADD
    assert on_resume(EvalConfig, "n") is OnResume.CHANGE  # every field of eval


def test_another_family_is_refused_field_by_field():
    changes = config_changes(load_config("dit-debug"), load_config("maskgit-debug"))
    assert ("model.family", "diffusion", "maskgit") in [(c.field, c.old, c.new) for c in changes if not c.allowed]
    assert next(str(c) for c in changes if c.field == "model.family") == "model.family: 'diffusion' -> 'maskgit'"


def test_the_docs_list_every_field_a_resume_may_change():
    docs = (Path(__file__).parents[2] / "docs" / "fault-tolerance.md").read_text()
    section = docs.split("## Resuming with a changed config")[1].split("\n## ")[0]

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    load_config("dit-debug")  # every family registered
    named = {name for cls in subclasses(StrictModel) if cls.every_field_on_resume is None
             for name in cls.model_fields if on_resume(cls, name) is not None}
    listed = set(re.findall(r"`(?:[\w.]+\.)?(\w+)(?:\.\*)?`", section))
    assert named and named <= listed, sorted(named - listed)
