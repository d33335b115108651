"""The CLI end to end on tiny presets, and a frozen command surface (the stable surface the README and docs promise)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from genforge.app.runs import family_sample_options
from genforge.cli import app
from genforge.core.registry import FAMILIES

runner = CliRunner()
OLD_RUNS = Path(__file__).parent / "fixtures" / "runs-3f8e24e"


def _options(command_name):
    group = typer.main.get_command(app)
    cmd = group.commands[command_name]
    return {opt for p in cmd.params if p.param_type_name == "option" for opt in p.opts}


def test_stable_surface_is_frozen():
    group = typer.main.get_command(app)
    assert {"train", "sample", "eval", "encode", "presets", "data", "export"} <= set(group.commands)
    assert {"--set", "--run-dir", "--dry-run", "--fresh"} <= _options("train")
    assert {"--n", "--out", "--seed", "--steps", "--cfg-scale", "--label", "--prompt", "--precision",
            "--compile"} <= _options("sample")
    # the families' own sampling options (FamilyTraits.sample_options), which the CLI parses and --help lists
    declared = {"--" + option.name.replace("_", "-") for option in family_sample_options()}
    assert {"--image", "--start-stage", "--stop-stage", "--frames", "--story", "--critic", "--temperature",
            "--choice-temperature", "--temperature-anneal", "--critic-guidance"} <= declared
    shown = runner.invoke(app, ["sample", "--help"]).output
    assert all(flag in shown for flag in declared)
    assert {"--metrics", "--n", "--seed", "--steps", "--cfg-scale", "--ref", "--is-weights", "--precision",
            "--compile"} <= _options("eval")
    assert {"--out", "--data", "--set", "--flip", "--batch-size", "--shard-size", "--precision"} <= _options("encode")
    assert {"--out", "--n"} <= {o for p in group.commands["data"].commands["shapes"].params for o in p.opts}
    assert {"--to", "--ema"} <= _options("export")  # --ema/--no-ema
    assert {"--save-stats", "--batch-size"} <= _options("fid")  # genforge fid A [B]


def test_sampling_flags_are_generated_from_the_options_models():
    """Every field of every registered family's sampling options model (SampleOptions' common fields included) is a
    flag of `genforge sample`, and of `genforge eval` exactly when marked for evaluation; help reads at 80 columns,
    and with a run it lists that family's options only."""
    sample, evaluate = _options("sample"), _options("eval")
    for _, spec in FAMILIES.items():
        for name, field in spec.traits.sample_options.model_fields.items():
            flag = "--" + name.replace("_", "-")
            assert flag in sample
            assert (flag in evaluate) == bool((field.json_schema_extra or {}).get("eval")), flag
    for args in (["--help"], ["sample", "--help"], ["eval", "--help"], ["sample", str(OLD_RUNS / "phenaki"), "--help"]):
        shown = runner.invoke(app, args, env={"COLUMNS": "80"}).output
        assert max(len(line) for line in shown.splitlines()) <= 80, shown
    shown = runner.invoke(app, ["sample", str(OLD_RUNS / "phenaki"), "--help"]).output
    assert "Options of 'phenaki' models" in shown and "--frames" in shown and "--start-stage" not in shown


