"""Latent / token caches: round trip, flipped variant, atomic writing, unreadable shards, training on one."""

import hashlib
import json

import pytest
import torch
from fake_tokenizer import fake_tokenizer  # noqa: F401 (fixture)

from genforge.app.config import ConfigError, load_config
from genforge.core.codec import CodecInfo
from genforge.core.config import DataConfig
from genforge.tokenizers.standins import PooledPixelEmbedder
from genforge.app.encode import encode_dataset
from genforge.data.cache import MANIFEST, CacheDataset, CacheError, read_manifest
from genforge.data.loader import StepBatchSampler, build_dataset, data_info
from genforge.data.shapes import mirror_caption
from genforge.app.runs import load_codec
from kill_harness import same_run


def _encode(tokenizer_dir, out, flip=True, shard_size=16, data=None):
    codec, info = load_codec(tokenizer_dir)
    cfg = data or load_config(str(tokenizer_dir / "config.yaml")).data
    return codec, encode_dataset(codec, info, cfg, out, flip=flip, batch_size=12, shard_size=shard_size)


def _shapes(n=40, flip=False):
    return build_dataset(load_config("dit-latent-debug", [f"data.shapes.n={n}"]).data, flip=flip)


def test_load_codec_hashes_the_ema_checkpoint(tmp_path, fake_tokenizer):
    run = fake_tokenizer(tmp_path / "tok")
    codec, info = load_codec(run)
    ema = run / "checkpoints" / "step-000001" / "ema.safetensors"
    assert info.encoder_hash == hashlib.sha256(ema.read_bytes()).hexdigest()
    assert (info.kind, info.channels, info.downsample, info.step) == ("latent", 12, 2, 1)
    assert not any(p.requires_grad for p in codec.parameters())
    with pytest.raises(ConfigError, match="not a tokenizer"):
        load_codec(fake_tokenizer(tmp_path / "not", kind=None))
    with pytest.raises(ConfigError, match="not a run directory"):
        load_codec(tmp_path)


def test_latent_round_trip_with_flipped_variant(tmp_path, fake_tokenizer):
    codec, manifest = _encode(fake_tokenizer(tmp_path / "tok"), tmp_path / "cache")
    assert (manifest.kind, manifest.shape, manifest.dtype, manifest.count) == ("latent", [12, 8, 8], "float16", 40)
    assert manifest.shards == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert manifest.preprocessing.flip_variants == ["none", "horizontal"]
    assert read_manifest(tmp_path / "cache") == manifest

    source = _shapes()
    images = torch.stack([source[i]["image"] for i in range(40)])
    cache = CacheDataset(tmp_path / "cache", flip=True)
    base = [cache[i] for i in range(40)]  # no aug seed: never flipped
    assert torch.equal(torch.stack([s["latent"] for s in base]), codec.encode(images).half().float())
    assert [s["key"] for s in base] == [source[i]["key"] for i in range(40)]
    assert [s["label"] for s in base] == [source[i]["label"] for i in range(40)]
    assert [s["text"] for s in base] == [source[i]["text"] for i in range(40)]
    assert torch.equal(cache.codes_flip.float(), codec.encode(images.flip(-1)).half().float())
    assert cache.texts_flip == [mirror_caption(t) for t in cache.texts]


def test_sampler_items_flip_like_the_image_data_set(tmp_path, fake_tokenizer):
    """A run on the cache sees the codes of exactly the images (flipped or not) a run on pixels sees."""
    codec, _ = _encode(fake_tokenizer(tmp_path / "tok"), tmp_path / "cache")
    cache, source = CacheDataset(tmp_path / "cache", flip=True), _shapes(flip=True)
    items = next(iter(StepBatchSampler(40, 40, seed=3)))
    images = torch.stack([source[item]["image"] for item in items])
    assert torch.equal(torch.stack([cache[item]["latent"] for item in items]), codec.encode(images).half().float())
    assert [cache[item]["text"] for item in items] == [source[item]["text"] for item in items]
    assert any(not torch.equal(cache[item]["latent"], cache[item[0]]["latent"]) for item in items)  # some flipped


