"""genforge reads what Hugging Face `datasets` writes, as `datasets` reads it: for each fixture written by `datasets`
itself (to_parquet files named by split, the hub's data/<split>-NNNNN-of-NNNNN.parquet layout, save_to_disk, an
imagefolder with split folders and metadata), the rows of every split, their images, captions and labels, equal
what `datasets` loads, row by row. `datasets` is a test-only dependency (the dev extra)."""

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage
from torch.utils.data import IterableDataset

from genforge.core.config import DataConfig
from genforge.data.base import BadDataError
from genforge.data.images import to_uint8
from genforge.data.loader import build_dataset, class_names, data_info, heldout_split

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()
datasets.logging.set_verbosity_error()
SIZE = 8  # the fixtures' images are SIZE x SIZE: genforge's resize leaves them as they are
CLASSES = ["cat", "dog", "emu"]


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    out = io.BytesIO()
    PILImage.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _table(n: int, first: int, list_captions: bool = True, class_label: bool = True) -> "datasets.Dataset":
    """n rows written by `datasets`: an Image column cast from PNG bytes, captions (lists of 1-3, one empty), labels
    (a ClassLabel, or plain integers)."""
    captions = [[f"row {first + i} take {k}" for k in range(i % 3 + 1)] for i in range(n)]
    if list_captions:
        captions[-1] = []
    rows = {"image": [{"bytes": _png(first + i), "path": None} for i in range(n)],
            "text": captions if list_captions else [c[0] for c in captions],
            "label": [(first + i) % 3 for i in range(n)]}
    table = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
    return table.cast_column("label", datasets.ClassLabel(names=CLASSES)) if class_label else table


def _ours(cfg: DataConfig, split: str) -> list[dict]:
    """genforge's rows of `split` ("train": data.split's; a named split), unflipped, in its order."""
    dataset = build_dataset(cfg, split, flip=False)
    items = list(dataset) if isinstance(dataset, IterableDataset) else [dataset[i] for i in range(len(dataset))]
    assert not [item for item in items if "bad" in item]
    return [{"key": s["key"], "image": to_uint8(s["image"]).permute(1, 2, 0).numpy(), "text": s.get("text"),
             "label": s.get("label")} for s in items]


def _theirs(table: "datasets.Dataset", image: str = "image", label: str = "label") -> list[dict]:
    return [{"image": np.asarray(row[image].convert("RGB")), "text": row.get("text"), "label": row.get(label),
             "file": Path(row[image].filename).as_posix() if getattr(row[image], "filename", "") else None}
            for row in table]


def _same(name: str, split: str, ours: list[dict], theirs: list[dict], labels=lambda v: v) -> None:
    """Row by row: the same pixels, the caption genforge serves held-out samples (a list's first; none for an empty
    list or a missing value) and the label (`labels` maps datasets' value to genforge's class index)."""
    assert len(ours) == len(theirs), f"{name} {split}: {len(ours)} rows, datasets {len(theirs)}"
    for a, b in zip(ours, theirs):
        assert np.array_equal(a["image"], b["image"]), (name, split, a["key"])
        captions = b["text"] if isinstance(b["text"], list) else [b["text"]] if b["text"] else []
        assert a["text"] == (captions[0] if captions else None), (name, split, a["key"])
        assert a["label"] == (None if b["label"] is None else labels(b["label"])), (name, split, a["key"])
    print(f"parity {name}: split {split!r}: {len(ours)} rows, images / captions / labels equal to datasets'")


def _load(path: Path, tmp_path: Path, **kwargs) -> "datasets.DatasetDict":
    return datasets.load_dataset(str(path), cache_dir=str(tmp_path / "hf-cache"), **kwargs)


def test_to_parquet_files_named_by_split(tmp_path):
    """`ds.to_parquet("train.parquet")` / `("test.parquet")` in a folder: the files are splits (data.split trains,
    test is held out); ClassLabel names are the classes; list captions."""
    folder = tmp_path / "pq"
    _table(6, 0).to_parquet(str(folder / "train.parquet"))
    _table(3, 100).to_parquet(str(folder / "test.parquet"))
    theirs = _load(folder, tmp_path)
    assert list(theirs) == ["train", "test"]
    cfg = DataConfig(source="parquet", path=str(folder), image_size=SIZE, num_workers=0)
    for split in ("train", "test"):
        _same("to_parquet", split, _ours(cfg, split), _theirs(theirs[split]))
    assert heldout_split(cfg) == "test" and class_names(cfg) == CLASSES
    assert data_info(build_dataset(cfg), cfg).num_classes == 3
    assert [s["key"] for s in _ours(cfg, "test")][:2] == ["test.parquet@0", "test.parquet@1"]
    with pytest.raises(BadDataError, match=r"data.split='validation': .* no split 'validation'; its splits: "
                                           r"'train', 'test'"):
        build_dataset(DataConfig(source="parquet", path=str(folder), image_size=SIZE, split="validation"))


