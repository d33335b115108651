"""Sampling, evaluation and encoding at scale: --precision, progress lines without a terminal, and several processes
under torchrun (2 CPU processes over gloo; the `dist` tests run in `make test-dist`)."""

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from genforge.app.config import load_config
from genforge.app.encode import encode_dataset
from genforge.app.runs import load_codec, load_run, make_trainer
from genforge.cli import app
from genforge.data.cache import CacheDataset, read_manifest, shard_records
from genforge.eval import metrics as metrics_module
from genforge.sampling import generate
from genforge.core.config import SampleOptions
from eval.eval_standins import TinyFeatures

HERE = Path(__file__).parent
runner = CliRunner()


@pytest.fixture(scope="module")
def dit_run(tmp_path_factory):
    """A tiny class-conditional DiT trained 6 steps (train.precision no)."""
    run_dir = tmp_path_factory.mktemp("dit")
    make_trainer(load_config("dit-debug"), run_dir).fit()
    return run_dir


@pytest.fixture(scope="module")
def vae_run(tmp_path_factory):
    """A tiny KL-VAE trained 2 steps: a real tokenizer run to encode with."""
    run_dir = tmp_path_factory.mktemp("vae")
    make_trainer(load_config("klvae-debug", ["train.steps=2", "train.checkpoint_every=2", "train.sample_every=0"]),
                 run_dir).fit()
    return run_dir


def _env(**more: str) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(HERE.parent), **more)


def _genforge(args: list[str], processes: int = 1, **env: str) -> subprocess.CompletedProcess:
    """`genforge ARGS` through tests/cli_worker.py (stand-in FID features), plainly or under torchrun."""
    launch = [sys.executable] if processes == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                      "--nproc_per_node", str(processes)]
    return subprocess.run([*launch, str(HERE / "cli_worker.py"), *args], env=_env(**env), capture_output=True,
                          text=True, timeout=300)


def _records(cache: Path) -> list[dict[str, bytes]]:
    """Every record of a cache, its fields as bytes, in cache order."""
    return [{k: v for k, v in record.items() if k != "__url__"}
            for name in read_manifest(cache).shards for record in shard_records(cache / name)]


# ------------------------------------------------------------------------------------------------ precision
def test_bf16_samples_are_close_to_float32_and_fp16_on_a_cpu_exits_2(dit_run, tmp_path, monkeypatch):
    task = load_run(dit_run).task
    full, _ = generate(task, 8, 0, "cpu", options=SampleOptions(steps=3))
    half, _ = generate(task, 8, 0, "cpu", precision="bf16", options=SampleOptions(steps=3))
    assert half.shape == full.shape == (8, 3, 16, 16) and half.dtype == full.dtype == torch.float32
    assert not torch.equal(half, full)  # the network did run in bfloat16
    assert (half - full).abs().mean() < 0.01 and (half - full).abs().max() < 0.25

    monkeypatch.setattr(metrics_module, "feature_network", lambda device: TinyFeatures())
    out = runner.invoke(app, ["eval", str(dit_run), "--metrics", "fid,prdc", "--n", "8", "--steps", "2",
                              "--precision", "bf16"])
    assert out.exit_code == 0, out.output
    result = json.loads((dit_run / "eval" / "6.json").read_text())
    assert result["autocast"] == "bf16" and isinstance(result["precision"], float)  # prdc's precision kept
    out = runner.invoke(app, ["eval", str(dit_run), "--metrics", "fid", "--n", "8", "--steps", "2"])
    assert out.exit_code == 0, out.output
    assert json.loads((dit_run / "eval" / "6.json").read_text())["autocast"] == "no"  # the run's train.precision

    for command in (["sample", str(dit_run), "--out", str(tmp_path / "g.png")], ["eval", str(dit_run)]):
        out = runner.invoke(app, [*command, "--precision", "fp16"])
        assert out.exit_code == 2 and "--precision fp16 needs a CUDA GPU" in out.stderr, out.output
        out = runner.invoke(app, [*command, "--precision", "fp32"])
        assert out.exit_code == 2 and "--precision fp32: unknown precision; allowed: no, bf16, fp16" in out.stderr
    assert not (tmp_path / "g.png").exists()


def test_sample_compile_draws_the_eager_grid(dit_run, tmp_path):
    """--compile samples through the compiled blocks: the grid equals the eager one up to kernel rounding."""
    grids = {}
    for flag in ("--no-compile", "--compile"):
        out = runner.invoke(app, ["sample", str(dit_run), "--n", "4", "--steps", "2", flag,
                                  "--out", str(tmp_path / f"{flag}.png")])
        assert out.exit_code == 0, out.output
        grids[flag] = np.asarray(Image.open(tmp_path / f"{flag}.png"), dtype=np.int16)
    assert np.abs(grids["--compile"] - grids["--no-compile"]).max() <= 2


