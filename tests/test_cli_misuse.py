"""Misuse ends with exit 2 and a message naming the option, field or file, never a traceback (issue 35 items 7-10):
unwritable --run-dir / --out, non-finite numbers, an --out suffix no writer has (checked before sampling); a full
disk while writing a preview leaves no torn file."""

import dataclasses
import errno
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from eval.eval_standins import TinyFeatures
from genforge.cli import app
from genforge.core.registry import PREVIEW_WRITERS
from genforge.data.previews import write_preview
from genforge.eval import metrics as metrics_module

runner = CliRunner()
OLD_RUN = Path(__file__).parent / "fixtures" / "runs-3f8e24e" / "dit"


@pytest.mark.parametrize("args, message", [
    (["train", "dit-debug", "--set", "train.weight_decay=inf", "--dry-run"], "train.weight_decay"),
    (["train", "dit-debug", "--set", "model.diffusion.cfg_scale=nan", "--dry-run"], "model.diffusion.cfg_scale"),
    (["train", "dit-debug", "--set", "train.betas=[0.9,inf]", "--dry-run"], "train.betas"),
    (["train", "dit-debug", "--set", "train.sharding=fsdp", "--set", "train.precision=fp16", "--dry-run"],
     "train.sharding=fsdp takes train.precision=bf16 or no"),
    (["train", "clip-debug", "--set", "train.sharding=fsdp", "--dry-run"], "train.sharding=fsdp: model.family=clip"),
    (["sample", str(OLD_RUN), "--cfg-scale", "inf"], "--cfg-scale inf: must be a finite number"),
    (["eval", str(OLD_RUN), "--cfg-scale", "inf", "--metrics", "fid"], "--cfg-scale inf: must be a finite number"),
    (["sample", str(OLD_RUN), "--out", "grid.jpgx"], "no writer for '.jpgx' files"),
    (["sample", str(OLD_RUN), "--n", "1000000000000"], "--n"),
    (["eval", str(OLD_RUN), "--n", "1000000000000"], "--n"),
    (["train", "dit-debug", "--set", "eval.n=1000000000", "--dry-run"], "eval.n"),
])
def test_bad_values_exit_2_naming_them(args, message):
    out = runner.invoke(app, args)
    assert out.exit_code == 2 and message in out.output, out.output


def test_unwritable_places_exit_2_naming_them(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(blocker / "run")])
    assert out.exit_code == 2 and "--run-dir" in out.output and "cannot write there" in out.output
    out = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(blocker)])
    assert out.exit_code == 2 and "--run-dir" in out.output
    sampled = []
    monkeypatch.setattr("genforge.app.api.generate", lambda *a, **k: sampled.append(1))
    out = runner.invoke(app, ["sample", str(OLD_RUN), "--out", str(blocker / "grid.png")])
    assert out.exit_code == 2 and "--out" in out.output and not sampled  # refused before sampling


def test_absurd_data_sizes_exit_2_naming_them_before_anything_is_created(tmp_path):
    out = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(tmp_path / "run"), "--set",
                              "train.batch_size=1000000000000", "--set", "data.shapes.n=10000000000000"])
    assert out.exit_code == 2 and "data.shapes.n" in out.output and "train.batch_size" in out.output, out.output
    assert "Traceback" not in out.output and not (tmp_path / "run").exists()
    out = runner.invoke(app, ["data", "shapes", "--out", str(tmp_path / "data"), "--n", "10000000000000"])
    assert out.exit_code == 2 and "--n" in out.output and not (tmp_path / "data").exists()


def test_a_model_too_large_for_memory_exits_1_saying_so(tmp_path):
    out = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(tmp_path / "run"), "--set",
                              "model.backbone.hidden_size=1000000", "--set", "model.backbone.num_heads=1"])
    assert out.exit_code == 1 and "out of memory building the model" in out.stderr, out.output
    assert "Traceback" not in out.output and not (tmp_path / "run").exists()


@pytest.fixture
def old_run(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    return run


def test_sample_into_a_run_it_cannot_write_exits_2_before_sampling(old_run, monkeypatch):
    (old_run / "samples").write_text("in the way")  # RUN/samples cannot be made a folder
    sampled = []
    monkeypatch.setattr("genforge.app.api.generate", lambda *a, **k: sampled.append(1))
    out = runner.invoke(app, ["sample", str(old_run), "--n", "2"])
    assert out.exit_code == 2 and f"{old_run / 'samples'}: cannot write there" in out.stderr, out.output
    assert not sampled and "Traceback" not in out.output


@pytest.mark.parametrize("blocker", ["file", "link to nowhere"])
def test_eval_of_a_run_it_cannot_write_prints_the_scores_and_exits_2(old_run, monkeypatch, blocker):
    if blocker == "file":
        (old_run / "eval").write_text("in the way")
    else:
        (old_run / "eval").symlink_to("/proc/genforge-no-such-folder")
    monkeypatch.setattr(metrics_module, "feature_network", lambda device: TinyFeatures())
    out = runner.invoke(app, ["eval", str(old_run), "--metrics", "fid", "--n", "4"])
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    assert "cannot write there" in out.stderr.splitlines()[0]  # said before the scores are computed
    assert "fid:" in out.stdout and f"{old_run / 'eval'}: cannot write there" in out.stderr
    assert "the scores above were not written" in out.stderr


def test_a_full_disk_while_writing_a_preview_leaves_no_file(tmp_path, monkeypatch):
    writer = PREVIEW_WRITERS.get(".png")

    def full(outputs, path, nrow):
        Path(path).write_bytes(b"")  # what a writer leaves when the disk fills
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setitem(PREVIEW_WRITERS._entries, ".png", dataclasses.replace(writer, write=full))
    with pytest.raises(OSError):
        write_preview(torch.zeros(4, 3, 8, 8), tmp_path / "grid.png", captions=["a"] * 4)
    assert list(tmp_path.iterdir()) == []


def test_a_refused_resume_leaves_config_yaml_as_it_was(tmp_path):
    """A resume with another model exits 2 naming the field; config.yaml still describes the run that wrote it, and
    sampling that run still works."""
    run = tmp_path / "run"
    tiny = ["--set", "train.steps=2", "--set", "train.checkpoint_every=2", "--set", "train.sample_every=0"]
    assert runner.invoke(app, ["train", "dit-debug", "--run-dir", str(run), *tiny]).exit_code == 0
    before = (run / "config.yaml").read_text()
    out = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(run), *tiny, "--set",
                              "model.backbone.hidden_size=32", "--set", "train.steps=4"])
    assert out.exit_code == 2 and "model.backbone.hidden_size: 64 -> 32" in out.output, out.output
    assert (run / "config.yaml").read_text() == before
    assert runner.invoke(app, ["sample", str(run), "--n", "2", "--out", str(tmp_path / "s.png")]).exit_code == 0
    dry = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(run), *tiny, "--set",
                              "model.backbone.hidden_size=32", "--dry-run"])
    assert dry.exit_code == 2 and "model.backbone.hidden_size: 64 -> 32" in dry.output  # --dry-run says it first
    dry = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(run), *tiny, "--set", "train.steps=4",
                              "--dry-run"])
    assert dry.exit_code == 0 and "# changed on resume: train.steps: 2 -> 4" in dry.output, dry.output
