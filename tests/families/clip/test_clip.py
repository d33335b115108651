"""clip: the family contract, the InfoNCE loss against a hand computation, the temperature cap, unit-norm embeddings
(the text embedding pooled from the tower's states), 2 processes = 1 process on the same global batch, and the
zero-shot / retrieval metrics on known embeddings."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from family_contract import FamilyContract
from safetensors.torch import load_file

from genforge.app.config import load_config
from genforge.app.runs import build_task, load_codec, load_run, make_trainer
from genforge.core.codec import TextTowerEmbedder, codec_kind
from genforge.eval.embedding_metrics import retrieval_recall, zero_shot_accuracy
from genforge.eval.run import evaluate_task
from genforge.families.clip.task import contrastive_loss

ENGINE_TESTS = Path(__file__).parents[2] / "engine"


class TestContract(FamilyContract):
    preset = "clip-debug"


def test_infonce_equals_the_hand_computed_symmetric_cross_entropy():
    image = F.normalize(torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]]), dim=-1)
    text = F.normalize(torch.tensor([[0.8, 0.6], [0.0, 1.0], [1.0, 1.0]]), dim=-1)
    scale = torch.tensor(10.0)
    loss, logs = contrastive_loss(image, text, scale)
    sim = (image @ text.T) * 10
    expected = 0.0
    for i in range(3):  # -log softmax of the matching pair, rows (image→text) and columns (text→image)
        expected += -(sim[i, i] - torch.logsumexp(sim[i], 0)) / 6 - (sim[i, i] - torch.logsumexp(sim[:, i], 0)) / 6
    assert torch.allclose(loss, expected)
    swapped, _ = contrastive_loss(text, image, scale)
    assert torch.allclose(loss, swapped)  # symmetric
    assert logs["accuracy"] == (sim.argmax(1) == torch.arange(3)).float().mean()


def test_embeddings_are_unit_norm_and_the_logit_scale_is_capped():
    cfg = load_config("clip-debug")
    task = build_task(cfg)
    model = task.codec()
    assert codec_kind(model) == "image_embed" and model.has_text
    images = torch.rand(4, 3, 16, 16) * 2 - 1
    assert torch.allclose(model.embed_images(images).norm(dim=-1), torch.ones(4), atol=1e-5)
    assert torch.allclose(model.embed_images(F.interpolate(images, size=24)).norm(dim=-1), torch.ones(4), atol=1e-5)
    assert torch.allclose(model.embed_texts(["a red circle", "x"]).norm(dim=-1), torch.ones(2), atol=1e-5)
    # its text embedding is a function of the tower's states (what a cache stores per caption): the same pooling
    assert isinstance(model, TextTowerEmbedder) and model.text_tower() is model.text_encoder
    states, mask = model.text_tower().encode(["a red circle", "x"])
    padded = torch.cat([states, torch.randn(2, 3, states.shape[2])], 1), F.pad(mask, (0, 3))  # pads never count
    assert torch.equal(model.embed_encodings(states, mask), model.embed_texts(["a red circle", "x"]))
    assert torch.allclose(model.embed_encodings(*padded), model.embed_texts(["a red circle", "x"]), atol=1e-6)
    assert model.logit_scale().item() == pytest.approx(1 / 0.07, rel=1e-5)  # CLIP's initial temperature
    with torch.no_grad():
        model.log_logit_scale.fill_(10.0)
    assert model.logit_scale().item() == pytest.approx(100.0)
    with pytest.raises(ValueError, match="model.init_temperature"):
        load_config("clip-debug", ["model.init_temperature=0.001"])


@pytest.mark.dist  # several processes: make test-dist
def test_two_processes_train_the_model_one_process_trains(tmp_path):
    """The loss is over the global batch gathered with gradients: 2 processes of 4 rows = 1 process of 8."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ENGINE_TESTS.parent), GENFORGE_TEST_PRESET="clip-debug")
    worker = str(ENGINE_TESTS / "ddp_worker.py")
    args = ["train.steps=3", "train.checkpoint_every=3", "train.sample_every=0"]
    subprocess.run([sys.executable, worker, str(tmp_path / "one"), str(tmp_path), *args], env=env, check=True,
                   timeout=300)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", worker,
                    str(tmp_path / "two"), str(tmp_path), *args], env=env, check=True, timeout=300)
    one = load_file(str(tmp_path / "rank0-of1.safetensors"))
    r0, r1 = (load_file(str(tmp_path / f"rank{r}-of2.safetensors")) for r in (0, 1))
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    assert one.keys() == r0.keys()
    for k in one:
        a, b = one[k], r0[k]
        if k.endswith("attn.qkv.bias"):
            # the key bias adds q·b_k to every logit of a row, which softmax ignores: its gradient is zero up to
            # rounding, and Adam's first steps turn that noise into lr-sized steps of either sign; compare q and v
            width = len(a) // 3
            a, b = torch.cat([a[:width], a[2 * width:]]), torch.cat([b[:width], b[2 * width:]])
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=k)


def test_zero_shot_and_retrieval_on_known_embeddings():
    classes = torch.eye(3)
    images = F.normalize(torch.tensor([[1.0, 0.1, 0], [0.1, 1.0, 0], [0, 0.2, 1.0], [0.3, 0, 1.0]]), dim=-1)
    assert zero_shot_accuracy(images, classes, torch.tensor([0, 1, 2, 0])) == 0.75  # image 3 looks like class 2
    captions = ["a", "b", "c", "a"]  # images 0 and 3 share a caption: retrieving either is right
    texts = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0]])
    recall = retrieval_recall(images, texts, captions, ks=(1, 2))
    assert recall["i2t_r1"] == 0.75 and recall["i2t_r2"] == 1.0  # image 3 finds "c" first, "a" second
    assert recall["t2i_r1"] == 1.0  # every text finds an image with its caption first (text 3 finds image 0)


def test_clip_run_is_an_embedder_for_encode_and_eval(tmp_path):
    make_trainer(load_config("clip-debug", ["train.steps=2", "train.checkpoint_every=2"]), tmp_path / "clip").fit()
    codec, info = load_codec(tmp_path / "clip")
    assert info.kind == "image_embed" and info.channels == 16
    cfg = load_config("clip-debug")
    run = load_run(tmp_path / "clip")
    results = evaluate_task(run.task, cfg.data, cfg.eval, ["zero_shot", "retrieval"], n=32, seed=0, device="cpu")
    assert 0 <= results["zero_shot_accuracy"] <= 1 and results["zero_shot_classes"] == 16
    assert results["zero_shot_prompts"][0] == "a large red circle"
    assert {"retrieval_i2t_r1", "retrieval_t2i_r5"} <= set(results)
    with pytest.raises(ValueError, match="metric 'judge' needs a generator"):
        evaluate_task(run.task, cfg.data, cfg.eval, ["judge"], n=4, seed=0, device="cpu")
