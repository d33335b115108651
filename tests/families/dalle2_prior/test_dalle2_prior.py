"""dalle2_prior: the family contract (over a tiny trained clip run), the causal mask, the x₀ target (unit-norm CLIP
image embedding · √D), reranking of candidates by similarity to the caption, and the prior's similarity metric on
known embeddings."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import genforge
from genforge.families.dalle2_prior.config import Dalle2PriorSampleOptions
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
from genforge.core.errors import ConfigError
from genforge.core.random import BatchRandom
from genforge.data.base import collate
from genforge.data.cache import MANIFEST, CacheDataset, read_manifest
from genforge.data.text_embeds import TextEmbeds
from genforge.eval.embedding_metrics import prior_similarities, unrelated_rows
import genforge.families.dalle2_prior.task as prior_task
from genforge.families.dalle2_prior.model import PriorNetwork
from genforge.families.dalle2_prior.task import Dalle2PriorTask, rerank
from genforge.text.tiny import TinyTextEncoder
from genforge.families.dalle2_decoder.config import Dalle2SampleOptions

runner = CliRunner()
CLIP_RUN = Path(tempfile.gettempdir()) / f"genforge-test-prior-clip-{os.getpid()}"
CACHE = CLIP_RUN.with_name(f"{CLIP_RUN.name}-cache")  # `genforge encode CLIP_RUN` of 32 shapes, + flipped
ON_CLIP = (f"model.embedder.path={CLIP_RUN}",)
ON_CACHE = (*ON_CLIP, "data.source=cache", f"data.path={CACHE}")


@pytest.fixture(scope="module", autouse=True)
def clip_run():
    """A clip-debug run trained 3 steps: the frozen CLIP of the prior tests; and its cache of 32 captioned shapes."""
    if not (CLIP_RUN / "checkpoints" / "latest").is_file():
        cfg = load_config("clip-debug", ["train.steps=3", "train.checkpoint_every=3", "train.sample_every=0",
                                         "eval.every=0"])
        make_trainer(cfg, CLIP_RUN).fit()
    if not (CACHE / MANIFEST).is_file():
        codec, info = load_codec(CLIP_RUN)
        data = load_config("dalle2-prior-debug", [*ON_CLIP, "data.shapes.n=32"]).data
        encode_dataset(codec, info, data, CACHE, flip=True)
    yield CLIP_RUN
    shutil.rmtree(CLIP_RUN, ignore_errors=True)
    shutil.rmtree(CACHE, ignore_errors=True)


class TestContract(FamilyContract):
    preset = "dalle2-prior-debug"
    overrides = ON_CLIP

    def test_sample_shape_and_range(self):
        """A prior samples unit-norm image embeddings [n, D], reproducibly."""
        _, task, _ = self.build()
        task.eval()
        cond = task.sample_conditions(2, torch.Generator().manual_seed(0), task.resolve())
        out = task.sample(cond, torch.Generator().manual_seed(0), 2, task.resolve())
        assert out.shape == (2, task.embed_dim) and torch.allclose(out.norm(dim=-1), torch.ones(2), atol=1e-5)
        again = task.sample(cond, torch.Generator().manual_seed(0), 2, task.resolve())
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
    found = prior_similarities(predicted, text, captions, image)  # one candidate each: single = reranked
    assert found == pytest.approx({"text_similarity_single": 1.0, "text_similarity_reranked": 1.0,
                                   "unrelated_text_similarity_single": 0.0, "unrelated_text_similarity_reranked": 0.0,
                                   "image_similarity_single": 0.75, "image_similarity_reranked": 0.75,
                                   "baseline_similarity": 0.75})


def test_the_similarity_of_one_candidate_and_of_the_reranked_one():
    """From k candidates per caption in the order drawn: `_single` is the first one's (one draw, unbiased),
    `_reranked` the one most similar to the caption's (what the decoder gets; chosen by it, so never lower)."""
    captions = ["red", "blue"]
    text = torch.eye(3)[[0, 1]]
    first = F.normalize(torch.tensor([[0.6, 0.8, 0.0], [0.0, 0.6, 0.8]]), dim=-1)  # text similarity 0.6 each
    second = F.normalize(torch.tensor([[0.8, 0.0, 0.6], [0.0, 0.0, 1.0]]), dim=-1)  # 0.8, then 0.0
    image = torch.eye(3)[[2, 2]]
    found = prior_similarities(torch.stack([first, second], dim=1), text, captions, image)
    assert found["text_similarity_single"] == pytest.approx(0.6)
    assert found["text_similarity_reranked"] == pytest.approx((0.8 + 0.6) / 2)  # row 0 keeps the second
    assert found["image_similarity_single"] == pytest.approx((0.0 + 0.8) / 2)
    assert found["image_similarity_reranked"] == pytest.approx((0.6 + 0.8) / 2)
    assert found["unrelated_text_similarity_reranked"] == pytest.approx((0.0 + 0.0) / 2)  # row 0's against blue


