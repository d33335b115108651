"""Parquet files (`data.source: parquet`): Hugging Face's image column layouts, row groups split over ranks x workers,
2 processes = 1 process at the same slots, exact resume, unreadable rows and files, missing columns, ClassLabel
names, held-out images and encode, and training through the real Trainer."""

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from fake_tokenizer import fake_tokenizer  # noqa: F401 (fixture)
from stream_batches import resumes_bit_identically, slot_keys, take as _take
from PIL import Image

from genforge.app.encode import encode_dataset
from genforge.app.runs import load_codec
from genforge.core.config import DataConfig, TrainConfig
from genforge.data.base import BadDataError
from genforge.data.cache import CacheDataset
from genforge.data.images import read_image
from genforge.data.loader import build_dataset, build_train_batches, class_names, data_info, heldout_batches
from genforge.data.shapes import ShapesDataset
from genforge.data.shards import DataError

HF_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # datasets' storage of an Image feature


def _png(value: int, size=(10, 12)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (value * 37 % 256, 40, 200 - value % 200)).save(out, format="PNG")
    return out.getvalue()


def _write(path: Path, images: list, captions=None, labels=None, row_group_size=4, image_type=HF_IMAGE,
           class_names=None) -> Path:
    """A parquet file as `datasets` writes one: `image` (HF struct {bytes, path}, or `image_type`), `text`, `label`;
    with `class_names`, the ClassLabel names in the `huggingface` schema metadata."""
    columns = {"image": pa.array(images, type=image_type)}
    if captions is not None:
        columns["text"] = pa.array(captions, type=pa.string())
    if labels is not None:
        columns["label"] = pa.array(labels, type=pa.int64())
    table = pa.table(columns)
    if class_names is not None:
        features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": class_names}}
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def _set(folder: Path, sizes, row_group_size=4, corrupt=()) -> str:
    """Files train-NNN.parquet of sizes[i] rows (row n: PNG bytes of n in HF's struct, caption "row n", label n % 3;
    rows in `corrupt` hold a truncated PNG); returns a glob naming them."""
    n = 0
    for i, size in enumerate(sizes):
        rows = range(n, n + size)
        images = [{"bytes": _png(r)[:30] if r in corrupt else _png(r), "path": f"{r}.png"} for r in rows]
        _write(folder / f"train-{i:03d}.parquet", images, [f"row {r}" for r in rows], [r % 3 for r in rows],
               row_group_size)
        n += size
    return str(folder / "train-*.parquet")


def _data(path, workers=0, **extra) -> DataConfig:
    return DataConfig(**{"source": "parquet", "path": path, "image_size": 8, "num_workers": workers,
                         "label_column": "label", **extra})


def test_rows_read_as_hugging_face_stores_them(tmp_path):
    """The struct's bytes, or the file at its path (relative to the parquet file) where the bytes are null, or a
    plain binary column; caption stripped; key <file>@<row>; pixels read as image folders read them."""
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "far.png").write_bytes(_png(7))
    _write(tmp_path / "a.parquet", [{"bytes": _png(1), "path": None}, {"bytes": None, "path": "imgs/far.png"}],
           [" a caption \n", None], [2, 0])
    _write(tmp_path / "b.parquet", [_png(3), _png(4)], ["plain", "no label"], [1, -1], image_type=pa.binary())
    *samples, unlabelled = list(build_dataset(_data(f"{tmp_path}/{{a,b}}.parquet")))
    assert [s["key"] for s in samples] == ["a.parquet@0", "a.parquet@1", "b.parquet@0"]
    assert unlabelled == {"key": "b.parquet@1", "bad": "ValueError: no label in column 'label' (-1)"}
    assert [s.get("text") for s in samples] == ["a caption", None, "plain"]
    assert [s["label"] for s in samples] == [2, 0, 1]
    for sample, value in zip(samples, (1, 7, 3)):
        assert torch.equal(sample["image"], read_image(io.BytesIO(_png(value)), 8))


