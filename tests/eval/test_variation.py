"""The `variation` metric: PSNR / SSIM / perceptual distance between samples and their source images."""

import math

import pytest
import torch
from eval_standins import NoisyCopier, NoiseGenerator

from genforge.core.config import DataConfig, EvalConfig
from genforge.eval.run import evaluate_task


def test_variation_metric_measures_the_distance_to_the_source():
    data, eval_cfg = DataConfig(source="shapes", image_size=16), EvalConfig()
    close = evaluate_task(NoisyCopier(0.01), data, eval_cfg, ["variation"], n=32, seed=0, device="cpu")
    far = evaluate_task(NoisyCopier(0.3), data, eval_cfg, ["variation"], n=32, seed=0, device="cpu")
    # MSE = σ² in [-1, 1] units: PSNR = 10·log10(2² / σ²)
    assert close["variation_psnr"] == pytest.approx(10 * math.log10(4 / 0.01**2), abs=0.3)
    assert far["variation_psnr"] == pytest.approx(10 * math.log10(4 / 0.3**2), abs=0.3)
    assert close["variation_ssim"] > 0.99 > far["variation_ssim"]
    assert close["variation_perceptual"] < far["variation_perceptual"]


def test_variation_needs_source_images():
    with pytest.raises(ValueError, match="metric 'variation' needs samples made from source images"):
        evaluate_task(NoiseGenerator(), DataConfig(source="shapes", image_size=16), EvalConfig(), ["variation"], n=4,
                      seed=0, device="cpu")
