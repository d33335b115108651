"""Adding a family is adding a folder: the toy family of tests/app/toy_family registers itself on import and then
trains, resumes and samples through the unchanged engine and CLI, and `genforge presets` lists its preset."""

import importlib
import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.cli import app
from genforge.core.registry import FAMILIES

runner = CliRunner()


@pytest.fixture
def toy():
    module = importlib.import_module("app.toy_family")  # registers the family on first import
    if "toy" not in FAMILIES:  # unregistered by an earlier test: register it again
        importlib.reload(module)
    yield
    FAMILIES.unregister("toy")


def test_a_family_in_its_own_folder_trains_resumes_and_samples(toy, tmp_path):
    assert "toy-debug" in runner.invoke(app, ["presets"]).output
    assert load_config("toy-debug").model.family == "toy"

    straight = runner.invoke(app, ["train", "toy-debug", "--run-dir", str(tmp_path / "straight")])
    assert straight.exit_code == 0, straight.output
    make_trainer(load_config("toy-debug"), tmp_path / "resumed").fit(stop_at=2)
    resumed = runner.invoke(app, ["train", "toy-debug", "--run-dir", str(tmp_path / "resumed")])
    assert resumed.exit_code == 0, resumed.output

    def final(run):
        ckpt = tmp_path / run / "checkpoints" / "step-000004"
        return load_file(str(ckpt / "model.safetensors")), [
            {k: v for k, v in json.loads(line).items() if k not in ("time", "samples_per_s")}
            for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    (weights_a, logs_a), (weights_b, logs_b) = final("straight"), final("resumed")
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a) and logs_a == logs_b
    assert (tmp_path / "straight" / "samples" / "step-000004.png").is_file()

    sampled = runner.invoke(app, ["sample", str(tmp_path / "straight"), "--n", "4", "--out", str(tmp_path / "s.png")])
    assert sampled.exit_code == 0, sampled.output
    assert (tmp_path / "s.png").is_file()


def test_a_family_declares_its_own_sampling_option(toy, tmp_path):
    """The toy's `noise_scale` (ToySampleOptions, in its folder only) is a flag of `genforge sample RUN --help`,
    is validated (exit 2 naming it) and reaches its task; other families' flags are refused naming the family."""
    run = tmp_path / "toy"
    assert runner.invoke(app, ["train", "toy-debug", "--run-dir", str(run)]).exit_code == 0
    shown = runner.invoke(app, ["sample", str(run), "--help"])
    assert shown.exit_code == 0 and "Options of 'toy' models" in shown.output and "--noise-scale" in shown.output
    assert "--story" not in shown.output  # phenaki's, not the toy's
    outputs = {}
    for name, extra in [("default", []), ("scaled", ["--noise-scale", "0.01"]), ("again", ["--noise-scale=0.01"])]:
        done = runner.invoke(app, ["sample", str(run), "--n", "2", "--out", str(tmp_path / f"{name}.png"), *extra])
        assert done.exit_code == 0, done.output
        outputs[name] = (tmp_path / f"{name}.png").read_bytes()
    assert outputs["scaled"] != outputs["default"] and outputs["scaled"] == outputs["again"]
    bad = runner.invoke(app, ["sample", str(run), "--noise-scale", "-1"])
    assert bad.exit_code == 2 and "--noise-scale" in bad.output and "greater than 0" in bad.output
    foreign = runner.invoke(app, ["sample", str(run), "--frames", "9"])
    assert foreign.exit_code == 2 and "--frames does not apply to a 'toy' model" in foreign.output


def test_an_unregistered_family_is_a_clear_config_error(tmp_path):
    out = runner.invoke(app, ["train", "dit-debug", "--set", "model.family=toy", "--dry-run"])
    assert out.exit_code == 2 and "'toy' is not a family" in out.output