def test_row_groups_over_ranks_times_workers_cover_every_row_once_per_epoch(tmp_path):
    spec = _set(tmp_path, [5, 9, 3], row_group_size=3)  # row groups of 3, 3, 3, 3, 2, 3 rows (the units)
    data, train = _data(spec, workers=2, shuffle_buffer=3), TrainConfig(batch_size=4, seed=5)  # micro-batch 2
    dataset = build_dataset(data, world_size=2)
    assert [(g.name, g.index, g.first_row, g.rows) for g in dataset.urls] == [
        ("train-000.parquet", 0, 0, 3), ("train-000.parquet", 1, 3, 2), ("train-001.parquet", 0, 0, 3),
        ("train-001.parquet", 1, 3, 3), ("train-001.parquet", 2, 6, 3), ("train-002.parquet", 0, 0, 3)]
    per_slot = {0: 6, 1: 5, 2: 3, 3: 3}  # slot k reads row groups k, k + 4
    first_epochs = []
    for slot, keys in slot_keys(dataset, data, train, world_size=2, workers=2, batches=16).items():
        n = per_slot[slot]
        first_epochs += keys[:n]
        assert Counter(keys[n : 2 * n]) == Counter(keys[:n])  # the next epoch: the same rows again
    all_rows = [f"train-{i:03d}.parquet@{r}" for i, size in enumerate([5, 9, 3]) for r in range(size)]
    assert Counter(first_epochs) == Counter(all_rows)  # every row exactly once
    with pytest.raises(ValueError, match=r"holds 6 row group\(s\), fewer than processes x data.num_workers = "
                                         r"2 x 4 = 8"):
        build_dataset(_data(spec, workers=4), world_size=2)


def test_two_processes_give_the_global_batches_of_one_at_the_same_slots(tmp_path):
    """2 ranks x 1 worker and 1 process x 2 workers (accumulating 2 micro-batches) stream the same 2 slots: every
    optimizer step trains on the same rows, with the same augmentation (flip) draws."""
    spec = _set(tmp_path, [7, 6, 5], row_group_size=2)
    two = _data(spec, workers=0, shuffle_buffer=5, flip=True)
    one = _data(spec, workers=2, shuffle_buffer=5, flip=True)
    train = TrainConfig(batch_size=6, seed=3)
    ranks = [_take(build_train_batches(build_dataset(two, world_size=2), two, train, world_size=2, rank=r), 8)
             for r in range(2)]
    accum = train.model_copy(update={"grad_accum": 2})
    single = _take(build_train_batches(build_dataset(one, world_size=1), one, accum), 16)
    for step in range(8):
        parts = (ranks[0][step], ranks[1][step]), single[2 * step : 2 * step + 2]
        keys = [sorted(k for b in part for k in b["key"]) for part in parts]
        assert keys[0] == keys[1] and len(keys[0]) == 6
        images = [{k: img for b in part for k, img in zip(b["key"], b["image"])} for part in parts]
        assert all(torch.equal(images[0][k], images[1][k]) for k in keys[0])


@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_stream_continues_the_uninterrupted_one(tmp_path, workers):
    spec = _set(tmp_path, [9, 7, 8, 6], row_group_size=3)
    data, train = _data(spec, workers=workers, shuffle_buffer=4), TrainConfig(batch_size=5, seed=1)
    dataset = build_dataset(data, world_size=1)
    straight = _take(build_train_batches(dataset, data, train), 14)
    for position in (3, 8):
        resumed = _take(build_train_batches(dataset, data, train, start_position=position), 14 - position)
        assert [b["key"] for b in resumed] == [b["key"] for b in straight[position:]]
        assert all(torch.equal(a["image"], b["image"]) for a, b in zip(resumed, straight[position:]))


