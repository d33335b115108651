"""`genforge ema RUN` end to end on a tiny train.ema.kind=power run: synthesise and select an EMA that sample and
load_run then use, go back to the trained EMA, sweep widths by a metric, and refuse bad input (exit 2 naming it)."""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from typer.testing import CliRunner

import genforge
from genforge.app.config import load_config
from genforge.app.ema import best_width, synthesize_ema
from genforge.app.runs import load_run, make_trainer
from genforge.cli import app
from genforge.engine.phema import SnapshotDir, synthesize

runner = CliRunner()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """dit-debug for 6 steps with power-function EMAs (σ_rel 0.05, 0.10), snapshots at steps 2, 4, 6."""
    run = tmp_path_factory.mktemp("power") / "run"
    make_trainer(load_config("dit-debug", ["train.ema.kind=power", "train.ema.snapshot_every=2",
                                           "train.sample_every=0", "eval.every=0"]), run).fit()
    return run


@pytest.fixture
def run(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def _ema_params(run_dir, **kwargs):
    return {k: v.detach().clone() for k, v in load_run(run_dir, "cpu", **kwargs).task.ema_module().named_parameters()}


def _grid(run_dir, path):
    out = runner.invoke(app, ["sample", str(run_dir), "--n", "4", "--label", "3", "--out", str(path)])
    assert out.exit_code == 0, out.output
    return torch.from_numpy(np.asarray(Image.open(path))).float()


def test_synthesise_select_sample_and_back(run, tmp_path):
    trained_ema = load_file(str(run / "checkpoints" / "step-000006" / "ema.safetensors"))
    trained_grid = _grid(run, tmp_path / "trained.png")
    out = runner.invoke(app, ["ema", str(run), "--sigma-rel", "0.08"])
    assert out.exit_code == 0, out.output
    assert "synthesised the EMA of sigma_rel 0.08 (gamma 9.452) at step 6, from 3 snapshots" in out.stdout
    written = run / "ema_synthesized" / "sigma_rel-0.0800.safetensors"
    assert f"wrote {written}" in out.stdout
    expected, _ = synthesize(SnapshotDir(run / "ema_snapshots").snapshots(), 0.08)
    weights = load_file(str(written))
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in weights)
    assert not all(torch.equal(weights[k], trained_ema[k]) for k in weights)  # another average than the trained one
    opened = _ema_params(run)
    assert all(torch.equal(opened[k], weights[k]) for k in weights)  # what load_run, sample, eval, export use
    synthesized_grid = _grid(run, tmp_path / "synthesized.png")
    assert not torch.equal(synthesized_grid, trained_grid)

    out = runner.invoke(app, ["ema", str(run), "--trained"])
    assert out.exit_code == 0 and "use the checkpoint's trained EMA" in out.stdout
    opened = _ema_params(run)
    assert all(torch.equal(opened[k], trained_ema[k]) for k in trained_ema)
    assert torch.equal(_grid(run, tmp_path / "again.png"), trained_grid)
    assert written.is_file()  # kept: --sigma-rel selects it again


def test_a_selection_of_an_older_checkpoint_is_not_used(run):
    """Training went on since the EMA was synthesised: load_run warns and uses the newest checkpoint's EMA."""
    assert runner.invoke(app, ["ema", str(run), "--sigma-rel", "0.08"]).exit_code == 0
    marker = run / "ema_synthesized" / "selected"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "checkpoint": "step-000003"}))
    trained_ema = load_file(str(run / "checkpoints" / "step-000006" / "ema.safetensors"))
    opened = _ema_params(run)
    assert all(torch.equal(opened[k], trained_ema[k]) for k in trained_ema)


def test_the_python_api_synthesises_as_the_cli_does(run):
    opened = genforge.load_run(run, "cpu")
    ema = opened.synthesize_ema(0.07)
    assert ema.step == 6 and ema.snapshots == 3 and ema.path is None
    params = dict(opened.task.ema_module().named_parameters())
    assert all(torch.equal(params[k].detach(), v) for k, v in ema.weights.items())
    assert not (run / "ema_synthesized").exists()  # not written unless asked
    opened.synthesize_ema(0.07, write=True)
    assert (run / "ema_synthesized" / "sigma_rel-0.0700.safetensors").is_file()
    again = _ema_params(run)
    assert all(torch.equal(again[k], v) for k, v in ema.weights.items())