def test_a_trained_prior_opens_and_evaluates(tmp_path):
    cfg = load_config("dalle2-prior-debug", [*ON_CLIP, "train.steps=2", "train.checkpoint_every=2",
                                             "train.sample_every=2", "eval.every=0"])
    make_trainer(cfg, tmp_path / "prior").fit()
    assert (tmp_path / "prior" / "samples" / "step-000002.png").is_file()  # nearest held-out images
    run = load_run(tmp_path / "prior")
    gen = torch.Generator().manual_seed(0)
    cond = run.task.sample_conditions(4, gen, run.task.resolve())
    assert {"text", "image_embed", "caption_embed", "label"} <= set(cond)



def test_encoding_the_clip_run_stores_its_text_towers_states_once_per_caption(tmp_path):
    """`genforge encode CLIP_RUN`: the image embeddings and, through the text_embeds mechanism, the run's own text
    tower's states of each distinct caption (flipped ones too), equal to the tower's to float16; uncaptioned images
    get their embeddings only."""
    manifest, (codec, info) = read_manifest(CACHE), load_codec(CLIP_RUN)
    entry = manifest.text_encoder
    assert manifest.kind == "image_embed" and entry["kind"] == "tiny" and entry["path"] == str(CLIP_RUN.resolve())
    assert entry["fingerprint"] == codec.text_tower().fingerprint() and entry["dim"] == codec.text_width
    cache = CacheDataset(CACHE, flip=True)
    distinct = list(dict.fromkeys(c for pair in zip(cache.texts, cache.texts_flip) for c in pair))
    stored = TextEmbeds(CACHE, entry)
    assert list(stored.index) == distinct and entry["count"] == len(distinct)
    states, mask = codec.encode_texts(distinct)  # [U, L, W_t], padded to the longest, as stored
    assert torch.equal(stored.mask, mask)
    torch.testing.assert_close(stored.embeds.float(), states, atol=2e-3, rtol=1e-3)
    assert runner.invoke(app, ["data", "shapes", "--out", str(tmp_path / "images"), "--n", "4"]).exit_code == 0
    for caption in (tmp_path / "images").rglob("*.txt"):
        caption.unlink()
    folder = load_config("clip-debug", ["data.source=folder", f"data.path={tmp_path / 'images'}"]).data
    assert encode_dataset(codec, info, folder, tmp_path / "cache", flip=False).text_encoder is None


def test_cached_states_give_the_live_conditions_and_loss_without_the_text_tower(monkeypatch):
    """The prior on the cache pools the stored states as the CLIP does (`embed_encodings`): the conditions and the
    loss of a cached batch are those of the same batch with the tower run, to float16 rounding."""
    task = build_task(load_config("dalle2-prior-debug", list(ON_CACHE)))
    assert task.use_cached_text
    cache = CacheDataset(CACHE)
    batch = collate([cache[i] for i in range(8)])
    live = {k: v for k, v in batch.items() if k not in ("text_embed", "text_mask")}
    torch.manual_seed(0)
    live_loss, _ = task.loss({**live, "rng": BatchRandom(0, 0, 0, 8, 0, 8)}, "main", 0)
    expected = task.text_conditions(live["text"], torch.device("cpu"))

    def never(*args, **kwargs):
        raise AssertionError("the text tower ran")

    monkeypatch.setattr(task.embedder.text_encoder, "encode", never)
    torch.manual_seed(0)
    cached_loss, _ = task.loss({**batch, "rng": BatchRandom(0, 0, 0, 8, 0, 8)}, "main", 0)
    assert abs(cached_loss.item() - live_loss.item()) <= 1e-3 * abs(live_loss.item())
    found = task.encoding_conditions(batch["text_embed"], batch["text_mask"])
    torch.testing.assert_close(found["text_embed"], expected["text_embed"], atol=1e-3, rtol=1e-3)
    n = expected["text_tokens"].shape[1]  # the batch's longest caption; the cache pads to its longest
    torch.testing.assert_close(found["text_tokens"][:, :n], expected["text_tokens"], atol=2e-3, rtol=1e-3)
    assert torch.equal(found["text_mask"][:, :n], expected["text_mask"]) and not found["text_mask"][:, n:].any()


