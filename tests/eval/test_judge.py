import ast
import fnmatch
from pathlib import Path

import pytest
import torch

from genforge.data.shapes import render_batch
from genforge.eval import judge as judge_module
from genforge.eval.judge import (JUDGE_VERSION, SHIPPED_JUDGE, ShapesJudge, judge_accuracy, judge_report, kind_by_frame,
                                  load_judge, load_or_train_judge, save_judge, train_judge)

ROOT = Path(__file__).parents[2]


def package_data() -> dict[str, list[str]]:
    """pyproject.toml's [tool.setuptools.package-data] (`key = [patterns]` lines; tomllib needs Python 3.11)."""
    section = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-data]")[1].split("\n[")[0]
    pairs = [line.split("=", 1) for line in section.splitlines() if "=" in line and not line.startswith("#")]
    return {ast.literal_eval(key.strip()): ast.literal_eval(value.split("#")[0].strip()) for key, value in pairs}


def test_the_shipped_judge_is_package_data_named_by_its_version():
    assert SHIPPED_JUDGE.is_file() and SHIPPED_JUDGE.name == f"shapes-judge-{JUDGE_VERSION}.safetensors"
    assert SHIPPED_JUDGE.stat().st_size < 1_000_000
    patterns = package_data()
    relative = SHIPPED_JUDGE.relative_to(ROOT / "genforge" / "eval").as_posix()  # what a wheel of `pip install .` carries
    assert any(fnmatch.fnmatch(relative, pattern) for key in ("*", "genforge.eval") for pattern in patterns.get(key, []))


def test_the_shipped_judge_scores_98_percent_on_unseen_shapes():
    # seed 30_000: neither the training images (10_000 + seed) nor train_judge's own held-out images (20_000 + seed)
    images, labels = render_batch(2000, 32, seed=30_000)
    assert judge_accuracy(load_judge(SHIPPED_JUDGE), images, labels) >= 0.98


def test_loading_the_shipped_judge_trains_nothing(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("train_judge called although the judge ships with genforge")

    monkeypatch.setattr(judge_module, "train_judge", refuse)
    monkeypatch.setattr(judge_module, "_LOADED", {})  # as in a new process
    judge = load_or_train_judge(tmp_path)
    assert not judge.training and not any(tmp_path.iterdir())  # nothing cached either
    assert load_or_train_judge() is judge  # loaded once per process
    shipped = load_judge(SHIPPED_JUDGE).state_dict()
    assert all(torch.equal(v, shipped[k]) for k, v in judge.state_dict().items())


def test_quick_judge_beats_chance_and_round_trips(tmp_path):
    rng_state = torch.random.get_rng_state()
    judge, accuracy = train_judge(steps=60, batch_size=64, train_images=1500, heldout_images=300)
    assert accuracy > 0.25  # chance is 1/16
    assert torch.equal(torch.random.get_rng_state(), rng_state)  # a training run's RNG stream is untouched
    save_judge(judge, tmp_path / "j.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["j.safetensors"]  # no temporary file left behind
    again = load_judge(tmp_path / "j.safetensors")
    images, _ = render_batch(8, 32, seed=5)
    judge.eval()
    assert torch.equal(judge(images), again(images))


def test_any_resolution_and_accuracy_arithmetic():
    judge = ShapesJudge().eval()
    for size in (16, 32, 50):
        images, _ = render_batch(6, size, seed=1)
        assert judge(images).shape == (6, 16)
    predicted = judge(images).argmax(1)
    labels = predicted.clone()
    labels[:2] = (labels[:2] + 1) % 16
    assert judge_accuracy(judge, images, labels) == 4 / 6
    assert judge_accuracy(judge, images, labels, batch_size=4) == 4 / 6
    with pytest.raises(ValueError):
        judge_accuracy(judge, images, labels[:3])


def test_without_the_shipped_file_the_judge_is_trained_once_and_cached(tmp_path, monkeypatch, status):
    calls = []

    def quick_train():
        calls.append(1)
        return ShapesJudge(), 0.5

    monkeypatch.setattr(judge_module, "train_judge", quick_train)
    monkeypatch.setattr(judge_module, "SHIPPED_JUDGE", tmp_path / "missing.safetensors")  # e.g. a trimmed source tree
    judge = load_or_train_judge(tmp_path)
    path = tmp_path / "judge" / "shapes-judge-v1.safetensors"
    assert path.is_file() and not judge.training and "training" in status.text
    judge_module._LOADED.clear()  # a new process: loads the cached file, trains nothing
    load_or_train_judge(tmp_path)
    assert len(calls) == 1


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GENFORGE_CACHE", str(tmp_path))
    assert judge_module.judge_cache_path() == tmp_path / "judge" / "shapes-judge-v1.safetensors"


def test_judge_report_splits_kind_and_colour():
    class Fixed(ShapesJudge):
        def forward(self, images):  # predicts label 5 (green square) for every image
            return torch.nn.functional.one_hot(torch.full((len(images),), 5), 16).float()

    images = torch.zeros(4, 3, 32, 32)
    # 5 = (square, green): exact; 4 = (square, red): kind only; 1 = (circle, green): colour only; 0: neither
    report = judge_report(Fixed(), images, torch.tensor([5, 4, 1, 0]))
    assert report == {"judge_accuracy": 0.25, "judge_kind_accuracy": 0.5, "judge_colour_accuracy": 0.5}


def test_kind_by_frame_is_the_kind_share_of_each_frame():
    labels = torch.tensor([5, 8])  # (square, green), (triangle, red)
    preds = torch.tensor([[5, 4, 0],  # kind right, right (red square), wrong
                          [9, 1, 8]])  # kind right (green triangle), wrong, right
    assert kind_by_frame(preds, labels) == [1.0, 0.5, 0.5]
