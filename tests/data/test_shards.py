"""Webdataset shards (`data.source: shards`): split over ranks x workers, resumable position, record fields,
unreadable records, URLs, held-out images, encode, and training through the real Trainer."""

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_tokenizer import fake_tokenizer  # noqa: F401 (fixture)
from PIL import Image
from webdataset import TarWriter

from genforge.core.config import DataConfig, TrainConfig
from genforge.app.encode import encode_dataset
from genforge.data.cache import CacheDataset
from genforge.data.loader import build_dataset, build_train_batches, dataset_size, heldout_batches, heldout_split
from genforge.data.shapes import ShapesDataset, write_shapes_shards
from genforge.data.shards import DataError, decode_record, split_shards
from genforge.app.runs import load_codec
from stream_batches import resumes_bit_identically, slot_keys, take as _take


def _png(value: int, fmt: str = "PNG", size=(10, 12)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (value % 256, 40, 200 - value % 200)).save(out, format=fmt)
    return out.getvalue()


def _npy(array) -> bytes:
    out = io.BytesIO()
    np.save(out, np.asarray(array))
    return out.getvalue()


def _write_shards(folder: Path, sizes, prefix="part") -> str:
    """Shards `prefix-NNN.tar` of `sizes[i]` records (png + txt + cls); returns the brace spec."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for i, size in enumerate(sizes):
        with TarWriter(str(folder / f"{prefix}-{i:03d}.tar")) as sink:
            for _ in range(size):
                sink.write({"__key__": f"r{n:04d}", "png": _png(n), "txt": f"record {n}", "cls": n % 3})
                n += 1
    return str(folder / f"{prefix}-{{000..{len(sizes) - 1:03d}}}.tar")


def _data(spec, workers=0, **extra) -> DataConfig:
    return DataConfig(source="shards", path=spec, image_size=8, num_workers=workers, **extra)


def test_ranks_times_workers_cover_every_record_once_per_epoch(tmp_path):
    sizes = [3, 5, 2, 7, 4, 6]  # slots (rank, worker) read shards i % 4: 3+4, 5+6, 2, 7 records
    spec = _write_shards(tmp_path, sizes)
    data, train = _data(spec, workers=2, shuffle_buffer=3), TrainConfig(batch_size=4, seed=5)  # micro-batch 2
    dataset = build_dataset(data, world_size=2)
    assert dataset_size(dataset) is None and dataset.slots == 4
    per_slot = {0: 7, 1: 11, 2: 2, 3: 7}
    first_epochs, all_keys = [], {f"part-{i:03d}/r{n:04d}" for i, n in
                                  zip(np.repeat(range(6), sizes), range(sum(sizes)))}
    for slot, keys in slot_keys(dataset, data, train, world_size=2, workers=2, batches=24).items():
        n = per_slot[slot]
        first_epochs += keys[:n]
        assert Counter(keys[n : 2 * n]) == Counter(keys[:n])  # the next epoch: the same records again
        assert len({k.split("/")[0] for k in keys[:n]}) == len(sizes[slot::4])
    assert Counter(first_epochs) == Counter(all_keys)  # every record exactly once


def test_too_few_shards_or_a_missing_one_is_a_clear_error(tmp_path):
    spec = _write_shards(tmp_path, [2, 2, 2])
    with pytest.raises(ValueError, match=r"data.path=.*part-\{000..002\}.tar.* 3 shard\(s\).*processes x "
                                         r"data.num_workers = 2 x 2"):
        build_dataset(_data(spec, workers=2), world_size=2)
    build_dataset(_data(spec, workers=1), world_size=2)  # 2 slots: fine
    with pytest.raises(FileNotFoundError, match=r"data.path=.*part-003.tar does not exist"):
        build_dataset(_data(str(tmp_path / "part-{000..005}.tar")))
    with pytest.raises(ValueError, match="data.path .*webdataset shards.* is required"):
        DataConfig(source="shards")
    with pytest.raises(ValueError, match="too few to hold out"):
        build_dataset(DataConfig(source="shards", path=spec, val_fraction=0.5, test_fraction=0.4, num_workers=0))


def test_shard_splits_are_disjoint_complete_and_deterministic(tmp_path):
    """train / val / test cut a seeded permutation of the shards: the same seed gives the same split, another
    seed another one; every shard is in exactly one split; a val split streams and reads like any other."""
    urls = [f"s-{i:03d}.tar" for i in range(20)]
    splits = split_shards(urls, 0.15, 0.1, seed=3)
    assert [len(splits[k]) for k in ("train", "val", "test")] == [15, 3, 2]
    assert sorted(sum(splits.values(), [])) == urls
    assert splits == split_shards(urls, 0.15, 0.1, seed=3)
    assert splits["val"] != split_shards(urls, 0.15, 0.1, seed=4)["val"]
    assert all(split == sorted(split) for split in splits.values())  # the spec's order within a split
    assert split_shards(urls[:3], 0.01, 0.0, seed=0)["val"]  # a small share still holds out one shard

    spec = _write_shards(tmp_path, [2, 3, 2, 4])
    data = DataConfig(source="shards", path=spec, val_fraction=0.25, test_fraction=0.25, split_seed=1,
                      num_workers=0)
    keys = {split: {s["key"].split("/")[0] for s in build_dataset(data, split=split)}
            for split in ("train", "val", "test")}
    assert [len(k) for k in keys.values()] == [2, 1, 1] and not keys["val"] & keys["train"]
    assert heldout_split(data) == "val"


@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_stream_continues_the_uninterrupted_one(tmp_path, workers):
    spec = _write_shards(tmp_path, [5, 4, 6, 5])  # a slot runs through several epochs in 12 micro-batches
    data, train = _data(spec, workers=workers, shuffle_buffer=4), TrainConfig(batch_size=6, grad_accum=1, seed=1)
    dataset = build_dataset(data, world_size=1)
    straight = _take(build_train_batches(dataset, data, train), 14)
    for position in (3, 8):  # odd and even: the resumed loader's first worker plays the right one
        resumed = _take(build_train_batches(dataset, data, train, start_position=position), 14 - position)
        assert [b["key"] for b in resumed] == [b["key"] for b in straight[position:]]
        assert all(torch.equal(a["image"], b["image"]) for a, b in zip(resumed, straight[position:]))
    accum = train.model_copy(update={"grad_accum": 2, "batch_size": 6})  # 2 micro-batches of 3 per step
    straight = _take(build_train_batches(dataset, data, accum), 10)
    resumed = _take(build_train_batches(dataset, data, accum, start_position=3), 4)
    assert [b["key"] for b in resumed] == [b["key"] for b in straight[6:]]


def test_record_fields(tmp_path):
    def decode(record):
        return decode_record({"__key__": "k", **record}, "s/k", 8, flip=False, aug_seed=None)

    s = decode({"png": _png(1), "txt": b"  a caption \n", "cls": b"7\n"})
    assert s["image"].shape == (3, 8, 8) and s["text"] == "a caption" and s["label"] == 7 and s["key"] == "s/k"
    s = decode({"jpg": _png(2, "JPEG"), "json": json.dumps({"caption": "from json", "label": 3}).encode()})
    assert s["text"] == "from json" and s["label"] == 3
    s = decode({"webp": _png(3, "WEBP"), "txt": b"txt wins", "json": b'{"text": "no", "cls": 1}',
                "npy": _npy(np.arange(5, dtype=np.float16))})
    assert s["text"] == "txt wins" and s["label"] == 1 and s["image_embed"].dtype == torch.float32
    assert s["image_embed"].tolist() == [0, 1, 2, 3, 4]
    s = decode({"npy": _npy(np.ones((4, 2, 2))), "cls": b"2"})  # a latent without an image is a sample
    assert s["latent"].shape == (4, 2, 2) and "image" not in s and s["label"] == 2
    assert "bad" in decode({"png": _png(4)[:30]})  # a truncated image
    assert "expected 1-D" in decode({"png": _png(5), "npy": _npy(np.ones((2, 2)))})["bad"]
    assert "no image" in decode({"txt": b"caption only"})["bad"]
    assert "bad" in decode({"png": _png(6), "npy": _npy(np.array([object()], dtype=object))})  # no pickles
    half = np.zeros((8, 8, 3), dtype=np.uint8)
    half[:, :4] = 255
    out = io.BytesIO()
    Image.fromarray(half).save(out, format="PNG")
    left = [decode_record({"png": out.getvalue()}, "k", 8, True, seed)["image"][0, 0, 0].item() for seed in range(40)]
    assert 5 < left.count(1.0) < 35 and set(left) == {1.0, -1.0}  # flipped by the per-sample coin


def test_unreadable_records_are_dropped_and_reported(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    with TarWriter(str(tmp_path / "bad-000.tar")) as sink:
        for n in range(6):
            image = _png(n)[:30] if n in (1, 4) else _png(n)
            sink.write({"__key__": f"r{n}", "png": image, "txt": f"r{n}", "cls": n})
    with TarWriter(str(tmp_path / "bad-001.tar")) as sink:
        for n in range(3):
            sink.write({"__key__": f"x{n}", "txt": "no image"})
    data = _data(str(tmp_path / "bad-000.tar"), shuffle_buffer=0)
    batches = _take(build_train_batches(build_dataset(data, world_size=1), data, TrainConfig(batch_size=3)), 2)
    assert [b["key"] for b in batches] == [["bad-000/r0", "bad-000/r2"], ["bad-000/r3", "bad-000/r5"]]
    assert [[k for k, _ in b["skipped"]] for b in batches] == [["bad-000/r1"], ["bad-000/r4"]]
    assert batches[0]["image"].shape == (2, 3, 8, 8) and batches[0]["label"].tolist() == [0, 2]
    data = _data(str(tmp_path / "bad-001.tar"))
    with pytest.raises(DataError, match="every one of 3 records of a micro-batch was unreadable.*no image"):
        _take(build_train_batches(build_dataset(data, world_size=1), data, TrainConfig(batch_size=3)), 1)


def test_a_record_missing_a_field_the_others_have_is_reported(tmp_path):
    with TarWriter(str(tmp_path / "mixed.tar")) as sink:
        for n in range(4):
            record = {"__key__": f"r{n}", "png": _png(n)}
            if n != 2:
                record.update(cls=n, txt=f"r{n}")
            sink.write(record)
    data = _data(str(tmp_path / "mixed.tar"), shuffle_buffer=0)
    (batch,) = _take(build_train_batches(build_dataset(data, world_size=1), data, TrainConfig(batch_size=4)), 1)
    assert batch["key"] == ["mixed/r0", "mixed/r1", "mixed/r3"] and batch["label"].tolist() == [0, 1, 3]
    assert batch["skipped"] == [("mixed/r2", "no label, which most records of its batch have")]


def test_file_and_pipe_urls_stream_the_same_records(tmp_path, monkeypatch):
    monkeypatch.setenv("GENFORGE_ALLOW_PIPE", "1")  # pipe: URLs are the user's opt-in (tests/data/test_pipe_urls.py)
    spec = _write_shards(tmp_path, [3, 2])
    plain = list(build_dataset(_data(spec)))
    for url in (f"file://{spec}", f"pipe:cat {spec}"):
        other = list(build_dataset(_data(url)))
        assert [s["key"] for s in other] == [s["key"] for s in plain] == [f"part-{i // 3:03d}/r{i:04d}"
                                                                          for i in range(5)]
        assert all(torch.equal(a["image"], b["image"]) for a, b in zip(other, plain))
    split = f"{tmp_path}/part-000.tar::file://{tmp_path}/part-001.tar"  # several specs joined by ::
    assert [s["key"] for s in build_dataset(_data(split))] == [s["key"] for s in plain]


def test_shapes_shards_held_out_images_and_encode(tmp_path, fake_tokenizer):
    pattern, count = write_shapes_shards(tmp_path / "shards", 40, 16, shard_size=15)
    assert count == 3 and pattern.endswith("shapes-{000000..000002}.tar")
    data = DataConfig(source="shards", path=pattern, image_size=16, num_workers=2)
    shapes = ShapesDataset(40, 16)
    images = torch.cat(list(heldout_batches(data, 7, 3)))  # the first 7 records, in order, unflipped
    assert torch.equal(images, torch.stack([shapes[i]["image"] for i in range(7)]))

    codec, info = load_codec(fake_tokenizer(tmp_path / "tok"))
    manifest = encode_dataset(codec, info, data, tmp_path / "cache", flip=False, batch_size=8)
    assert manifest.count == 40 and manifest.preprocessing.source == "shards"
    cache = CacheDataset(tmp_path / "cache")
    order = [int(cache[i]["key"].rsplit("-", 1)[1]) for i in range(40)]
    assert sorted(order) == list(range(40))
    assert manifest.num_classes == 1 + max(shapes[i]["label"] for i in range(40))
    assert [cache[i]["label"] for i in range(40)] == [shapes[j]["label"] for j in order]
    expected = codec.encode(torch.stack([shapes[j]["image"] for j in order])).half().float()
    assert torch.equal(torch.stack([cache[i]["latent"] for i in range(40)]), expected)


def test_training_on_shards_resumes_bit_identically(tmp_path):
    pattern, _ = write_shapes_shards(tmp_path / "shards", 48, 16, shard_size=12)
    overrides = ["data.source=shards", f"data.path={pattern}", "data.num_workers=2", "data.shuffle_buffer=8",
                 "model.num_classes=16", "train.log_every=1", "train.sample_every=0"]

    state = resumes_bit_identically(overrides, tmp_path)
    assert (state["num_samples"], state["data_slots"], state["data_position"]) == (None, 2, 6)
    assert not (tmp_path / "straight" / "skipped.jsonl").exists()


def test_cli_writes_shapes_shards_and_refuses_too_few(tmp_path):
    from typer.testing import CliRunner

    from genforge.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["data", "shapes", "--out", str(tmp_path / "s"), "--n", "5", "--image-size", "16",
                              "--shards", "--shard-size", "2"])
    assert out.exit_code == 0, out.output
    pattern = str(tmp_path / "s" / "shapes-{000000..000002}.tar")
    assert f"wrote 5 images of 16x16 in 3 shard(s): {pattern}" in out.output
    assert [s["key"] for s in build_dataset(_data(pattern))][-1] == "shapes-000002/shapes-0-00000004"
    out = runner.invoke(app, ["train", "dit-debug", "--run-dir", str(tmp_path / "run"), "--set", "data.source=shards",
                              "--set", f"data.path={pattern}", "--set", "data.num_workers=4"])
    assert out.exit_code == 2 and "3 shard(s), fewer than processes x data.num_workers = 1 x 4" in out.output


def test_separate_embedding_files_in_the_dalle2_layout(tmp_path):
    """Shards named by number with img2dataset keys <shard><index:4>; embeddings in img_emb_<shard>.npy, row = the
    key's last 4 digits; a record whose row is all zeros (no embedding) is skipped and reported."""
    shards, embeds = tmp_path / "shards", tmp_path / "img_emb"
    shards.mkdir(), embeds.mkdir()
    table = {}
    for shard in range(2):
        rows = np.random.default_rng(shard).normal(size=(3, 6)).astype(np.float16)
        rows[2] = 0  # record 2 of each shard has no embedding
        np.save(embeds / f"img_emb_{shard}.npy", rows)
        with TarWriter(str(shards / f"{shard:05d}.tar")) as sink:
            for index in (1, 0, 2):  # rows follow the key, not the order in the tar
                key = f"{shard:05d}{index:04d}"
                sink.write({"__key__": key, "png": _png(index), "txt": key})
                table[key] = rows[index]
    data = DataConfig(source="shards", path=str(shards / "{00000..00001}.tar"), image_embeds=str(embeds),
                      num_workers=0)
    samples = list(build_dataset(data))
    good = [s for s in samples if "bad" not in s]
    assert len(good) == 4 and len(samples) == 6
    for s in good:
        assert torch.allclose(s["image_embed"], torch.from_numpy(table[s["text"]].astype(np.float32)))
    assert all("no embedding for key" in s["bad"] for s in samples if "bad" in s)
    with pytest.raises(ValueError, match="data.image_embeds is not read by data.source=shapes; it is read by data.source shards"):
        DataConfig(source="shapes", image_embeds=str(embeds))
