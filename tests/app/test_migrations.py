"""Configs of older schemas load through genforge.app.migrations: every run's config.yaml says its schema_version."""

from pathlib import Path

import pytest
import yaml

from genforge.app.config import ConfigError, list_presets, load_config, preset_files, to_yaml
from genforge.app.migrations import MIGRATIONS, SCHEMA_VERSION, migrate

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_a_written_config_starts_with_its_schema_version():
    text = to_yaml(load_config("dit-debug"))
    assert text.startswith(f"schema_version: {SCHEMA_VERSION}\n") and SCHEMA_VERSION == len(MIGRATIONS)


def test_a_config_without_a_version_goes_through_every_step():
    raw = {"model": {"family": "dit", "gan": {"r1_weight": 2.0, "r1_every": 3}}}
    migrated = migrate(raw)
    assert migrated["schema_version"] == SCHEMA_VERSION and migrated["model"]["family"] == "diffusion"
    assert migrated["model"]["gan"] == {"penalty": "r1", "penalty_weight": 2.0, "penalty_every": 3}
    assert raw["model"]["family"] == "dit"  # the caller's mapping is left as it was


@pytest.mark.parametrize("loss", ["all", "frame"])
def test_phenakis_removed_frame_order_loss_is_dropped_and_a_changed_one_said(loss, status):
    migrated = migrate({"model": {"family": "phenaki", "frame_order_prob": 0.5, "frame_order_loss": loss}})
    assert migrated["model"] == {"family": "phenaki", "frame_order_prob": 0.5}
    assert ("model.frame_order_loss was removed" in status.text) == (loss == "frame")


def test_a_current_version_is_not_migrated_again():
    raw = {"schema_version": SCHEMA_VERSION, "model": {"family": "dvae", "anneal_rate": 1e-6}}
    assert "temperature_schedule" not in migrate(raw)["model"]


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, -1, "2", True])
def test_an_unknown_version_is_refused(version):
    with pytest.raises(ValueError, match="schema_version"):
        migrate({"schema_version": version, "model": {"family": "diffusion"}})
    with pytest.raises(ConfigError, match="schema_version"):
        load_config("dit-debug", [f"schema_version={version!r}"])


@pytest.mark.parametrize("preset", sorted(list_presets()))
def test_the_steps_leave_todays_spelling_as_it_is(preset):
    raw = yaml.safe_load(preset_files()[preset].read_text())
    assert raw["schema_version"] == SCHEMA_VERSION  # a preset is written in today's schema: no step runs on it
    resolved = yaml.safe_load(to_yaml(load_config(preset)))
    assert migrate({k: v for k, v in raw.items() if k != "schema_version"}) == raw
    del resolved["schema_version"]  # read as version 0: every step runs, none applies
    assert migrate(resolved) == {**resolved, "schema_version": SCHEMA_VERSION}


@pytest.mark.parametrize("run", sorted(str(p.parent.relative_to(FIXTURES)) for p in FIXTURES.glob("*/*/config.yaml")))
def test_old_runs_load_and_write_todays_version(run, tmp_path):
    cfg = load_config(str(FIXTURES / run / "config.yaml"))
    assert cfg.schema_version == SCHEMA_VERSION
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    assert load_config(str(tmp_path / "config.yaml")) == cfg


def test_the_flat_dit_keys_and_model_unet_move_into_the_backbone_section():
    flat = {"family": "diffusion", "backbone": "dit", "unet": {"dim": 8}, "size": "S/4", "depth": 2,
            "hidden_size": None, "mlp_ratio": 2.0}
    assert migrate({"model": flat})["model"] == {
        "family": "diffusion", "backbone": {"kind": "dit", "size": "S/4", "depth": 2, "hidden_size": None,
                                            "mlp_ratio": 2.0}}  # the U-Net's keys, ignored then, dropped
    unet = {"family": "diffusion", "backbone": "unet", "unet": {"dim": 8}, "size": "S/2", "depth": None}
    assert migrate({"model": unet})["model"] == {"family": "diffusion", "backbone": {"kind": "unet", "dim": 8}}
    assert migrate({"model": {"family": "diffusion", "size": "B/4"}})["model"]["backbone"] == {"kind": "dit",
                                                                                               "size": "B/4"}
    assert migrate({"model": {"family": "diffusion", "backbone": "unet"}})["model"]["backbone"] == {"kind": "unet"}


def test_an_old_key_set_on_todays_spelling_sets_that_key_of_the_backbone():
    cfg = load_config("dit-debug", ["model.depth=3", "model.mlp_ratio=2"])
    assert cfg.model.backbone.dims()["depth"] == 3 and cfg.model.backbone.mlp_ratio == 2
    assert load_config("unet-shapes", ["model.unet.dim=16"]).model.backbone.dim == 16
    assert load_config("dit-debug", ["model.backbone=unet", "model.unet.dim=16"]).model.backbone.dim == 16
    with pytest.raises(ConfigError, match="model.unet sets the unet backbone's keys, but model.backbone.kind is dit"):
        load_config("dit-debug", ["model.unet.dim=16"])


@pytest.mark.parametrize("adaptive, weight", [(True, "adaptive"), (False, "fixed")])
def test_the_former_gan_adaptive_flag_is_the_adversarial_weight_choice(adaptive, weight):
    """7: model.gan.adaptive true / false (before adversarial_weight) is adversarial_weight adaptive / fixed: the old
    runs (cvivit's and vqgan's fixtures say adaptive: true) keep taming's adaptive weight."""
    migrated = migrate({"model": {"family": "vqgan", "gan": {"weight": 0.1, "adaptive": adaptive}}})
    assert migrated["model"]["gan"] == {"weight": 0.1, "adversarial_weight": weight}
    for run in ("cvivit", "vqgan"):
        assert yaml.safe_load((FIXTURES / "runs-3f8e24e" / run / "config.yaml").read_text())["model"]["gan"]["adaptive"]
        assert load_config(str(FIXTURES / "runs-3f8e24e" / run / "config.yaml")).model.gan.adversarial_weight == \
            "adaptive"
    with pytest.raises(ValueError, match="set adversarial_weight alone"):
        migrate({"model": {"family": "vqgan", "gan": {"adaptive": adaptive, "adversarial_weight": weight}}})