def test_bf16_codes_are_close_to_float32_and_fp16_on_a_cpu_exits_2(vae_run, tmp_path):
    codec, info = load_codec(vae_run)
    data = load_config(str(vae_run / "config.yaml"), ["data.shapes.n=24"]).data
    for precision in ("no", "bf16"):
        encode_dataset(codec, info, data, tmp_path / precision, flip=False, batch_size=8, precision=precision)
    full, half = CacheDataset(tmp_path / "no").codes.float(), CacheDataset(tmp_path / "bf16").codes.float()
    assert half.shape == full.shape == (24, 4, 8, 8)
    assert not torch.equal(half, full)
    assert (half - full).abs().max() < 0.05 * full.abs().max()

    out = runner.invoke(app, ["encode", str(vae_run), "--out", str(tmp_path / "c"), "--precision", "fp16"])
    assert out.exit_code == 2 and "--precision fp16 needs a CUDA GPU" in out.stderr, out.output
    assert not (tmp_path / "c").exists()


# ------------------------------------------------------------------------------------------ progress lines
def test_without_a_terminal_sample_eval_and_encode_log_plain_lines_and_a_summary(dit_run, vae_run, tmp_path,
                                                                                  monkeypatch, caplog):
    """stderr is not a terminal (CliRunner's): no bar (no carriage return), plain lines through the `genforge`
    logger and a closing summary, for each command."""
    caplog.set_level(logging.INFO, logger="genforge")
    monkeypatch.setattr(metrics_module, "feature_network", lambda device: TinyFeatures())
    commands = {
        "sample": ["sample", str(dit_run), "--n", "8", "--steps", "2", "--out", str(tmp_path / "g.png")],
        "eval": ["eval", str(dit_run), "--metrics", "fid", "--n", "8", "--steps", "2"],
        "encode": ["encode", str(vae_run), "--out", str(tmp_path / "cache"), "--set", "data.shapes.n=40",
                   "--batch-size", "8", "--shard-size", "16"],
    }
    for name, command in commands.items():
        caplog.clear()
        out = runner.invoke(app, command)
        assert out.exit_code == 0, out.output
        assert "\r" not in out.stderr, name
        messages = caplog.messages
        if name == "sample":
            assert "sampling 8/8 samples" in messages[0] and " samples/s, ETA " in messages[0]
            assert messages[-1].startswith("sampled 8 samples in 0:00:")
        elif name == "eval":
            assert any(m.startswith("evaluating 8/8 samples") for m in messages)
            assert messages[-1].startswith("evaluated 8 samples in 0:00:") and ": fid " in messages[-1]
        else:  # 5 batches of 8: a line at each tenth (4 images) crossed
            lines = [m for m in messages if m.startswith("encoding ")]
            assert [line.split()[1] for line in lines] == ["8/40", "16/40", "24/40", "32/40", "40/40"]
            assert messages[-1].startswith("encoded 40 images into 3 shard(s) in 0:00:")


# ------------------------------------------------------------------------------------------ several processes
@pytest.mark.dist  # several processes: make test-dist
def test_sample_on_two_processes_writes_the_grid_of_one(dit_run, tmp_path):
    """80 samples are 2 chunks of 64 + 16, one per rank; the grid is the one 1 process draws, written once."""
    args = ["sample", str(dit_run), "-n", "80", "--steps", "2", "--seed", "3"]
    one = _genforge([*args, "--out", str(tmp_path / "one.png")])
    two = _genforge([*args, "--out", str(tmp_path / "two.png")], processes=2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-3000:]
    grids = [np.asarray(Image.open(tmp_path / f"{name}.png")) for name in ("one", "two")]
    assert grids[0].shape == grids[1].shape and np.array_equal(grids[0], grids[1])
    assert two.stdout.count("wrote 80 samples") == 1  # rank 1 prints nothing
    assert "sampling (rank 0 of 2) 64/64 samples" in two.stderr
    assert "sampled 80 samples on 2 processes in 0:00:" in two.stderr