def test_token_round_trip(tmp_path, fake_tokenizer):
    codec, manifest = _encode(fake_tokenizer(tmp_path / "tok", kind="tokens"), tmp_path / "cache", flip=False)
    assert (manifest.kind, manifest.shape, manifest.dtype) == ("tokens", [8, 8], "int16")
    cache = CacheDataset(tmp_path / "cache")
    images = torch.stack([_shapes()[i]["image"] for i in range(40)])
    assert torch.equal(torch.stack([cache[i]["tokens"] for i in range(40)]), codec.encode(images).flatten(1))
    assert cache[0]["tokens"].dtype == torch.long
    cfg = load_config("dit-latent-debug", ["data.source=cache", f"data.path={tmp_path / 'cache'}",
                                           "data.flip=false", "model.latent.codec=tokenizer",
                                           f"model.latent.tokenizer={tmp_path / 'tok'}"]).data
    assert data_info(build_dataset(cfg), cfg).kind == "tokens"


def test_a_failed_encode_leaves_no_manifest_and_no_folder(tmp_path, fake_tokenizer, monkeypatch):
    run = fake_tokenizer(tmp_path / "tok")
    codec, info = load_codec(run)
    calls = []

    def failing(image):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return image[:, :, ::2, ::2].repeat(1, 4, 1, 1)

    monkeypatch.setattr(codec, "encode", failing)
    with pytest.raises(RuntimeError, match="killed"):
        encode_dataset(codec, info, load_config(str(run / "config.yaml")).data, tmp_path / "cache", flip=False,
                       batch_size=8, shard_size=8)
    assert not (tmp_path / "cache").exists() and not list(tmp_path.glob(".tmp-*"))
    (tmp_path / "half").mkdir()  # shards without a manifest
    (tmp_path / "half" / "shard-000000.tar").write_bytes(b"")
    with pytest.raises(CacheError, match="no cache.json"):
        CacheDataset(tmp_path / "half")


def test_refuses_a_non_empty_output_folder_and_cached_input(tmp_path, fake_tokenizer):
    run = fake_tokenizer(tmp_path / "tok")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "x").write_text("x")
    with pytest.raises(CacheError, match="not empty"):
        _encode(run, tmp_path / "cache")
    with pytest.raises(CacheError, match="encode reads images"):
        _encode(run, tmp_path / "c2", data=DataConfig(source="cache", path=str(tmp_path / "cache")))


def test_unreadable_or_missing_shard_is_named(tmp_path, fake_tokenizer):
    _encode(fake_tokenizer(tmp_path / "tok"), tmp_path / "cache", flip=False)
    shard = tmp_path / "cache" / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:3000])
    with pytest.raises(CacheError, match="shard-000001.tar is not a readable cache shard"):
        CacheDataset(tmp_path / "cache")
    shard.unlink()
    with pytest.raises(CacheError, match="shard-000001.tar is missing"):
        CacheDataset(tmp_path / "cache")
    with pytest.raises(CacheError, match="no flipped variant"):
        CacheDataset(tmp_path / "cache", flip=True)
    (tmp_path / "cache" / MANIFEST).write_text(json.dumps({"kind": "latent"}))
    with pytest.raises(CacheError, match="not a readable cache manifest"):
        CacheDataset(tmp_path / "cache")


def _dit_on_cache(tokenizer, cache):
    return ["data.source=cache", f"data.path={cache}", "model.latent.codec=tokenizer",
            f"model.latent.tokenizer={tokenizer}", "train.log_every=1", "train.ema_decay=0.9"]


def test_dit_trains_from_a_cache_and_resumes_exactly(tmp_path, fake_tokenizer):
    from genforge.app.runs import make_trainer

    run = fake_tokenizer(tmp_path / "tok")
    _encode(run, tmp_path / "cache")
    cfg = load_config("dit-latent-debug", _dit_on_cache(run, tmp_path / "cache"))
    straight = make_trainer(cfg, tmp_path / "straight")
    straight.fit()
    assert straight.state.step == 4 and "latent" in straight.state.dataset[0]
    interrupted = tmp_path / "interrupted"
    make_trainer(cfg, interrupted).fit(stop_at=2)
    make_trainer(cfg, interrupted).fit()
    assert same_run(tmp_path / "straight", interrupted)