def test_the_prior_trains_from_the_cache_through_the_cli_without_the_text_tower(tmp_path, monkeypatch):
    """`genforge train dalle2-prior-debug --set data.source=cache ...`: no training step runs the text tower (the
    previews of prompts do), and a stopped run resumes to the weights of one run straight."""
    calls, in_loss, loss, encode = [], [False], Dalle2PriorTask.loss, TinyTextEncoder.encode

    def spied_loss(self, *args):
        in_loss[0] = True
        try:
            return loss(self, *args)
        finally:
            in_loss[0] = False

    monkeypatch.setattr(Dalle2PriorTask, "loss", spied_loss)
    monkeypatch.setattr(TinyTextEncoder, "encode", lambda self, texts: calls.append(in_loss[0]) or encode(self, texts))
    overrides = [*ON_CACHE, "data.flip=true", "train.steps=4", "train.checkpoint_every=2", "train.log_every=1",
                 "train.sample_every=0", "eval.every=0"]
    args = ["train", "dalle2-prior-debug", *[a for o in overrides for a in ("--set", o)]]
    assert runner.invoke(app, [*args, "--dry-run"]).exit_code == 0
    make_trainer(load_config("dalle2-prior-debug", overrides), tmp_path / "resumed").fit(stop_at=2)
    for run in ("straight", "resumed"):
        result = runner.invoke(app, [*args, "--run-dir", str(tmp_path / run)])
        assert result.exit_code == 0, result.output
    assert calls and not any(calls)  # the final previews encoded their prompts; no loss did
    straight, resumed = (load_file(str(tmp_path / run / "checkpoints" / "step-000004" / "model.safetensors"))
                         for run in ("straight", "resumed"))
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)
    losses = [[json.loads(line)["loss"] for line in open(tmp_path / run / "metrics.jsonl")]
              for run in ("straight", "resumed")]
    assert losses[0] == losses[1] and len(losses[0]) == 4


def test_sampling_a_prior_whose_cache_is_gone_exits_2_saying_why(tmp_path):
    """The grid of a prior shows held-out images nearest its embeddings; with the cache it trained on deleted there
    are none: exit 2 with the reason and where the embeddings are, never a traceback."""
    cache = tmp_path / "cache"
    shutil.copytree(CACHE, cache)
    overrides = [*ON_CLIP, "data.source=cache", f"data.path={cache}", "train.steps=1", "train.sample_every=0",
                 "eval.every=0"]
    result = runner.invoke(app, ["train", "dalle2-prior-debug", "--run-dir", str(tmp_path / "run"),
                                 *[a for o in overrides for a in ("--set", o)]])
    assert result.exit_code == 0, result.output
    shutil.rmtree(cache)
    result = runner.invoke(app, ["sample", str(tmp_path / "run"), "--prompt", "a red circle", "--n", "2"])
    assert result.exit_code == 2, result.output
    assert "no held-out images to show" in result.output and "output='tensor'" in result.output