def test_push_to_hub_parquet_layout(tmp_path):
    """The hub's layout written locally, data/<split>-00000-of-00001.parquet: train and validation (the held-out
    split without a test split); plain integer labels give their class count from the data."""
    root = tmp_path / "hub"
    for split, (n, first) in {"train": (5, 0), "validation": (4, 50)}.items():
        _table(n, first, class_label=False).to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    (root / "README.md").write_text("---\nlicense: mit\n---\n")
    theirs = _load(root, tmp_path)
    assert list(theirs) == ["train", "validation"]
    cfg = DataConfig(source="parquet", path=str(root), image_size=SIZE, num_workers=0, label_column="label")
    for split in ("train", "validation"):
        _same("push_to_hub layout", split, _ours(cfg, split), _theirs(theirs[split]))
    assert heldout_split(cfg) == "validation" and class_names(cfg) is None
    assert data_info(build_dataset(cfg), cfg).num_classes == 3  # labels 0..2 in the data, no ClassLabel names
    valid = DataConfig(source="parquet", path=str(root), image_size=SIZE, split="validation", label_column="label")
    assert heldout_split(valid) == "train"  # training on validation: no other held-out split


def test_save_to_disk_folders(tmp_path):
    """A DatasetDict and a Dataset saved with save_to_disk: data.source=arrow, and detected under data.source=folder;
    rows keyed <split>/<file>@<row>."""
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": _table(7, 0), "test": _table(3, 200, list_captions=False)}).save_to_disk(str(saved))
    theirs = datasets.load_from_disk(str(saved))
    for source in ("arrow", "folder"):
        cfg = DataConfig(source=source, path=str(saved), image_size=SIZE, num_workers=0)
        for split in ("train", "test"):
            _same(f"save_to_disk DatasetDict (data.source={source})", split, _ours(cfg, split),
                  _theirs(theirs[split]))
        assert heldout_split(cfg) == "test" and class_names(cfg) == CLASSES
    assert _ours(cfg, "test")[0]["key"] == "test/data-00000-of-00001.arrow@0"
    single = tmp_path / "single"
    _table(4, 300).save_to_disk(str(single))
    cfg = DataConfig(source="arrow", path=str(single), image_size=SIZE, num_workers=0)
    _same("save_to_disk Dataset", "train", _ours(cfg, "train"), _theirs(datasets.load_from_disk(str(single))))
    assert heldout_split(cfg) == "train" and _ours(cfg, "train")[0]["key"] == "data-00000-of-00001.arrow@0"