def test_dit_refuses_the_cache_of_another_tokenizer(tmp_path, fake_tokenizer):
    from genforge.app.runs import build_task

    _encode(fake_tokenizer(tmp_path / "tok"), tmp_path / "cache")
    other = fake_tokenizer(tmp_path / "other", scale=0.25)
    with pytest.raises(CacheError) as refused:
        build_task(load_config("dit-latent-debug", _dit_on_cache(other, tmp_path / "cache")), device="meta")
    tok, oth = load_codec(tmp_path / "tok")[1], load_codec(other)[1]
    for name in (tok.encoder_hash, oth.encoder_hash, tok.checkpoint, oth.checkpoint, str(tmp_path / "cache")):
        assert name in str(refused.value)
    with pytest.raises(ValueError, match="tokenizer of discrete tokens; model.family=diffusion models continuous latents"):
        build_task(load_config("dit-latent-debug", _dit_on_cache(
            fake_tokenizer(tmp_path / "vq", kind="tokens"), tmp_path / "cache")), device="meta")


@pytest.mark.parametrize("overrides, message", [
    (["data.source=cache"], "data.path (a folder written by `genforge encode`) is required"),
    (["data.source=cache", "data.path=c"], "data.source=cache needs model.latent.codec=tokenizer"),
    (["model.latent.codec=tokenizer"], "model.latent.tokenizer (a tokenizer run directory) is required"),
    (["model.latent.tokenizer=runs/vae"], "model.latent.tokenizer applies to model.latent.codec=tokenizer"),
    (["model.latent.codec=tokenizer", "model.latent.tokenizer=runs/vae", "model.latent.factor=4"],
     "model.latent.factor does not apply to model.latent.codec=tokenizer"),
])
def test_config_errors_name_the_fields(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config("dit-latent-debug", overrides)


def test_image_embedding_cache_keeps_the_image_and_reads_as_dalle2_shards(tmp_path):
    """An ImageEmbedder's cache (kind image_embed): each record holds the embedding of the image and of its mirror
    image, and the image itself (png), so the decoder trains on both; the same shards read as DALLE2-pytorch-style
    webdataset shards (png + npy + txt + cls)."""
    embedder = PooledPixelEmbedder(grid=2, image_size=16)
    info = CodecInfo(kind="image_embed", run_dir="stand-in", family="clip", step=0, checkpoint="-",
                     encoder_hash="0" * 64, channels=embedder.embed_dim, codebook_size=0, downsample=0, image_size=16)
    data = DataConfig(source="shapes", image_size=16, num_workers=0, shapes={"n": 12})
    encode_dataset(embedder, info, data, tmp_path / "cache", flip=True, batch_size=5)
    manifest = read_manifest(tmp_path / "cache")
    assert manifest.kind == "image_embed" and manifest.shape == [12] and manifest.data_info().channels == 3
    cache = CacheDataset(tmp_path / "cache", flip=True)
    source = build_dataset(data, flip=False)
    for i in range(12):
        sample = cache[i]
        assert torch.allclose(sample["image"], source[i]["image"], atol=1 / 127.5)  # png: lossless to uint8
        expected = embedder.embed_images(sample["image"][None])[0]
        assert torch.allclose(sample["image_embed"], expected, atol=1e-3)  # float16 storage
    flipped = next(cache[(i, seed)] for i in range(12) for seed in range(20) if cache[(i, seed)]["image"].ne(
        cache[i]["image"]).any())
    assert torch.allclose(flipped["image_embed"], embedder.embed_images(flipped["image"][None])[0], atol=1e-3)
    shards = DataConfig(source="shards", path=str(tmp_path / "cache" / "shard-000000.tar"), image_size=16,
                        num_workers=0)
    records = list(build_dataset(shards))
    assert len(records) == 12 and all(r["image_embed"].shape == (12,) for r in records)