def test_corrupt_rows_and_unreadable_files_are_skipped_and_reported(tmp_path):
    spec = _set(tmp_path / "set", [6], corrupt={1, 4})
    data = _data(spec, shuffle_buffer=0)
    batches = _take(build_train_batches(build_dataset(data, world_size=1), data, TrainConfig(batch_size=3)), 2)
    assert [b["key"] for b in batches] == [["train-000.parquet@0", "train-000.parquet@2"],
                                           ["train-000.parquet@3", "train-000.parquet@5"]]
    assert [[k for k, _ in b["skipped"]] for b in batches] == [["train-000.parquet@1"], ["train-000.parquet@4"]]
    assert batches[0]["skipped"][0][1].startswith(("OSError", "UnidentifiedImageError", "SyntaxError"))
    assert batches[0]["label"].tolist() == [0, 2] and batches[0]["text"] == ["row 0", "row 2"]

    (tmp_path / "set" / "train-001.parquet").write_bytes(b"PAR1 not really parquet")  # a file that cannot be read
    samples = list(build_dataset(_data(spec)))
    assert samples[-1] == {"key": "train-001.parquet@0", "bad": samples[-1]["bad"]}
    assert "cannot open" in samples[-1]["bad"] and len(samples) == 7

    _write(tmp_path / "none" / "x.parquet", [{"bytes": None, "path": None}] * 3, ["a"] * 3, [0] * 3)
    data = _data(str(tmp_path / "none" / "x.parquet"))
    with pytest.raises(DataError, match="every one of 3 records.*x.parquet@0: ValueError: an image struct with "
                                        "neither bytes nor path.*a set of parquet files with images"):
        _take(build_train_batches(build_dataset(data, world_size=1), data, TrainConfig(batch_size=3)), 1)


def test_a_missing_or_mistyped_column_names_it_and_the_columns(tmp_path):
    spec = _set(tmp_path, [3])
    with pytest.raises(BadDataError, match=r"train-000.parquet has no column 'img' \(data.image_column\); its "
                                           r"columns: 'image', 'text', 'label'"):
        build_dataset(_data(spec, image_column="img"))
    with pytest.raises(BadDataError, match=r"no column 'class' \(data.label_column\); its columns: 'image', 'text'"):
        build_dataset(_data(spec, label_column="class"))
    with pytest.raises(BadDataError, match=r"column 'text' \(data.image_column\) is string; an image column is"):
        build_dataset(_data(spec, image_column="text"))
    with pytest.raises(BadDataError, match=r"column 'text' \(data.label_column\) is string; a label column"):
        build_dataset(_data(spec, label_column="text"))
    assert "text" not in next(iter(build_dataset(_data(spec, caption_column="caption"))))  # captions are optional
    with pytest.raises(FileNotFoundError, match=r"nothing-\*.parquet matches no parquet file"):
        build_dataset(_data(str(tmp_path / "nothing-*.parquet")))
    with pytest.raises(ValueError, match="data.image_column is not read by data.source=shards"):
        DataConfig(source="shards", path="x.tar", image_column="img")


def test_cli_exits_2_naming_the_missing_column(tmp_path):
    from typer.testing import CliRunner

    from genforge.cli import app

    spec = _set(tmp_path / "set", [3])
    out = CliRunner().invoke(app, ["train", "dit-debug", "--run-dir", str(tmp_path / "run"), "--set",
                                   "data.source=parquet", "--set", f"data.path={spec}", "--set",
                                   "data.image_column=picture"])
    assert out.exit_code == 2, out.output
    assert "has no column 'picture' (data.image_column); its columns: 'image', 'text', 'label'" in out.output