@pytest.mark.dist  # several processes: make test-dist
def test_eval_on_two_processes_scores_like_one(dit_run, tmp_path):
    """FID and KID of 80 samples (2 chunks, one per rank) on 2 processes equal those of 1 process."""
    args = ["eval", str(dit_run), "--metrics", "fid,kid", "-n", "80", "--steps", "2"]
    scores = []
    for processes in (1, 2):
        done = _genforge(args, processes, GENFORGE_CACHE=str(tmp_path / f"cache{processes}"))
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.count("wrote ") == 1 and done.stdout.count("fid: ") == 1  # rank 0 alone reports
        scores.append(json.loads((dit_run / "eval" / "6.json").read_text()))
    one, two = scores
    assert one["n"] == two["n"] == 80 and one["ref_n"] == two["ref_n"]
    for key in ("fid", "kid_mean", "kid_std"):
        assert two[key] == pytest.approx(one[key], rel=1e-9, abs=1e-12), key


@pytest.mark.dist  # several processes: make test-dist
def test_encode_on_two_processes_writes_the_cache_of_one(vae_run, tmp_path):
    """50 images in batches of 12: rank 0 encodes 24, rank 1 26; shards of 10, so shard 2 (positions 20-29) holds
    records of both ranks. Same cache.json, same records (keys, codes, labels, captions) at the same positions, and
    the same text embeddings of the captions both ranks saw."""
    args = ["encode", str(vae_run), "--set", "data.shapes.n=50", "--batch-size", "12", "--shard-size", "10",
            "--text-encoder", "minilm"]
    one = _genforge([*args, "--out", str(tmp_path / "one")])
    two = _genforge([*args, "--out", str(tmp_path / "two")], processes=2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-3000:]
    for name in ("cache.json", "text_embeds.json", "text_embeds.safetensors"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    manifest = read_manifest(tmp_path / "two")
    assert manifest.count == 50 and manifest.shards == [f"shard-{k:06d}.tar" for k in range(5)]
    records = _records(tmp_path / "two")
    assert records == _records(tmp_path / "one")
    captions = {r[k] for r in records for k in ("txt", "txt_flip.txt") if k in r}
    assert manifest.text_encoder["count"] == len(captions)  # the captions of both ranks' images
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]  # no staging folder left
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(
        ["cache.json", "text_embeds.json", "text_embeds.safetensors", *manifest.shards])
    assert two.stdout.count("wrote 50 latent") == 1 and "encoded 50 images into 5 shard(s) on 2 processes" in two.stderr


@pytest.mark.dist  # several processes: make test-dist
def test_encode_of_webdataset_shards_on_two_processes_writes_the_cache_of_one(vae_run, tmp_path):
    """5 source shards of 10 records: rank 0 reads the first 2, rank 1 the other 3. The batch of 8 that straddles
    them on one process (records 16-23) is two batches on two, so codes agree to float rounding; all else exactly."""
    data = ["--set", "data.source=shards", "--set", f"data.path={tmp_path / 'src'}/shapes-{{000000..000004}}.tar"]
    made = subprocess.run([sys.executable, "-m", "genforge", "data", "shapes", "--out", str(tmp_path / "src"), "--n",
                           "50", "--image-size", "16", "--shards", "--shard-size", "10"], env=_env(), timeout=120)
    assert made.returncode == 0
    args = ["encode", str(vae_run), *data, "--batch-size", "8", "--shard-size", "16"]
    one = _genforge([*args, "--out", str(tmp_path / "one")])
    two = _genforge([*args, "--out", str(tmp_path / "two")], processes=2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-3000:]
    assert (tmp_path / "one" / "cache.json").read_text() == (tmp_path / "two" / "cache.json").read_text()
    ones, twos = _records(tmp_path / "one"), _records(tmp_path / "two")
    assert len(ones) == len(twos) == 50
    for a, b in zip(ones, twos):
        assert a.keys() == b.keys() and all(a[k] == b[k] for k in a if not k.endswith(".npy"))
        for key in (k for k in a if k.endswith(".npy")):
            np.testing.assert_allclose(np.load(io.BytesIO(a[key])), np.load(io.BytesIO(b[key])), atol=2e-3)


@pytest.mark.dist  # several processes: make test-dist
def test_a_failure_on_one_rank_of_an_encode_leaves_no_cache(vae_run, tmp_path):
    """Rank 1's encoder raises after it wrote shards: every rank stops, and neither the cache folder nor its
    staging folder (with rank 0's shards) is left."""
    done = _genforge(["encode", str(vae_run), "--out", str(tmp_path / "cache"), "--set", "data.shapes.n=50",
                      "--batch-size", "12", "--shard-size", "10"], processes=2, GENFORGE_TEST_FAIL_RANK="1")
    assert done.returncode != 0
    assert "injected failure on rank 1" in done.stderr
    assert list(tmp_path.iterdir()) == []
