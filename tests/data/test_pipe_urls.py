"""`pipe:` shard URLs run shell commands, so they are opt-in: refused with exit 2 naming data.path unless the user
sets GENFORGE_ALLOW_PIPE=1 in the environment (never a config key)."""

import pytest
from typer.testing import CliRunner

from genforge.app.config import load_config
from genforge.cli import app
from genforge.core.errors import ConfigError
from genforge.data.shapes import write_shapes_shards
from genforge.data.shards import expand_spec

PIPE = ["--set", "data.source=shards", "--set", "model.num_classes=16", "--set", "train.steps=1",
        "--set", "train.sample_every=0", "--set", "data.num_workers=0"]


def test_a_pipe_url_is_refused_without_the_opt_in(tmp_path, monkeypatch):
    monkeypatch.delenv("GENFORGE_ALLOW_PIPE", raising=False)
    marker = tmp_path / "ran"
    spec = f"pipe:touch {marker} && cat shards.tar"
    out = CliRunner().invoke(app, ["train", "dit-debug", "--run-dir", str(tmp_path / "run"), *PIPE,
                                   "--set", f"data.path={spec}"])
    assert out.exit_code == 2 and "data.path" in out.output and "GENFORGE_ALLOW_PIPE=1" in out.output
    assert not marker.exists() and not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="pipe"):
        expand_spec(f"{tmp_path}/a.tar::{spec}")  # any part of a spec


def test_with_the_opt_in_a_pipe_url_streams_the_shards(tmp_path, monkeypatch):
    pattern, _ = write_shapes_shards(tmp_path / "shards", 64, 16, shard_size=64)
    monkeypatch.setenv("GENFORGE_ALLOW_PIPE", "1")
    cfg = load_config("dit-debug", ["data.source=shards", f"data.path=pipe:cat {pattern}", "model.num_classes=16"])
    assert expand_spec(cfg.data.path) == [f"pipe:cat {pattern}"]
    out = CliRunner().invoke(app, ["train", "dit-debug", "--run-dir", str(tmp_path / "run"), *PIPE,
                                   "--set", f"data.path=pipe:cat {pattern}"])
    assert out.exit_code == 0, out.output
