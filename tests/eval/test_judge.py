import torch

from genforge.data.shapes import render_batch
from genforge.eval.judge import ShapesJudge, judge_accuracy, load_judge, save_judge, train_judge


def test_quick_judge_beats_chance_and_round_trips(tmp_path):
    judge, accuracy = train_judge(steps=60, batch_size=64, train_images=1500, heldout_images=300)
    assert accuracy > 0.25  # chance is 1/16
    save_judge(judge, tmp_path / "j.safetensors")
    again = load_judge(tmp_path / "j.safetensors")
    images, _ = render_batch(8, 32, seed=5)
    judge.eval()
    assert torch.equal(judge(images), again(images))


def test_any_resolution_and_accuracy_arithmetic():
    judge = ShapesJudge().eval()
    images, labels = render_batch(6, 64, seed=1)
    logits = judge(images)
    assert logits.shape == (6, 16)
    predicted = logits.argmax(1)
    labels = predicted.clone()
    labels[:2] = (labels[:2] + 1) % 16
    assert judge_accuracy(judge, images, labels) == 4 / 6
