"""Folders written by `datasets`' save_to_disk (`data.source: arrow`): record batches streamed over ranks x workers
with exact resume, bad rows and torn files skipped and named `<file>@<row>`, a missing column or split or a folder
that is no save_to_disk folder refused naming it (exit 2), and a run that trains on its train split."""

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from stream_batches import slot_keys, take
from typer.testing import CliRunner
from PIL import Image as PILImage

from genforge.cli import app
from genforge.core.config import DataConfig, TrainConfig
from genforge.data.base import BadDataError
from genforge.data.loader import build_dataset, build_train_batches, heldout_batch

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    PILImage.fromarray(np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def _saved(folder: Path, n: int, shards: int = 1, corrupt=(), test: int = 0) -> Path:
    """n rows (captions "row i", ClassLabel labels i % 3) saved with save_to_disk in `shards` Arrow files (one record
    batch each); rows in `corrupt` hold a truncated PNG; with `test`, a DatasetDict with that many test rows."""
    def table(count: int, first: int) -> "datasets.Dataset":
        rows = {"image": [{"bytes": _png(i)[:30] if i in corrupt else _png(i), "path": None}
                          for i in range(first, first + count)],
                "text": [f"row {i}" for i in range(first, first + count)],
                "label": [i % 3 for i in range(first, first + count)]}
        table = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
        return table.cast_column("label", datasets.ClassLabel(names=["a", "b", "c"]))
    saved = datasets.DatasetDict({"train": table(n, 0), "test": table(test, 1000)}) if test else table(n, 0)
    saved.save_to_disk(str(folder), num_shards={"train": shards, "test": 1} if test else shards)
    return folder


def _data(path: Path, workers: int = 0, **extra) -> DataConfig:
    return DataConfig(**{"source": "arrow", "path": str(path), "image_size": 8, "num_workers": workers, **extra})


def test_record_batches_over_ranks_times_workers_and_exact_resume(tmp_path):
    folder = _saved(tmp_path / "saved", 22, shards=4)
    data, train = _data(folder, workers=2, shuffle_buffer=3), TrainConfig(batch_size=4, seed=5)
    dataset = build_dataset(data, world_size=2)
    assert [(g.name, g.index, g.rows, g.unit) for g in dataset.urls] == [
        (f"data-0000{i}-of-00004.arrow", 0, rows, "record batch") for i, rows in enumerate([6, 6, 5, 5])]
    assert dataset.num_classes == 3
    first_epochs = []
    for slot, keys in slot_keys(dataset, data, train, world_size=2, workers=2, batches=12).items():
        n = [6, 6, 5, 5][slot]
        first_epochs += keys[:n]
        assert Counter(keys[n : 2 * n]) == Counter(keys[:n])
    files = [(0, 6), (1, 6), (2, 5), (3, 5)]
    assert Counter(first_epochs) == Counter(f"data-0000{i}-of-00004.arrow@{r}" for i, n in files for r in range(n))
    one = _data(folder, shuffle_buffer=4)
    straight = take(build_train_batches(build_dataset(one, world_size=1), one, TrainConfig(batch_size=3)), 9)
    resumed = take(build_train_batches(build_dataset(one, world_size=1), one, TrainConfig(batch_size=3),
                                       start_position=4), 5)
    assert [b["key"] for b in resumed] == [b["key"] for b in straight[4:]]
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(resumed, straight[4:]))


def test_bad_rows_and_torn_files_are_skipped_and_named(tmp_path):
    folder = _saved(tmp_path / "saved", 6, corrupt={1, 4})
    batches = take(build_train_batches(build_dataset(_data(folder, shuffle_buffer=0), world_size=1),
                                       _data(folder, shuffle_buffer=0), TrainConfig(batch_size=3)), 2)
    assert [[k for k, _ in b["skipped"]] for b in batches] == [["data-00000-of-00001.arrow@1"],
                                                                ["data-00000-of-00001.arrow@4"]]
    assert batches[0]["label"].tolist() == [0, 2] and batches[0]["text"] == ["row 0", "row 2"]
    torn = _saved(tmp_path / "torn", 12, shards=2)
    arrow = torn / "data-00001-of-00002.arrow"
    arrow.write_bytes(arrow.read_bytes()[:300])  # its schema, then nothing whole
    samples = list(build_dataset(_data(torn)))
    assert [s["key"] for s in samples if "bad" not in s] == [f"data-00000-of-00002.arrow@{r}" for r in range(6)]
    assert [s["key"] for s in samples if "bad" in s] == ["data-00001-of-00002.arrow@0"]


def _train(run_dir: Path, *overrides: str, dry_run: bool = True):
    args = ["train", "dit-debug", "--run-dir", str(run_dir), "--set", "train.steps=2", "--set", "train.sample_every=0",
            "--set", "train.checkpoint_every=2", "--set", "eval.every=0"]
    for override in overrides:
        args += ["--set", override]
    return CliRunner().invoke(app, args + (["--dry-run"] if dry_run else []))


def test_a_missing_column_split_or_save_to_disk_folder_exits_2_naming_it(tmp_path):
    folder = _saved(tmp_path / "saved", 6, test=2)
    source = ["data.source=arrow", f"data.path={folder}", "data.image_size=8", "train.batch_size=2"]
    out = _train(tmp_path / "a", *source, "data.image_column=picture")
    assert out.exit_code == 2 and "has no column 'picture' (data.image_column); its columns: 'image', 'text', " \
                                  "'label'" in out.output
    out = _train(tmp_path / "b", *source, "data.split=validation")
    assert out.exit_code == 2 and "data.split='validation'" in out.output and "its splits: 'train', 'test'" in out.output
    out = _train(tmp_path / "c", "data.source=arrow", f"data.path={tmp_path}", "data.image_size=8")
    assert out.exit_code == 2 and "is not a folder written by datasets' save_to_disk" in out.output
    out = _train(tmp_path / "d", "data.split=test")  # shapes has no named splits
    assert out.exit_code == 2 and "data.split='test' applies to data with named splits" in out.output
    with pytest.raises(BadDataError, match="data.split='validation'"):
        build_dataset(_data(folder, split="validation"))


def test_training_reads_the_train_split_and_holds_out_test(tmp_path, status):
    """A DatasetDict's train split trains (a corrupt row skipped and listed, the run goes on); test is held out."""
    folder = _saved(tmp_path / "saved", 12, corrupt={3}, test=4)
    out = _train(tmp_path / "run", "data.source=arrow", f"data.path={folder}", "data.image_size=8",
                 "train.batch_size=4", "data.num_workers=0", "data.max_bad_fraction=0.5", dry_run=False)
    assert out.exit_code == 0, out.output
    skipped = [json.loads(line) for line in (tmp_path / "run" / "skipped.jsonl").read_text().splitlines()]
    assert [s["key"] for s in skipped] == ["train/data-00000-of-00001.arrow@3"]
    held = heldout_batch(_data(folder), 4)
    assert held["key"] == [f"test/data-00000-of-00001.arrow@{r}" for r in range(4)]
    assert "the 'test' split of" in status.text