def _images(root: Path, names: list[str], first: int = 0) -> None:
    for i, name in enumerate(names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(_png(first + i))


def _metadata(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_imagefolder_with_splits_and_metadata(tmp_path):
    """train/ and test/ with metadata.jsonl: split folders are splits, not classes; no labels from folders; list
    captions; a string label column as sorted class indices; images no row names are left out (and counted); a
    `conditioning_image_file_name` column read with data.image_column=conditioning_image."""
    root = tmp_path / "imgs"
    _images(root, ["train/b.png", "train/a.png", "train/c.png", "train/extra.png", "train/cond/a.png",
                   "train/cond/b.png", "train/cond/c.png"])
    _images(root, ["test/x.png", "test/y.png", "test/cond/x.png", "test/cond/y.png"], first=40)
    _metadata(root / "train" / "metadata.jsonl", [
        {"file_name": "b.png", "conditioning_image_file_name": "cond/b.png", "text": ["a b", "bee"], "kind": "dog"},
        {"file_name": "a.png", "conditioning_image_file_name": "cond/a.png", "text": ["an a"], "kind": "cat"},
        {"file_name": "c.png", "conditioning_image_file_name": "cond/c.png", "text": [], "kind": "emu"}])
    _metadata(root / "test" / "metadata.jsonl", [
        {"file_name": "x.png", "conditioning_image_file_name": "cond/x.png", "text": ["ex"], "kind": "cat"},
        {"file_name": "y.png", "conditioning_image_file_name": "cond/y.png", "text": ["why", "y"], "kind": "dog"}])
    theirs = datasets.load_dataset("imagefolder", data_dir=str(root), cache_dir=str(tmp_path / "hf-cache"))
    assert list(theirs) == ["train", "test"] and "label" not in theirs["train"].features
    cfg = DataConfig(source="folder", path=str(root), image_size=SIZE, num_workers=0, label_column="kind")
    for split in ("train", "test"):
        ours = _ours(cfg, split)
        _same("imagefolder + metadata.jsonl", split, ours, _theirs(theirs[split], label="kind"),
              labels=CLASSES.index)
        assert [f"{root}/{o['key']}" for o in ours] == [t["file"] for t in _theirs(theirs[split])]
    assert heldout_split(cfg) == "test" and class_names(cfg) == CLASSES
    train = build_dataset(cfg)
    assert train.left_out == ["train/cond/a.png", "train/cond/b.png", "train/cond/c.png", "train/extra.png"]
    cond = cfg.model_copy(update={"image_column": "conditioning_image"})
    for split in ("train", "test"):
        _same("imagefolder conditioning_image_file_name", split, _ours(cond, split),
              _theirs(theirs[split], image="conditioning_image", label="kind"), labels=CLASSES.index)


def test_imagefolder_labels_from_class_folders_and_metadata_parquet(tmp_path):
    """Without metadata: split folders holding class folders (labels from the immediate parent, names sorted); a
    metadata.parquet written by `datasets` is read like metadata.jsonl."""
    classes = tmp_path / "classes"
    _images(classes, ["train/cat/1.png", "train/dog/2.png", "train/cat/3.png", "train/emu/4.png"])
    _images(classes, ["validation/dog/5.png", "validation/cat/6.png"], first=10)
    theirs = datasets.load_dataset("imagefolder", data_dir=str(classes), cache_dir=str(tmp_path / "hf-cache"))
    assert theirs["train"].features["label"].names == CLASSES
    cfg = DataConfig(source="folder", path=str(classes), image_size=SIZE, num_workers=0)
    for split in ("train", "validation"):
        ours = {o["key"]: o for o in _ours(cfg, split)}
        rows = sorted(_theirs(theirs[split]), key=lambda t: t["file"])
        _same("imagefolder class folders", split, [ours[str(Path(t["file"]).relative_to(classes))] for t in rows],
              rows)
    assert heldout_split(cfg) == "validation" and class_names(cfg) == CLASSES

    meta = tmp_path / "meta"
    _images(meta, ["train/p.png", "train/q.png", "test/r.png"], first=20)
    for split, names in {"train": ["q.png", "p.png"], "test": ["r.png"]}.items():
        table = datasets.Dataset.from_dict({"file_name": names, "text": [f"caption of {n}" for n in names],
                                            "label": [len(n) % 2 + i for i, n in enumerate(names)]})
        table.to_parquet(str(meta / split / "metadata.parquet"))
    theirs = datasets.load_dataset("imagefolder", data_dir=str(meta), cache_dir=str(tmp_path / "hf-cache"))
    cfg = DataConfig(source="folder", path=str(meta), image_size=SIZE, num_workers=0, label_column="label")
    for split in ("train", "test"):
        _same("imagefolder + metadata.parquet", split, _ours(cfg, split), _theirs(theirs[split]))


def test_list_captions_are_drawn_by_the_sample_seed(tmp_path):
    """One caption of a row's list is drawn per sample from its seed (the same seed, the same caption: a resumed run
    draws the same ones); every caption of the list is drawn over seeds; held-out samples take the first."""
    root = tmp_path / "imgs"
    _images(root, ["a.png"])
    _metadata(root / "metadata.jsonl", [{"file_name": "a.png", "text": ["one", "two", "three"]}])
    folder = build_dataset(DataConfig(source="folder", path=str(root), image_size=SIZE), flip=False)
    drawn = [folder[(0, seed)]["text"] for seed in range(40)]
    assert set(drawn) == {"one", "two", "three"} and drawn == [folder[(0, seed)]["text"] for seed in range(40)]
    assert folder[0]["text"] == "one"
    _table(4, 0).to_parquet(str(tmp_path / "pq" / "train.parquet"))
    stream = build_dataset(DataConfig(source="parquet", path=str(tmp_path / "pq"), image_size=SIZE), flip=False)
    group = stream.urls[0]
    record = next(r for r in stream.read(group) if r["__key__"].endswith("@2"))  # captions ["row 2 take 0", ...]
    texts = {stream.decode(group, record, seed)["text"] for seed in range(40)}
    assert texts == {"row 2 take 0", "row 2 take 1", "row 2 take 2"}
