"""dalle2_prior: the family contract (over a tiny trained clip run), the causal mask, the x₀ target (unit-norm CLIP
image embedding · √D), reranking of candidates by similarity to the caption, and the prior's similarity metric on
known embeddings."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import genforge
import torch.nn.functional as F
from family_contract import FamilyContract
from safetensors.torch import load_file
from tiny_clip import pretrained_clip_folder
from typer.testing import CliRunner

from genforge.app.config import load_config
from genforge.app.encode import encode_dataset
from genforge.app.runs import build_task, load_codec, load_run, make_trainer
from genforge.cli import app
from genforge.core.codec import TextEncodingEmbedder, TextToImageEmbedding
from genforge.core.random import BatchRandom
from genforge.eval.embedding_metrics import prior_similarities, unrelated_rows
from genforge.families.dalle2_prior.model import PriorNetwork
from genforge.families.dalle2_prior.task import rerank

runner = CliRunner()
CLIP_RUN = Path(tempfile.gettempdir()) / f"genforge-test-prior-clip-{os.getpid()}"
ON_CLIP = (f"model.embedder.path={CLIP_RUN}",)


@pytest.fixture(scope="module", autouse=True)
def clip_run():
    """A clip-debug run trained 3 steps: the frozen CLIP of the prior tests."""
    if not (CLIP_RUN / "checkpoints" / "latest").is_file():
        cfg = load_config("clip-debug", ["train.steps=3", "train.checkpoint_every=3", "train.sample_every=0",
                                         "eval.every=0"])
        make_trainer(cfg, CLIP_RUN).fit()
    yield CLIP_RUN
    shutil.rmtree(CLIP_RUN, ignore_errors=True)


class TestContract(FamilyContract):
    preset = "dalle2-prior-debug"
    overrides = ON_CLIP

    def test_sample_shape_and_range(self):
        """A prior samples unit-norm image embeddings [n, D], reproducibly."""
        _, task, _ = self.build()
        task.eval()
        cond = task.sample_conditions(2, torch.Generator().manual_seed(0))
        out = task.sample(cond, torch.Generator().manual_seed(0), n=2)
        assert out.shape == (2, task.embed_dim) and torch.allclose(out.norm(dim=-1), torch.ones(2), atol=1e-5)
        again = task.sample(cond, torch.Generator().manual_seed(0), n=2)
        assert torch.equal(out, again)


def _prior(**overrides):
    return build_task(load_config("dalle2-prior-debug", [*ON_CLIP, *[f"model.{k}={v}" for k, v in overrides.items()]]))


def test_a_later_position_never_changes_an_earlier_output():
    torch.manual_seed(0)
    net = PriorNetwork(embed_dim=8, width=16, depth=2, num_heads=2, text_dim=12, max_text_tokens=5).eval()
    b = 3
    inputs = dict(t=torch.tensor([1, 50, 99]), text_embed=torch.randn(b, 8), text_tokens=torch.randn(b, 4, 12),
                  text_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]).bool())
    x = torch.randn(b, 8)
    states = net.token_states(x, **inputs)  # [B, N, W], N = 5 + 4; x_t is position N - 2
    moved = net.token_states(x + 5.0, **inputs)
    n = states.shape[1]
    assert n == 9
    assert torch.equal(states[:, : n - 2], moved[:, : n - 2])  # text, text embedding, time: unchanged
    assert not torch.allclose(states[:, n - 2 :], moved[:, n - 2 :])  # x_t and the query see it
    caption = dict(inputs, text_embed=inputs["text_embed"] + 1.0)  # the text embedding (position 5) moves
    assert torch.equal(net.token_states(x, **caption)[:, :5], states[:, :5])


def test_the_target_is_the_unit_norm_clip_image_embedding_times_sqrt_d(monkeypatch):
    task = _prior()
    cfg = load_config("dalle2-prior-debug", list(ON_CLIP))
    images = torch.rand(4, 3, 16, 16) * 2 - 1
    captured = {}

    def capture(model, x0, time, noise, model_kwargs=None):
        captured.update(x0=x0, kwargs=model_kwargs)
        return {"loss": x0.new_zeros(len(x0)) + x0.sum() * 0}

    monkeypatch.setattr(task.objective, "training_losses", capture)
    batch = {"image": images, "text": ["a large red circle"] * 4, "rng": BatchRandom(0, 0, 0, 4, 0, 4)}
    task.loss(batch, "main", 0)
    x0, d = captured["x0"], task.embed_dim
    clip = task.embedder.embed_images(images)
    assert torch.allclose(x0.norm(dim=-1), torch.full((4,), math.sqrt(d)), atol=1e-4)
    assert torch.allclose(x0 / math.sqrt(d), F.normalize(clip, dim=-1), atol=1e-6)
    assert torch.allclose(captured["kwargs"]["text_embed"], task.embedder.embed_texts(batch["text"]), atol=1e-6)
    assert cfg.model.diffusion.prediction == "x0" and not cfg.model.diffusion.learn_sigma


def test_reranking_keeps_the_candidate_most_similar_to_the_caption():
    text = F.normalize(torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), dim=-1)
    candidates = F.normalize(torch.tensor([[[0.2, 1.0, 0.0], [0.9, 0.1, 0.0], [0.5, 0.5, 0.5]],
                                           [[0.0, 0.7, 0.7], [1.0, 0.0, 0.0], [0.1, 0.9, 0.0]]]), dim=-1)
    best = rerank(candidates, text)
    assert torch.equal(best, torch.stack([candidates[0, 1], candidates[1, 2]]))


def test_sampling_draws_candidates_per_caption_and_returns_the_reranked_ones(monkeypatch):
    task = _prior(candidates=3).eval()
    drawn = {}
    original = rerank

    def spy(candidates, text_embed):
        drawn["shape"] = tuple(candidates.shape)
        return original(candidates, text_embed)

    monkeypatch.setattr("genforge.families.dalle2_prior.task.rerank", spy)
    out = task.image_embeds_for(["a large red circle", "a large blue square"], torch.Generator().manual_seed(0))
    assert drawn["shape"] == (2, 3, task.embed_dim) and out.shape == (2, task.embed_dim)
    assert isinstance(task, TextToImageEmbedding) and isinstance(task.embedder, TextEncodingEmbedder)


def test_the_similarity_metric_on_known_embeddings():
    captions = ["red", "red", "blue", "green"]
    assert unrelated_rows(captions).tolist() == [2, 2, 3, 0]
    text = torch.eye(4)[[0, 0, 1, 2]]  # red, red, blue, green
    image = torch.eye(4)[[0, 3, 1, 2]]  # row 1's image is off its caption
    predicted = text.clone()
    found = prior_similarities(predicted, text, captions, image)
    assert found == pytest.approx({"text": 1.0, "unrelated_text": 0.0, "image": 0.75, "baseline": 0.75})


def test_a_trained_prior_opens_and_evaluates(tmp_path):
    cfg = load_config("dalle2-prior-debug", [*ON_CLIP, "train.steps=2", "train.checkpoint_every=2",
                                             "train.sample_every=2", "eval.every=0"])
    make_trainer(cfg, tmp_path / "prior").fit()
    assert (tmp_path / "prior" / "samples" / "step-000002.png").is_file()  # nearest held-out images
    run = load_run(tmp_path / "prior")
    gen = torch.Generator().manual_seed(0)
    cond = run.task.sample_conditions(4, gen)
    assert {"text", "image_embed", "caption_embed", "label"} <= set(cond)



def test_it_trains_on_a_cache_of_the_clip_runs_embeddings(tmp_path):
    """`genforge encode CLIP_RUN` once: the prior reads the stored image embeddings (checked against the run)."""
    codec, info = load_codec(CLIP_RUN)
    cfg = load_config("dalle2-prior-debug", [*ON_CLIP, "data.shapes.n=32"])
    encode_dataset(codec, info, cfg.data, tmp_path / "cache", flip=True)
    on_cache = load_config("dalle2-prior-debug", [*ON_CLIP, "data.source=cache", f"data.path={tmp_path / 'cache'}",
                                                  "train.steps=2", "train.checkpoint_every=2", "train.sample_every=0",
                                                  "eval.every=0"])
    make_trainer(on_cache, tmp_path / "prior").fit()
    assert (tmp_path / "prior" / "checkpoints" / "step-000002").is_dir()


def test_text_to_image_through_the_prior_and_the_decoder(tmp_path):
    """`genforge sample DECODER --prior PRIOR --prompt ...`, and held-out captions through both for the judge; a
    decoder over another CLIP refuses the prior."""
    quick = ["train.steps=2", "train.checkpoint_every=2", "train.sample_every=0", "eval.every=0"]
    make_trainer(load_config("dalle2-prior-debug", [*ON_CLIP, *quick]), tmp_path / "prior").fit()
    on_clip = ["model.embedder.source=clip_run", f"model.embedder.path={CLIP_RUN}"]
    make_trainer(load_config("dalle2-decoder-debug", [*on_clip, *quick]), tmp_path / "dec").fit()
    result = runner.invoke(app, ["sample", str(tmp_path / "dec"), "--prior", str(tmp_path / "prior"), "--prompt",
                                 "a large red circle", "--n", "2", "--out", str(tmp_path / "t2i.png")])
    assert result.exit_code == 0, result.output
    decoder, prior = load_run(tmp_path / "dec").task, load_run(tmp_path / "prior").task
    gen = torch.Generator().manual_seed(0)
    cond = decoder.sample_conditions(4, gen, prior=prior)
    assert {"text", "label", "image_embed"} <= set(cond) and "image" not in cond
    expected = prior.image_embeds_for(cond["text"], torch.Generator().manual_seed(0))
    assert torch.equal(cond["image_embed"], expected)  # the prior's draws, in caption order
    shortcut = decoder.sample_conditions(4, torch.Generator().manual_seed(0), from_captions=True)
    assert torch.allclose(shortcut["image_embed"], prior.text_embeds(shortcut["text"]), atol=1e-5)
    images = decoder.sample(cond, torch.Generator().manual_seed(0), 4, prior=prior)
    assert images.shape == (4, 3, 16, 16)
    api = genforge.load_run(tmp_path / "dec", device="cpu")  # the Python API: a path or an opened run
    by_path = api.sample(n=2, prompt="a large red circle", prior=str(tmp_path / "prior"), steps=2)
    by_run = api.sample(n=2, prompt="a large red circle", prior=genforge.load_run(tmp_path / "prior"), steps=2)
    assert by_path.shape == (2, 3, 16, 16) and torch.equal(by_path, by_run)
    other = tmp_path / "clip2"
    make_trainer(load_config("clip-debug", [*quick, "train.seed=7"]), other).fit()
    make_trainer(load_config("dalle2-decoder-debug", ["model.embedder.source=clip_run",
                                                      f"model.embedder.path={other}", *quick]), tmp_path / "dec2").fit()
    result = runner.invoke(app, ["sample", str(tmp_path / "dec2"), "--prior", str(tmp_path / "prior"), "--prompt",
                                 "a large red circle", "--n", "2", "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and "another CLIP" in result.output


def test_a_pretrained_clip_folder_as_the_embedder(tmp_path):
    """model.embedder.source=clip_pretrained: the prior trains over a local CLIPModel's towers (its per-token text
    states included), samples unit-norm embeddings of its width, and keeps the CLIP out of its checkpoints."""
    clip_dir = pretrained_clip_folder(tmp_path / "clip")
    cfg = load_config("dalle2-prior-debug", ["model.embedder.source=clip_pretrained", f"model.embedder.path={clip_dir}",
                                             "train.steps=2", "train.checkpoint_every=2", "train.sample_every=0",
                                             "eval.every=0"])
    make_trainer(cfg, tmp_path / "prior").fit()
    names = load_file(str(tmp_path / "prior" / "checkpoints" / "step-000002" / "model.safetensors")).keys()
    assert names and all(name.startswith("model.") for name in names)  # the prior network only
    task = load_run(tmp_path / "prior").task
    assert isinstance(task.embedder.module, TextEncodingEmbedder) and task.embed_dim == 24
    out = task.image_embeds_for(["a red circle", "a blue square"], torch.Generator().manual_seed(0))
    assert out.shape == (2, 24) and torch.allclose(out.norm(dim=-1), torch.ones(2), atol=1e-5)
