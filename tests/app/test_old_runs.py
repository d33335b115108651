"""Runs written before the one-way architecture (tests/fixtures/runs-42ccac9, one per family, by commit 42ccac9)
still resume, sample and evaluate with today's code: same config keys, checkpoint files and weight names."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from eval.eval_standins import TinyFeatures
from genforge.app.runs import load_run
from genforge.cli import app
from genforge.eval import metrics as metrics_module
from genforge.sampling import generate

FIXTURES = Path(__file__).parent.parent / "fixtures" / "runs-42ccac9"
METRIC = {"dit": "fid", "dit-latent": "fid", "maskgit": "fid", "dvae": "psnr,codebook", "klvae": "psnr",
          "vqgan": "psnr,codebook"}
runner = CliRunner()


@pytest.mark.parametrize("family", sorted(METRIC))
def test_an_old_run_resumes_samples_and_evaluates(family, tmp_path, monkeypatch):
    run = tmp_path / family
    shutil.copytree(FIXTURES / family, run)
    monkeypatch.setattr(metrics_module, "feature_network", lambda device: TinyFeatures())

    resumed = runner.invoke(app, ["train", str(run / "config.yaml"), "--run-dir", str(run), "--set", "train.steps=3",
                                  "--set", "train.checkpoint_every=3"])
    assert resumed.exit_code == 0, resumed.output
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000003"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "event" not in r] == [1, 2, 3]  # continued from the old checkpoint at 2
    changed = [r["message"] for r in records if r.get("event") == "config_change"]
    assert len(changed) == 1 and "train.steps: 2 -> 3" in changed[0]  # the old config.yaml read through today's

    sampled = runner.invoke(app, ["sample", str(run), "--n", "2", "--out", str(tmp_path / "s.png")])
    assert sampled.exit_code == 0, sampled.output
    scored = runner.invoke(app, ["eval", str(run), "--metrics", METRIC[family], "--n", "4"])
    assert scored.exit_code == 0, scored.output
    assert json.loads((run / "eval" / "3.json").read_text())["n"] == 4


BEFORE_HOUSE = Path(__file__).parent.parent / "fixtures" / "runs-3f8e24e"


@pytest.mark.parametrize("name", ["dit", "unet", "dit-latent", "maskgit", "phenaki", "dalle2_decoder", "dvae", "vqgan",
                                  "klvae", "cvivit"])
def test_a_run_written_before_the_house_change_samples_as_it_did_then(name):
    """Every family's run written at 3f8e24e (the `dit` family name, held-out prompts kept in the family state)
    loads and makes the samples it made then: bit for bit on the CPU that wrote them; torch's CPU kernels round
    differently on another instruction set (AVX2 / AVX-512: up to 4e-6 here), so the bound is float rounding, far
    below what a changed weight, seed or sampler step gives."""
    expected = load_file(str(BEFORE_HOUSE / "expected-samples.safetensors"))[name]
    run = load_run(BEFORE_HOUSE / name)
    images, _ = generate(run.task, 4, 0, "cpu")
    torch.testing.assert_close(images, expected, rtol=0, atol=1e-5)
