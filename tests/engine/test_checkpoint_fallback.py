"""Resume that never loses work: a damaged newest checkpoint is moved aside and the one before it is used, with the
same final weights as an uninterrupted run; sample and eval skip it without touching the run directory."""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from eval.eval_standins import TinyFeatures
from kill_harness import nan_in
from genforge.app.config import load_config
from genforge.app.runs import load_run, make_trainer
from genforge.cli import app
from genforge.engine.checkpoint import CheckpointReadError
from genforge.engine.verify import read_weights, verify_checkpoint
from genforge.eval import metrics as metrics_module

OVERRIDES = ["train.steps=6", "train.checkpoint_every=2", "train.log_every=1", "train.sample_every=0", "eval.every=0",
             "log.progress=false"]
runner = CliRunner()


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / "step-000006" / "model.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A straight run to step 6, and one stopped after step 4 (checkpoints at 2 and 4)."""
    base = tmp_path_factory.mktemp("fallback")
    make_trainer(load_config("dit-debug", OVERRIDES), base / "straight").fit()
    make_trainer(load_config("dit-debug", OVERRIDES), base / "stopped").fit(stop_at=4)
    return base / "straight", base / "stopped"


def _header_claiming(path: Path, length: int) -> None:
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", length) + data[8:])


def _wrong_shape(path: Path) -> None:
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = torch.zeros(tensors[name].shape[0] + 1, *tensors[name].shape[1:], dtype=tensors[name].dtype)
    save_file(tensors, str(path))


DAMAGE = {  # what is done to step-000004, and a word its message must hold
    "nonfinite_model": (lambda c: nan_in(c / "model.safetensors"), "non-finite"),
    "nonfinite_ema": (lambda c: nan_in(c / "ema.safetensors"), "ema.safetensors"),
    "truncated": (lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:1000]),
                  "model.safetensors"),
    "random_bytes": (lambda c: (c / "model.safetensors").write_bytes(bytes(range(256)) * 40), "model.safetensors"),
    "huge_header": (lambda c: _header_claiming(c / "model.safetensors", 10**15), "model.safetensors"),
    "missing_ema": (lambda c: (c / "ema.safetensors").unlink(), "ema.safetensors"),
    "invalid_json": (lambda c: (c / "trainer_state.json").write_text("{\"step\": 4,"), "trainer_state.json"),
    "json_list": (lambda c: (c / "trainer_state.json").write_text("[1, 2]"), "trainer_state.json"),
    "json_string": (lambda c: (c / "trainer_state.json").write_text("\"step\""), "trainer_state.json"),
    "wrong_shape": (lambda c: _wrong_shape(c / "model.safetensors"), "model.safetensors"),
    "missing_rng": (lambda c: (c / "rng" / "rank-0.safetensors").unlink(), "rank-0.safetensors"),
    "missing_optim": (lambda c: (c / "optim" / "main.json").unlink(), "main.json"),
}


def _damaged_copy(runs, tmp_path, kind: str) -> Path:
    run = tmp_path / "run"
    shutil.copytree(runs[1], run)
    damage, _ = DAMAGE[kind]
    damage(run / "checkpoints" / "step-000004")
    return run


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_resume_falls_back_to_the_previous_checkpoint(kind, runs, tmp_path, status):
    run = _damaged_copy(runs, tmp_path, kind)
    make_trainer(load_config("dit-debug", OVERRIDES), run).fit()
    err = status.text
    ckpts = run / "checkpoints"
    assert (ckpts / "damaged-step-000004").is_dir()  # moved aside, not deleted
    assert "step-000004" in err and DAMAGE[kind][1] in err and "resumed from" in err and "step-000002" in err
    events = [r for r in map(json.loads, open(run / "metrics.jsonl")) if r.get("event") == "checkpoint_fallback"]
    assert any("damaged-step-000004" in e["message"] for e in events)
    assert (ckpts / "latest").read_text().strip() == "step-000006"
    straight = _weights(runs[0])
    resumed = _weights(run)
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_a_torn_shard_of_a_sharded_checkpoint_falls_back_too(runs, tmp_path, status):
    """train.sharding=fsdp on one process writes sharded checkpoints (shards/ and DCP's safetensors): a torn shard
    file moves that checkpoint aside, and the run resumes from the previous one to the same weights as the plain
    straight run (one process shards nothing)."""
    sharded = [*OVERRIDES, "train.sharding=fsdp"]
    make_trainer(load_config("dit-debug", sharded), tmp_path).fit(stop_at=4)
    shard = next((tmp_path / "checkpoints" / "step-000004" / "shards").glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:1000])
    make_trainer(load_config("dit-debug", sharded), tmp_path).fit()
    err = status.text
    assert (tmp_path / "checkpoints" / "damaged-step-000004").is_dir() and shard.name in err
    resumed = read_weights(tmp_path / "checkpoints" / "step-000006", "model")
    straight = _weights(runs[0])
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_latest_naming_a_missing_folder_falls_back(runs, tmp_path, status):
    run = tmp_path / "run"
    shutil.copytree(runs[1], run)
    shutil.rmtree(run / "checkpoints" / "step-000004")  # `latest` still names it
    make_trainer(load_config("dit-debug", OVERRIDES), run).fit()
    err = status.text
    assert "names 'step-000004'" in err and "step-000002" in err
    straight, resumed = _weights(runs[0]), _weights(run)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_the_cli_names_the_damaged_checkpoint_and_carries_on(runs, tmp_path):
    run = _damaged_copy(runs, tmp_path, "huge_header")
    args = ["train", "dit-debug", "--run-dir", str(run)] + [a for o in OVERRIDES for a in ("--set", o)]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    assert "claims 1000000000000000 bytes" in out.stderr and "damaged-step-000004" in out.stderr


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("kind", ["wrong_shape", "json_list", "missing_ema", "nonfinite_model"])
def test_sample_and_eval_skip_a_damaged_checkpoint_without_touching_it(kind, runs, tmp_path, monkeypatch):
    run = _damaged_copy(runs, tmp_path, kind)
    before = _snapshot(run)
    loaded = load_run(run)
    assert loaded.checkpoint.name == "step-000002" and loaded.step == 2
    sampled = runner.invoke(app, ["sample", str(run), "--n", "1", "--out", str(tmp_path / "s.png")])
    assert sampled.exit_code == 0, sampled.output
    assert "step-000004" in sampled.stderr and DAMAGE[kind][1] in sampled.stderr
    assert _snapshot(run) == before  # a reader moves and changes nothing
    monkeypatch.setattr(metrics_module, "feature_network", lambda device: TinyFeatures())
    scored = runner.invoke(app, ["eval", str(run), "--metrics", "fid", "--n", "4"])
    assert scored.exit_code == 0, scored.output
    assert "step-000004" in scored.stderr
    assert _snapshot(run / "checkpoints") == {k[len("checkpoints/"):]: v for k, v in before.items()
                                             if k.startswith("checkpoints/")}