def test_class_label_column_split_held_out_images_and_encode(tmp_path, fake_tokenizer):
    shapes = ShapesDataset(30, 16)
    for i in range(3):
        items = [shapes[10 * i + j] for j in range(10)]
        png = [{"bytes": _encoded(s["image"]), "path": None} for s in items]
        _write(tmp_path / "set" / f"part-{i}.parquet", png, [s["text"] for s in items], [s["label"] for s in items],
               class_names=[f"class_{k:02d}" for k in range(16)])
    data = DataConfig(source="parquet", path=f"{tmp_path}/set/part-{{0..2}}.parquet", image_size=16,
                      num_workers=0)  # no data.label_column: the ClassLabel column datasets recorded
    assert data_info(build_dataset(data), data).num_classes == 16
    assert class_names(data)[:2] == ["class 00", "class 01"]
    images = torch.cat(list(heldout_batches(data, 7, 3)))  # the first 7 rows, in order, unflipped
    assert torch.equal(images, torch.stack([shapes[i]["image"] for i in range(7)]))

    held = data.model_copy(update={"val_fraction": 0.3})  # one whole file of three is held out
    val = [s["key"] for s in build_dataset(held, split="val")]
    train = [s["key"] for s in build_dataset(held, split="train")]
    assert len(val) == 10 and len(train) == 20 and not {k.split("@")[0] for k in val} & {k.split("@")[0]
                                                                                        for k in train}

    codec, info = load_codec(fake_tokenizer(tmp_path / "tok"))
    manifest = encode_dataset(codec, info, data, tmp_path / "cache", flip=False, batch_size=8)
    assert manifest.count == 30 and manifest.preprocessing.source == "parquet"
    cache = CacheDataset(tmp_path / "cache")
    order = [int(cache[i]["key"].split("-")[1].split(".")[0]) * 10 + int(cache[i]["key"].split("@")[1])
             for i in range(30)]
    assert sorted(order) == list(range(30))
    assert [cache[i]["label"] for i in range(30)] == [shapes[j]["label"] for j in order]
    expected = codec.encode(torch.stack([shapes[j]["image"] for j in order])).half().float()
    assert torch.equal(torch.stack([cache[i]["latent"] for i in range(30)]), expected)


def _encoded(image: torch.Tensor) -> bytes:
    """A [3, H, W] image in [-1, 1] as PNG bytes (lossless)."""
    pixels = ((image + 1) * 127.5).round().clamp(0, 255).byte().permute(1, 2, 0).numpy()
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(out, format="PNG")
    return out.getvalue()


def test_training_on_parquet_resumes_bit_identically_and_reports_a_corrupt_row(tmp_path):
    spec = _set(tmp_path / "set", [12, 12, 12, 12], row_group_size=6, corrupt={17})
    overrides = ["data.source=parquet", f"data.path={spec}", "data.label_column=label", "data.num_workers=2",
                 "data.shuffle_buffer=8", "model.num_classes=3", "train.log_every=1", "train.sample_every=0"]

    state = resumes_bit_identically(overrides, tmp_path)
    assert (state["num_samples"], state["data_slots"], state["data_position"]) == (None, 2, 6)
    skipped = [json.loads(line) for line in (tmp_path / "straight" / "skipped.jsonl").read_text().splitlines()]
    assert [s["key"] for s in skipped] == ["train-001.parquet@5"]  # row 17 of the set: row 5 of its second file


def test_cli_writes_shapes_as_parquet(tmp_path):
    """`genforge data shapes --parquet`: files of --shard-size rows in datasets' layout, the shapes set's images,
    captions and ClassLabel labels (so a class-conditional run needs no model.num_classes)."""
    from typer.testing import CliRunner

    from genforge.cli import app

    out = CliRunner().invoke(app, ["data", "shapes", "--out", str(tmp_path / "p"), "--n", "5", "--image-size", "16",
                                   "--parquet", "--shard-size", "2"])
    assert out.exit_code == 0, out.output
    pattern = str(tmp_path / "p" / "train-*.parquet")
    assert f"wrote 5 images of 16x16 in 3 parquet file(s): {pattern}" in out.output
    data = DataConfig(source="parquet", path=pattern, image_size=16, num_workers=0)
    samples, shapes = list(build_dataset(data)), ShapesDataset(5, 16)
    assert [s["key"] for s in samples] == ["train-000000.parquet@0", "train-000000.parquet@1",
                                           "train-000001.parquet@0", "train-000001.parquet@1", "train-000002.parquet@0"]
    assert all(torch.equal(s["image"], shapes[i]["image"]) and (s["text"], s["label"]) == (shapes[i]["text"],
                                                                                         shapes[i]["label"])
               for i, s in enumerate(samples))
    assert data_info(build_dataset(data), data).num_classes == 16
    out = CliRunner().invoke(app, ["data", "shapes", "--out", str(tmp_path / "q"), "--shards", "--parquet"])
    assert out.exit_code == 2 and "--shards and --parquet: choose one" in out.output
