"""Text embeddings in a cache (`genforge encode --text-encoder`): each distinct caption stored once, looked up per
sample (the mirrored caption for a flipped one), equal to a fresh encode; refusals and atomic writing."""

import json

import pytest
import torch
from fake_tokenizer import fake_tokenizer  # noqa: F401 (fixture)
from typer.testing import CliRunner

from genforge.cli import app
from genforge.app.config import load_config
from genforge.app.encode import encode_dataset
from genforge.data.cache import MANIFEST, CacheDataset, CacheError, read_manifest
from genforge.data.images import flip_drawn
from genforge.core.errors import ConfigError
from genforge.data.text_embeds import CAPTIONS_FILE, EMBEDS_FILE
from genforge.text.encoders import use_cached_text_embeds
from genforge.app.runs import load_codec
from genforge.text import TextEncoderConfig, build_text_encoder

runner = CliRunner()
TEXT = TextEncoderConfig(kind="minilm", max_length=16)


def _encode(run, out, text=TEXT, flip=True):
    codec, info = load_codec(run)
    return encode_dataset(codec, info, load_config(str(run / "config.yaml")).data, out, flip=flip, batch_size=16,
                          shard_size=16, text=text)


def _flipping_seed(want: bool) -> int:
    return next(seed for seed in range(100) if flip_drawn(seed) == want)


def test_distinct_captions_stored_once_and_equal_to_a_fresh_encode(tmp_path, fake_tokenizer):
    manifest = _encode(fake_tokenizer(tmp_path / "tok"), tmp_path / "cache")
    entry = manifest.text_encoder
    encoder = build_text_encoder(TEXT, memo=False)
    assert entry["kind"] == "minilm" and entry["path"] is None and entry["max_length"] == 16
    assert entry["fingerprint"] == encoder.fingerprint() and entry["dim"] == 384
    assert entry["files"] == {"embeds": EMBEDS_FILE, "captions": CAPTIONS_FILE}
    assert read_manifest(tmp_path / "cache") == manifest
    assert manifest.data_info().text_encoder == encoder.fingerprint()

    cache = CacheDataset(tmp_path / "cache", flip=True)
    captions = json.loads((tmp_path / "cache" / CAPTIONS_FILE).read_text())["captions"]
    occurrences = [c for pair in zip(cache.texts, cache.texts_flip) for c in pair]
    assert captions == list(dict.fromkeys(occurrences))  # each distinct caption once, mirrored ones too
    assert len(captions) < len(occurrences) and entry["count"] == len(captions)
    assert any(a != b for a, b in zip(cache.texts, cache.texts_flip))

    samples = [cache[(index, seed)] for index in range(40) for seed in (_flipping_seed(False), _flipping_seed(True))]
    assert [s["text"] for s in samples] == occurrences
    fresh, fresh_mask = encoder.encode([s["text"] for s in samples])  # [80, n, D], padded to the longest
    embeds, masks = torch.stack([s["text_embed"] for s in samples]), torch.stack([s["text_mask"] for s in samples])
    assert embeds.dtype == torch.float32 and masks.dtype == torch.bool
    assert embeds.shape == (80, entry["length"], 384) and masks.shape == (80, entry["length"])
    n = fresh.shape[1]
    assert n == entry["length"] and torch.equal(masks, fresh_mask) and (embeds[~masks] == 0).all()
    torch.testing.assert_close(embeds, fresh, atol=2e-3, rtol=1e-3)  # float16 storage


def test_family_check_refuses_embeddings_of_another_encoder(tmp_path, fake_tokenizer):
    manifest = _encode(fake_tokenizer(tmp_path / "tok"), tmp_path / "cache", flip=False)
    data = manifest.data_info()
    assert use_cached_text_embeds(data.text_encoder, build_text_encoder(TEXT), str(tmp_path / "cache"))
    assert not use_cached_text_embeds(data.text_encoder, build_text_encoder(TextEncoderConfig(kind="tiny")), None)
    with pytest.raises(ConfigError, match="written by another text encoder") as refused:
        use_cached_text_embeds(data.text_encoder, build_text_encoder(TextEncoderConfig(max_length=32)),
                               str(tmp_path / "cache"))
    assert "max_length=16" in str(refused.value) and "max_length=32" in str(refused.value)
    assert CacheDataset(tmp_path / "cache")[0]["text_embed"].shape[-1] == 384
    (tmp_path / "cache" / EMBEDS_FILE).write_bytes(b"torn")
    with pytest.raises(CacheError, match="text embeddings of .* are not readable"):
        CacheDataset(tmp_path / "cache")


def test_a_cache_without_text_encoder_has_no_embeddings(tmp_path, fake_tokenizer):
    manifest = _encode(fake_tokenizer(tmp_path / "tok"), tmp_path / "cache", text=None, flip=False)
    assert manifest.text_encoder is None and manifest.data_info().text_encoder is None
    assert "text_embed" not in CacheDataset(tmp_path / "cache")[0]
    assert not (tmp_path / "cache" / EMBEDS_FILE).exists()


def test_a_failed_text_encode_leaves_nothing(tmp_path, fake_tokenizer, monkeypatch):
    from genforge.app import encode

    def killed(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(encode, "write_text_embeds", killed)
    with pytest.raises(RuntimeError, match="killed"):
        _encode(fake_tokenizer(tmp_path / "tok"), tmp_path / "cache")
    assert not (tmp_path / "cache").exists() and not list(tmp_path.glob(".tmp-*"))


def test_cli_encodes_text_and_refuses_a_trainable_encoder(tmp_path, fake_tokenizer):
    tok = fake_tokenizer(tmp_path / "tok")
    out = runner.invoke(app, ["encode", str(tok), "--out", str(tmp_path / "c"), "--set", "data.shapes.n=12",
                              "--text-encoder", "minilm", "--text-max-length", "12"])
    assert out.exit_code == 0, out.output
    assert "minilm text embeddings of" in out.stdout and "distinct captions" in out.stdout
    manifest = json.loads((tmp_path / "c" / MANIFEST).read_text())
    assert manifest["text_encoder"]["max_length"] == 12
    for args, message in [
        (["--text-encoder", "tiny"], "only frozen text encoders (minilm, t5, clip) can be cached"),
        (["--text-encoder", "t5"], "model.text.path"),
        (["--text-encoder-path", "x"], "--text-encoder-path applies to --text-encoder"),
    ]:
        out = runner.invoke(app, ["encode", str(tok), "--out", str(tmp_path / "d"), *args])
        assert out.exit_code == 2 and message in out.stderr, out.output
        assert not (tmp_path / "d").exists()