def test_bad_override_exits_2_in_a_real_process():
    out = subprocess.run([sys.executable, "-m", "genforge", "train", "dit-debug", "--set", "train.lr=-1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "train.lr" in out.stderr and "-1" in out.stderr


def test_train_sample_eval_end_to_end(tmp_path, monkeypatch):
    run = tmp_path / "run"
    out = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(run)])
    assert out.exit_code == 0, out.output
    assert "samples:" in out.stdout

    grid = tmp_path / "grid.png"
    out = runner.invoke(app, ["sample", str(run), "--n", "4", "--label", "3", "--steps", "3", "--out", str(grid)])
    assert out.exit_code == 0, out.output
    assert Image.open(grid).size == (2 + 2 * (16 + 2), 2 + 2 * (16 + 2))
    out = runner.invoke(app, ["sample", str(run), "--label", "99"])
    assert out.exit_code == 2 and "--label" in out.stderr

    from genforge.eval import metrics as metrics_module

    out = runner.invoke(app, ["eval", str(run), "--metrics", "judge", "--n", "8", "--steps", "2"])
    assert out.exit_code == 0, out.output
    result = json.loads((run / "eval" / "6.json").read_text())
    assert result["n"] == 8 and 0.0 <= result["judge_accuracy"] <= 1.0
    assert result["judge_weights"] == "shapes-judge-v1.safetensors"  # the shipped judge, named in every result
    assert result["sampler"]["steps"] == 2

    from eval.eval_standins import TinyFeatures

    monkeypatch.setattr(metrics_module, "feature_network", lambda device: TinyFeatures())
    monkeypatch.setenv("GENFORGE_CACHE", str(tmp_path / "cache"))  # other tests may have cached these statistics
    out = runner.invoke(app, ["eval", str(run), "--metrics", "fid,kid,judge", "--n", "8", "--steps", "2"])
    assert out.exit_code == 0, out.output
    assert "reference statistics: computed" in out.stderr and "fid:" in out.stdout
    result = json.loads((run / "eval" / "6.json").read_text())
    assert result["fid"] > 0 and "kid_mean" in result and "judge_accuracy" in result and result["ref_n"] == 8
    out = runner.invoke(app, ["eval", str(run), "--metrics", "fid", "--n", "8", "--steps", "2", "--ref", result["ref"]])
    assert out.exit_code == 0 and json.loads((run / "eval" / "6.json").read_text())["fid"] == result["fid"]
    out = runner.invoke(app, ["eval", str(run), "--metrics", "fid", "--ref", str(tmp_path / "absent")])
    assert out.exit_code == 2 and "no such image folder or statistics file" in out.stderr
    out = runner.invoke(app, ["eval", str(run), "--metrics", "is", "--n", "10"])
    assert out.exit_code == 2 and "--is-weights" in out.stderr


def test_sample_refuses_a_folder_that_is_not_a_run(tmp_path):
    out = runner.invoke(app, ["sample", str(tmp_path)])
    assert out.exit_code == 2 and "not a run directory" in out.stderr


def test_train_init_from_a_path_that_does_not_exist_exits_2(tmp_path):
    out = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(tmp_path / "ft"), "--set",
                              "train.init_from=/nonexistent"])
    assert out.exit_code == 2, out.output
    assert "train.init_from=/nonexistent: /nonexistent does not exist" in out.stderr
    assert not (tmp_path / "ft" / "checkpoints" / "latest").exists()


def test_data_shapes_writes_a_folder(tmp_path):
    out = runner.invoke(app, ["data", "shapes", "--out", str(tmp_path / "s"), "--n", "20", "--image-size", "16"])
    assert out.exit_code == 0, out.output
    assert len(list((tmp_path / "s").rglob("*.png"))) == 20
    assert len(list((tmp_path / "s").rglob("*.txt"))) == 20


def test_data_moving_shapes_writes_a_video_folder(tmp_path):
    out = runner.invoke(app, ["data", "moving_shapes", "--out", str(tmp_path / "m"), "--n", "4", "--image-size", "16",
                              "--frames", "5", "--format", "mp4"])
    assert out.exit_code == 0, out.output
    assert len(list((tmp_path / "m").rglob("*.mp4"))) == 4 and "data.source=video_folder" in out.output
    bad = runner.invoke(app, ["data", "moving_shapes", "--out", str(tmp_path / "x"), "--format", "avi"])
    assert bad.exit_code == 2 and "avi" in bad.output
    centred = runner.invoke(app, ["data", "moving_shapes", "--out", str(tmp_path / "c"), "--n", "2", "--image-size",
                                  "16", "--frames", "3", "--paths", "from_centre"])
    assert centred.exit_code == 0 and len(list((tmp_path / "c").rglob("*.gif"))) == 2, centred.output
    bad = runner.invoke(app, ["data", "moving_shapes", "--out", str(tmp_path / "x"), "--paths", "anywhere"])
    assert bad.exit_code == 2 and "anywhere" in bad.output