def test_a_cache_of_another_text_encoders_embeddings_is_refused(tmp_path):
    """`genforge encode CLIP_RUN --text-encoder minilm` stores MiniLM's embeddings instead of the tower's: the prior
    refuses them (exit 2, --dry-run too) and says what to do; `--text-encoder none` stores none."""
    for name, extra in [("minilm", ["--text-encoder", "minilm"]), ("none", ["--text-encoder", "none"])]:
        result = runner.invoke(app, ["encode", str(CLIP_RUN), "--out", str(tmp_path / name), "--set",
                                     "data.shapes.n=8", *extra])
        assert result.exit_code == 0, result.output
    assert read_manifest(tmp_path / "minilm").text_encoder["kind"] == "minilm"
    assert read_manifest(tmp_path / "none").text_encoder is None
    args = ["train", "dalle2-prior-debug", "--set", f"model.embedder.path={CLIP_RUN}", "--set", "data.source=cache",
            "--set", f"data.path={tmp_path / 'minilm'}", "--set", "train.steps=1", "--run-dir", str(tmp_path / "p")]
    for extra in (["--dry-run"], []):
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 2, result.output
        assert "written by another text encoder" in result.stderr and "without --text-encoder" in result.stderr
    with pytest.raises(ConfigError, match="needs model.embedder.source=clip_run"):
        load_config("dalle2-prior-debug", ["model.embedder.source=clip_pretrained", "model.embedder.path=x",
                                           "data.source=cache", f"data.path={CACHE}"])


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
    cond = decoder.sample_conditions(4, gen, decoder.resolve(Dalle2SampleOptions(prior=prior)))
    assert {"text", "label", "image_embed"} <= set(cond) and "image" not in cond
    expected = prior.image_embeds_for(cond["text"], torch.Generator().manual_seed(0))
    assert torch.equal(cond["image_embed"], expected)  # the prior's draws, in caption order
    shortcut = decoder.sample_conditions(4, torch.Generator().manual_seed(0),
                                         decoder.resolve(Dalle2SampleOptions(from_captions=True)))
    assert torch.allclose(shortcut["image_embed"], prior.text_embeds(shortcut["text"]), atol=1e-5)
    images = decoder.sample(cond, torch.Generator().manual_seed(0), 4,
                            decoder.resolve(Dalle2SampleOptions(prior=prior)))
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


# ------------------------------------------------------------------- sampling options and the chain's flags
QUICK = ["train.steps=2", "train.checkpoint_every=2", "train.sample_every=0", "eval.every=0"]


def test_ddim_eta_zero_makes_each_candidate_a_function_of_its_noise_and_one_draws_more():
    """DDIM's η (Song et al. 2021, eq. 16) from model.diffusion.ddim_eta or the `ddim_eta` option: at 0 the generator
    is read once, for x_T (each candidate a function of its starting noise), at 1 every step but the last adds noise
    from it, so the same x_T gives other candidates; each is reproducible from its seed."""
    task = _prior(candidates=1).eval()
    texts = ["a large red circle", "a large blue square"]
    x_T_only = torch.Generator().manual_seed(0)
    torch.randn((2, task.embed_dim), generator=x_T_only)
    gen = torch.Generator().manual_seed(0)
    eta0 = task.image_embeds_for(texts, gen, Dalle2PriorSampleOptions(ddim_eta=0.0))
    assert torch.equal(gen.get_state(), x_T_only.get_state())
    gen = torch.Generator().manual_seed(0)
    eta1 = task.image_embeds_for(texts, gen, Dalle2PriorSampleOptions(ddim_eta=1.0))
    assert not torch.equal(gen.get_state(), x_T_only.get_state())
    assert not torch.allclose(eta0, eta1)
    assert torch.equal(eta1, task.image_embeds_for(texts, torch.Generator().manual_seed(0), Dalle2PriorSampleOptions(ddim_eta=1.0)))
    assert task.resolve().ddim_eta == task.cfg.diffusion.ddim_eta  # unset: the config's
    with pytest.raises(ValueError, match="ddim_eta"):
        Dalle2PriorSampleOptions(ddim_eta=2.0)


def test_sampling_keeps_every_candidate_when_asked():
    task = _prior(candidates=3).eval()
    options = task.resolve(Dalle2PriorSampleOptions(keep_candidates=True))
    cond = task.sample_conditions(2, torch.Generator().manual_seed(0), options)
    every = task.sample(cond, torch.Generator().manual_seed(0), 2, options)
    kept = task.sample(cond, torch.Generator().manual_seed(0), 2, task.resolve())
    assert every.shape == (2, 3, task.embed_dim)
    assert torch.equal(kept, rerank(every, cond["caption_embed"]))


