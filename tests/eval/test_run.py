"""Evaluation of tokenizers (reconstructions of held-out images) next to the generator path."""

import json
import math
import sys
import pytest
import torch
from torch import nn

from genforge.app.config import load_config
from genforge.core.config import DataConfig, EvalConfig
from genforge.core.registry import METRICS
from genforge.core.task import Task
from genforge.data.loader import heldout_split
from genforge.eval.metrics import EvalContext, check_metrics
from genforge.eval.run import evaluate_task, evaluate_tokenizer
from genforge.tokenizers.standins import SpaceToDepthCodec
from genforge.core.config import SampleOptions
from kill_harness import run, train_argv


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
    results = evaluate_task(Tokenizer(SpaceToDepthCodec()), cfg.data, cfg.eval, ["psnr", "ssim", "perceptual"], n=5,
                            seed=0, device="cpu")
    assert results["n"] == 5 and results["split"] == "val"
    assert math.isinf(results["psnr"]) and results["ssim"] == pytest.approx(1.0)
    assert abs(results["perceptual"]) < 1e-6
    again = evaluate_tokenizer(SpaceToDepthCodec(), check_metrics(["ssim"], ("tokenizer",)),
                               EvalContext(cfg.data, cfg.eval, n=5, device="cpu"), batch_size=2)
    assert again == {"n": 5, "split": "val", "ssim": pytest.approx(1.0)}


def test_token_codec_reports_codebook_usage(cfg):
    results = evaluate_task(Tokenizer(GreyCodec()), cfg.data, cfg.eval, ["psnr", "codebook"], n=6, seed=0,
                            device="cpu")
    assert set(results) == {"n", "split", *METRICS.get("psnr").results, *METRICS.get("codebook").results,
                            "codebook_histogram"}
    assert len(results["codebook_histogram"]) == 16 and sum(results["codebook_histogram"]) == 6 * 16 * 16
    assert 5 < results["psnr"] < 60
    assert results["codebook_usage"] == (16 - results["codebook_dead"]) / 16
    assert 1 <= results["codebook_perplexity"] <= 16 - results["codebook_dead"]


def test_metric_of_the_wrong_kind_is_a_clear_error(cfg):
    def evaluate(task, metrics, options=None):
        return evaluate_task(task, cfg.data, cfg.eval, metrics, n=2, seed=0, device="cpu", options=options)

    with pytest.raises(ValueError, match=r"'judge' needs a generator; this model is a discrete tokenizer"):
        evaluate(Tokenizer(GreyCodec()), ["psnr", "judge"])
    with pytest.raises(ValueError, match=r"'psnr' needs a tokenizer; this model is a generator"):
        evaluate(Task(), ["psnr"])
    with pytest.raises(ValueError, match=r"'ssim'.*a generator"):
        evaluate(LatentGenerator(), ["ssim"])
    with pytest.raises(ValueError, match="'codebook' needs a discrete tokenizer"):
        evaluate(Tokenizer(SpaceToDepthCodec()), ["codebook"])
    with pytest.raises(ValueError, match="unknown metric 'nope'"):
        evaluate(Task(), ["nope"])
    with pytest.raises(ValueError, match="sampler options"):
        evaluate(Tokenizer(GreyCodec()), ["psnr"], SampleOptions(steps=4))


def test_held_out_split_and_metric_names():
    assert heldout_split(DataConfig(source="folder", path="x")) == "train"
    assert heldout_split(DataConfig(source="folder", path="x", val_fraction=0.1)) == "val"
    assert heldout_split(DataConfig()) == "val"  # shapes: another seed
    assert {"judge", "fid", "kid", "is", "prdc", "psnr", "ssim", "perceptual", "codebook"} <= set(METRICS)
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


class ClipCodec(nn.Module):
    """A video tokenizer stand-in: `keep` returns every clip as it is; otherwise each frame becomes the clip's
    first-frame mean colour (no shape, no motion)."""

    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.keep = keep

    def encode(self, clips: torch.Tensor) -> torch.Tensor:
        return clips if self.keep else clips[:, :, :1].mean((3, 4), keepdim=True).expand_as(clips)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return codes


def test_reconstruction_judge_and_direction_of_a_video_tokenizer():
    cfg = load_config("cvivit-debug")  # 16px moving shapes, 5 frames
    ctx = EvalContext(cfg.data, cfg.eval, n=24, device="cpu")
    metrics = check_metrics(["recon_judge", "recon_direction"], ("tokenizer",))
    exact = evaluate_tokenizer(ClipCodec(keep=True), metrics, ctx, batch_size=10)  # batches of 10, 10, 4 clips
    assert exact["n"] == 24 and exact["direction_accuracy"] == 1.0 and exact["direction_still"] == 0.0
    assert exact["judge_accuracy"] > 0.8  # the judge reads real frames
    by_frame = exact["judge_kind_by_frame"]  # the kind's share in each of the 5 frames, averaging to the whole
    assert len(by_frame) == 5 and sum(by_frame) / 5 == pytest.approx(exact["judge_kind_accuracy"], abs=1e-3)
    flat = evaluate_tokenizer(ClipCodec(keep=False), metrics, ctx, batch_size=10)
    assert flat["direction_still"] == 1.0 and flat["direction_accuracy"] == 0.0
    assert flat["judge_accuracy"] < 0.5 * exact["judge_accuracy"]
    with pytest.raises(ValueError, match="'recon_direction' needs a video tokenizer trained on"):
        evaluate_tokenizer(ClipCodec(keep=True), check_metrics(["recon_direction"], ("tokenizer",)),
                           EvalContext(load_config("dit-debug").data, cfg.eval, n=2, device="cpu"))