def test_nothing_usable_left_exits_2_naming_the_files(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[1], run)
    (run / "checkpoints" / "step-000004" / "trainer_state.json").write_text("[]")
    (run / "checkpoints" / "step-000002" / "model.safetensors").write_bytes(b"\x00" * 5)
    before = _snapshot(run / "checkpoints")
    args = ["train", "dit-debug", "--run-dir", str(run)] + [a for o in OVERRIDES for a in ("--set", o)]
    out = runner.invoke(app, args)
    assert out.exit_code == 2, out.output
    assert "step-000004/trainer_state.json" in out.stderr and "step-000002/model.safetensors" in out.stderr
    assert "Traceback" not in out.output and _snapshot(run / "checkpoints") == before  # nothing moved
    sampled = runner.invoke(app, ["sample", str(run), "--n", "1", "--out", str(tmp_path / "s.png")])
    assert sampled.exit_code == 2 and "step-000002/model.safetensors" in sampled.stderr


def test_verify_checkpoint_reads_headers_only(runs, tmp_path):
    ckpt = tmp_path / "c"
    shutil.copytree(runs[1] / "checkpoints" / "step-000004", ckpt)
    verify_checkpoint(ckpt, resume=True)
    model = load_file(str(ckpt / "model.safetensors"))
    expected = {k: (tuple(v.shape), v.dtype) for k, v in model.items()}
    verify_checkpoint(ckpt, expected)
    name = sorted(expected)[0]
    with pytest.raises(CheckpointReadError, match=f"model.safetensors: tensor '{name}'"):
        verify_checkpoint(ckpt, {**expected, name: ((1, 2, 3), torch.float32)})
    with pytest.raises(CheckpointReadError, match="unexpected"):
        verify_checkpoint(ckpt, {k: v for k, v in expected.items() if k != name})
    (ckpt / "model.safetensors").write_bytes(b"\x80\x04\x95" + b"\x00" * 64)  # a pickle's opening bytes
    with pytest.raises(CheckpointReadError, match="model.safetensors"):
        verify_checkpoint(ckpt)


@pytest.mark.dist  # several processes: make test-dist
def test_two_processes_agree_on_the_fallback(tmp_path):
    """A 2-rank checkpoint missing rank 1's RNG state is moved aside by rank 0 only; both ranks resume from the one
    before and end where a straight 2-process run ends."""
    here = Path(__file__).parent
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(here.parents[1]))
    overrides = ["train.checkpoint_every=2", "train.sample_every=0", "eval.every=0", "log.progress=false"]

    def torchrun(run_dir: Path, out_dir: Path, steps: int) -> subprocess.CompletedProcess:
        out_dir.mkdir(exist_ok=True)
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               str(here / "ddp_worker.py"), str(run_dir), str(out_dir), f"train.steps={steps}",
                               *overrides], env=env, capture_output=True, text=True, timeout=300)

    assert torchrun(tmp_path / "straight", tmp_path / "s", 6).returncode == 0
    assert torchrun(tmp_path / "run", tmp_path / "first", 4).returncode == 0
    (tmp_path / "run" / "checkpoints" / "step-000004" / "rng" / "rank-1.json").unlink()
    done = torchrun(tmp_path / "run", tmp_path / "r", 6)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank-1.json is missing" in done.stderr and done.stderr.count("moved aside") == 1
    assert (tmp_path / "run" / "checkpoints" / "damaged-step-000004").is_dir()
    for rank in (0, 1):
        straight = load_file(str(tmp_path / "s" / f"rank{rank}-of2.safetensors"))
        resumed = load_file(str(tmp_path / "r" / f"rank{rank}-of2.safetensors"))
        assert all(torch.equal(straight[k], resumed[k]) for k in straight)