def test_evaluation_reports_the_similarity_of_one_candidate_and_of_the_reranked_one(tmp_path):
    """`genforge eval PRIOR --metrics prior_similarity` draws every candidate once and reports both figures; the
    reranked text similarity is at least the single one's (chosen by it); with --candidates 1 they are equal."""
    make_trainer(load_config("dalle2-prior-debug", [*ON_CLIP, *QUICK]), tmp_path / "prior").fit()
    run = genforge.load_run(tmp_path / "prior", device="cpu")
    two = run.evaluate("prior_similarity", n=16)
    assert two["prior_candidates"] == 2 and two["sampler"]["candidates"] == 2
    assert two["prior_text_similarity_reranked"] >= two["prior_text_similarity_single"]
    one = run.evaluate("prior_similarity", n=16, candidates=1, ddim_eta=1.0)
    assert one["prior_candidates"] == 1 and one["sampler"]["ddim_eta"] == 1.0
    assert one["prior_text_similarity_single"] == one["prior_text_similarity_reranked"]
    result = runner.invoke(app, ["eval", str(tmp_path / "prior"), "--metrics", "prior_similarity", "--n", "8",
                                 "--ddim-eta", "1", "--candidates", "3"])
    assert result.exit_code == 0, result.output
    assert "prior_text_similarity_single:" in result.output and "prior_candidates: 3" in result.output


def test_the_priors_steps_guidance_and_eta_reach_it_through_the_decoder(tmp_path, monkeypatch):
    """`genforge sample|eval DECODER --prior PRIOR --prior-steps S --prior-cfg-scale G --prior-ddim-eta E
    --prior-candidates K`: the prior samples with them (and eval records them); without --prior they exit 2."""
    make_trainer(load_config("dalle2-prior-debug", [*ON_CLIP, *QUICK]), tmp_path / "prior").fit()
    on_clip = ["model.embedder.source=clip_run", f"model.embedder.path={CLIP_RUN}"]
    make_trainer(load_config("dalle2-decoder-debug", [*on_clip, *QUICK]), tmp_path / "dec").fit()
    seen = []
    original = prior_task.sample_diffusion

    def spy(cfg, **kwargs):
        seen.append((kwargs["steps"], kwargs["cfg_scale"], cfg.ddim_eta, kwargs["shape"][0]))
        return original(cfg, **kwargs)

    monkeypatch.setattr(prior_task, "sample_diffusion", spy)
    flags = ["--prior", str(tmp_path / "prior"), "--prior-steps", "3", "--prior-cfg-scale", "2.5",
             "--prior-ddim-eta", "1", "--prior-candidates", "3"]
    result = runner.invoke(app, ["sample", str(tmp_path / "dec"), *flags, "--prompt", "a large red circle", "--n",
                                 "2", "--steps", "2", "--out", str(tmp_path / "t2i.png")])
    assert result.exit_code == 0, result.output
    assert seen == [(3, 2.5, 1.0, 2 * 3)]  # 2 captions × 3 candidates
    seen.clear()
    result = runner.invoke(app, ["eval", str(tmp_path / "dec"), *flags, "--metrics", "judge", "--n", "4",
                                 "--steps", "2"])
    assert result.exit_code == 0, result.output
    assert seen == [(3, 2.5, 1.0, 4 * 3)]
    recorded = json.loads((tmp_path / "dec" / "eval" / "2.json").read_text())["sampler"]["prior"]
    assert recorded == {"sampler": "ddim", "steps": 3, "cfg_scale": 2.5, "ddim_eta": 1.0, "candidates": 3}
    seen.clear()
    runner.invoke(app, ["sample", str(tmp_path / "dec"), "--prior", str(tmp_path / "prior"), "--prompt", "a red "
                        "circle", "--n", "2", "--steps", "2", "--out", str(tmp_path / "defaults.png")])
    prior_cfg = load_config(str(tmp_path / "prior" / "config.yaml")).model
    assert seen == [(prior_cfg.diffusion.sample_steps, prior_cfg.diffusion.cfg_scale, prior_cfg.diffusion.ddim_eta,
                     2 * prior_cfg.candidates)]  # unset: the prior run's config
    result = runner.invoke(app, ["sample", str(tmp_path / "dec"), "--prior-steps", "3", "--prompt", "a red circle",
                                 "--n", "2", "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and "--prior-steps" in result.output
