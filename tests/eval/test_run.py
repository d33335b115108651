"""Evaluation of tokenizers (reconstructions of held-out images) next to the generator path."""

import json
import math
import sys
from typing import get_args

import pytest
import torch
from torch import nn

from genforge.config import load_config
from genforge.config.base import METRIC_RESULTS, DataConfig, EvalConfig, MetricName
from genforge.engine.task import Task
from genforge.eval.run import evaluate_task, evaluate_tokenizer, heldout_split
from genforge.nn.codec import SpaceToDepthCodec
from genforge.testing import run, train_argv


class GreyCodec(nn.Module):
    """A TokenCodec stand-in: the grey level of each pixel quantised to 16 codes."""

    codebook_size, downsample = 16, 1

    def encode(self, image: torch.Tensor) -> torch.Tensor:
        return ((image.mean(1) + 1) / 2 * 15).round().long()  # [B, H, W]

    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids.float() / 15 * 2 - 1).unsqueeze(1).expand(-1, 3, -1, -1)


class Tokenizer(Task):
    def __init__(self, codec: nn.Module) -> None:
        super().__init__()
        self.the_codec = codec

    def codec(self) -> nn.Module:
        return self.the_codec


class LatentGenerator(Task):
    """Like DiT: an attribute named `codec` (its latent codec), which must not make it a tokenizer."""

    def __init__(self) -> None:
        super().__init__()
        self.codec = SpaceToDepthCodec()


@pytest.fixture(scope="module")
def cfg():
    return load_config("dit-debug")  # 16px shapes


def test_exact_codec_scores_perfectly_on_held_out_images(cfg):
    results = evaluate_task(Tokenizer(SpaceToDepthCodec()), cfg, ["psnr", "ssim", "perceptual"], n=5, seed=0,
                            device="cpu")
    assert results["n"] == 5 and results["split"] == "val"
    assert math.isinf(results["psnr"]) and results["ssim"] == pytest.approx(1.0)
    assert abs(results["perceptual"]) < 1e-6
    again = evaluate_tokenizer(SpaceToDepthCodec(), cfg, ["ssim"], n=5, device="cpu", batch_size=2)
    assert again == {"n": 5, "split": "val", "ssim": pytest.approx(1.0)}


def test_token_codec_reports_codebook_usage(cfg):
    results = evaluate_task(Tokenizer(GreyCodec()), cfg, ["psnr", "codebook"], n=6, seed=0, device="cpu")
    assert set(results) == {"n", "split", *METRIC_RESULTS["psnr"], *METRIC_RESULTS["codebook"], "codebook_histogram"}
    assert len(results["codebook_histogram"]) == 16 and sum(results["codebook_histogram"]) == 6 * 16 * 16
    assert 5 < results["psnr"] < 60
    assert results["codebook_usage"] == (16 - results["codebook_dead"]) / 16
    assert 1 <= results["codebook_perplexity"] <= 16 - results["codebook_dead"]


def test_metric_of_the_wrong_kind_is_a_clear_error(cfg):
    with pytest.raises(ValueError, match=r"'judge'.*'dit' \(a tokenizer\)"):
        evaluate_task(Tokenizer(GreyCodec()), cfg, ["psnr", "judge"], n=2, seed=0, device="cpu")
    with pytest.raises(ValueError, match=r"'psnr'.*'dit' \(a generator\)"):
        evaluate_task(Task(), cfg, ["psnr"], n=2, seed=0, device="cpu")
    with pytest.raises(ValueError, match=r"'ssim'.*\(a generator\)"):
        evaluate_task(LatentGenerator(), cfg, ["ssim"], n=2, seed=0, device="cpu")
    with pytest.raises(ValueError, match="'codebook' needs a discrete tokenizer"):
        evaluate_task(Tokenizer(SpaceToDepthCodec()), cfg, ["codebook"], n=2, seed=0, device="cpu")
    with pytest.raises(ValueError, match="sampler options"):
        evaluate_task(Tokenizer(GreyCodec()), cfg, ["psnr"], n=2, seed=0, device="cpu", steps=4)


def test_held_out_split_and_metric_names():
    assert heldout_split(DataConfig(source="folder", path="x")) == "train"
    assert heldout_split(DataConfig(source="folder", path="x", val_fraction=0.1)) == "val"
    assert heldout_split(DataConfig()) == "val"  # shapes: another seed
    assert set(get_args(MetricName)) == set(METRIC_RESULTS)
    assert EvalConfig(metrics=["psnr", "codebook"]).metrics == ["psnr", "codebook"]


def test_klvae_debug_train_then_eval_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    trained = run(train_argv(run_dir, ["train.sample_every=0"], preset="klvae-debug"))
    assert trained.returncode == 0, trained.stderr[-2000:]
    scored = run([sys.executable, "-m", "genforge", "eval", str(run_dir), "--metrics", "psnr,ssim", "--n", "8"])
    assert scored.returncode == 0, scored.stderr[-2000:]
    (out,) = (run_dir / "eval").glob("*.json")
    results = json.loads(out.read_text())
    assert results["n"] == 8 and {"psnr", "ssim", "step"} <= set(results) and out.stem == str(results["step"])