def test_a_sweep_scores_each_width_and_reports_the_best(run):
    out = runner.invoke(app, ["ema", str(run), "--sweep", "0.05,0.1,0.15", "--metric", "judge", "--n", "8"])
    assert out.exit_code == 0, out.output
    record = json.loads((run / "ema_synthesized" / "sweep-judge.json").read_text())
    assert [w["sigma_rel"] for w in record["widths"]] == [0.05, 0.1, 0.15] and record["n"] == 8
    values = [w["value"] for w in record["widths"]]
    assert record["best"] == record["widths"][values.index(max(values))]["sigma_rel"]
    assert "judge_accuracy (higher is better)" in out.stdout
    assert f"best: sigma_rel {record['best']:g}" in out.stdout
    assert not (run / "ema_synthesized" / "selected").exists()  # a sweep selects nothing


def test_best_width_follows_the_metrics_direction(run):
    loaded = load_run(run, "meta", synthesized=False)
    a, b = synthesize_ema(loaded, run, 0.05), synthesize_ema(loaded, run, 0.1)
    assert best_width("fid", [(a, 3.0, {}), (b, 2.0, {})])[0] is b  # lower is better
    assert best_width("judge", [(a, 0.3, {}), (b, 0.2, {})])[0] is a


@pytest.mark.parametrize("args, says", [
    (["--sigma-rel", "0.5"], "--sigma-rel 0.5: must be in (0, 0.2887)"),
    (["--sigma-rel", "0"], "--sigma-rel 0.0: must be in"),
    (["--sweep", "0.05,abc"], "--sweep '0.05,abc': comma-separated numbers"),
    (["--sweep", "0.05,0.4"], "--sweep 0.4: must be in"),
    (["--sweep", "0.05", "--metric", "nope"], "--metric 'nope': allowed"),
    (["--sigma-rel", "0.1", "--trained"], "give one of --sigma-rel, --sweep, --trained (got --sigma-rel, --trained)"),
    ([], "give one of --sigma-rel, --sweep, --trained (got none)"),
])
def test_bad_flags_exit_2_naming_them(run, args, says):
    out = runner.invoke(app, ["ema", str(run), *args])
    assert out.exit_code == 2 and says in out.stderr, out.output


def test_a_run_without_snapshots_exits_2(tmp_path):
    plain = tmp_path / "plain"
    make_trainer(load_config("dit-debug", ["train.steps=2", "train.sample_every=0"]), plain).fit()
    out = runner.invoke(app, ["ema", str(plain), "--sigma-rel", "0.1"])
    assert out.exit_code == 2 and "has no EMA snapshots" in out.stderr and "train.ema.kind=power" in out.stderr
    out = runner.invoke(app, ["ema", str(tmp_path / "nowhere"), "--sigma-rel", "0.1"])
    assert out.exit_code == 2 and "is not a run directory" in out.stderr


def test_export_records_the_synthesised_ema_it_wrote(run, tmp_path):
    """An export after `genforge ema --sigma-rel` carries the synthesised weights, and its record says so (file)."""
    assert runner.invoke(app, ["ema", str(run), "--sigma-rel", "0.08"]).exit_code == 0
    out = runner.invoke(app, ["export", str(run), str(tmp_path / "pipe"), "--to", "diffusers"])
    assert out.exit_code == 0, out.output
    record = json.loads((tmp_path / "pipe" / "genforge-export.json").read_text())
    assert record["weights"] == "ema synthesised post hoc"
    assert record["ema_file"] == str((run / "ema_synthesized" / "sigma_rel-0.0800.safetensors").absolute())
    assert runner.invoke(app, ["ema", str(run), "--trained"]).exit_code == 0
    out = runner.invoke(app, ["export", str(run), str(tmp_path / "trained"), "--to", "diffusers"])
    record = json.loads((tmp_path / "trained" / "genforge-export.json").read_text())
    assert record["weights"] == "ema" and "ema_file" not in record
