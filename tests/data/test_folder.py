import json
import os

import numpy as np
import pytest
from PIL import Image

from genforge.core.config import DataConfig
from genforge.data import folder as folder_module
from genforge.data.base import BadDataError
from genforge.data.folder import FolderSource, ImageFolderDataset, split_of
from genforge.data.shapes import ShapesDataset, write_shapes_folder


def _tree(root, names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (12, 10), (len(name) * 9 % 255, 50, 90)).save(path)
    return root


def test_recursive_discovery_labels_and_captions(tmp_path):
    _tree(tmp_path, ["cats/a.jpg", "cats/b.PNG", "dogs/c.webp", "dogs/d.Jpeg", "dogs/e.bmp",
                     "dogs/.hidden.png", ".git/x.png", "dogs/notes.gif"])
    (tmp_path / "cats" / "a.txt").write_text("  a cat\n", encoding="utf-8")
    ds = ImageFolderDataset(tmp_path, 8, split="all")
    assert ds.files == ["cats/a.jpg", "cats/b.PNG", "dogs/c.webp", "dogs/d.Jpeg", "dogs/e.bmp"]
    assert ds.class_names == ["cats", "dogs"] and ds.num_classes == 2
    s = ds[0]
    assert s["label"] == 0 and s["text"] == "a cat" and s["key"] == "cats/a.jpg"
    assert s["image"].shape == (3, 8, 8) and s["image"].dtype.is_floating_point
    assert ds[1]["label"] == 0 and ds[2]["label"] == 1 and "text" not in ds[2]


def test_labels_are_the_immediate_parent_folder_when_every_image_sits_at_one_depth(tmp_path):
    """As `datasets` infers them: the immediate parent folder (not the first-level one), only when all images sit at
    one depth and there are two or more such folders; split folders are never classes."""
    nested = ImageFolderDataset(_tree(tmp_path / "nested", ["animals/cat/a.png", "animals/dog/b.png"]), 8, split="all")
    assert nested.class_names == ["cat", "dog"] and [nested[i]["label"] for i in range(2)] == [0, 1]
    deeper = ImageFolderDataset(_tree(tmp_path / "deeper", ["cat/a.png", "dog/sub/b.png"]), 8, split="all")
    assert deeper.num_classes == 0 and "label" not in deeper[0]
    one = ImageFolderDataset(_tree(tmp_path / "one", ["cat/a.png", "cat/b.png"]), 8, split="all")
    assert one.num_classes == 0
    splits = _tree(tmp_path / "splits", ["train/a.png", "train/b.png", "test/c.png"])
    assert ImageFolderDataset(splits, 8).num_classes == 0 and ImageFolderDataset(splits, 8).files == ["train/a.png",
                                                                                                        "train/b.png"]
    classes = _tree(tmp_path / "classes", ["train/cat/a.png", "train/dog/b.png", "test/dog/c.png"])
    train, test = ImageFolderDataset(classes, 8), ImageFolderDataset(classes, 8, split="test")
    assert train.class_names == ["cat", "dog"] and [train[i]["label"] for i in range(2)] == [0, 1]
    assert test.files == ["test/dog/c.png"] and test[0]["label"] == 1


def test_flip_follows_aug_seed(tmp_path):
    img = np.zeros((8, 8, 3), dtype=np.uint8)
    img[:, :4] = 255
    (tmp_path / "c").mkdir()
    Image.fromarray(img).save(tmp_path / "c" / "a.png")
    ds = ImageFolderDataset(tmp_path, 8, split="all", flip=True)
    left = [ds[(0, seed)]["image"][0, 0, 0].item() for seed in range(40)]
    assert 5 < left.count(1.0) < 35 and set(left) == {1.0, -1.0}
    assert left == [ds[(0, seed)]["image"][0, 0, 0].item() for seed in range(40)]  # same aug_seed, same flip
    assert ds[0]["image"][0, 0, 0] == 1.0  # plain index: never flipped


def test_unlabelled_root_and_mixed_layout(tmp_path):
    _tree(tmp_path / "flat", ["a.png", "b.png"])
    (tmp_path / "flat" / "notes").mkdir()  # a sub-folder without images does not make labels
    flat = ImageFolderDataset(tmp_path / "flat", 8, split="all")
    assert flat.num_classes == 0 and flat.class_names == [] and "label" not in flat[0]
    _tree(tmp_path / "mixed", ["a.png", "sub/b.png"])  # two depths: no labels, as in `datasets`
    mixed = ImageFolderDataset(tmp_path / "mixed", 8)
    assert mixed.num_classes == 0 and mixed.files == ["a.png", "sub/b.png"]


def test_split_is_stable_under_listing_order_and_additions(tmp_path, monkeypatch):
    names = [f"c/{i:03d}.png" for i in range(60)]
    _tree(tmp_path, names)
    val = set(ImageFolderDataset(tmp_path, 8, split="val", val_fraction=0.3).files)
    assert 5 < len(val) < 35
    real_walk = os.walk
    monkeypatch.setattr(folder_module.os, "walk",
                        lambda root: [(d, list(reversed(s)), list(reversed(f))) for d, s, f in real_walk(root)])
    reversed_ds = ImageFolderDataset(tmp_path, 8, split="val", val_fraction=0.3)
    assert set(reversed_ds.files) == val and reversed_ds.files == sorted(val)
    monkeypatch.undo()
    _tree(tmp_path, [f"c/new{i}.png" for i in range(20)])
    after = set(ImageFolderDataset(tmp_path, 8, split="val", val_fraction=0.3).files)
    assert after & set(names) == val
    train = set(ImageFolderDataset(tmp_path, 8, split="train", val_fraction=0.3).files)
    assert not train & after and len(train | after) == 80
    assert split_of("c/000.png", 0, 0.0) == "train" and split_of("c/000.png", 0, 1.0) == "val"


def test_bad_files_are_reported_not_raised(tmp_path):
    _tree(tmp_path, ["ok.png"])
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "noise.jpg").write_bytes(np.random.default_rng(0).bytes(500))
    good = (tmp_path / "ok.png").read_bytes()
    (tmp_path / "trunc.png").write_bytes(good[: len(good) // 2])
    _tree(tmp_path, ["badcaption.png"])
    (tmp_path / "badcaption.txt").write_bytes(b"\xff\xfe\xfa")
    ds = ImageFolderDataset(tmp_path, 8, split="all")
    results = {ds.files[i]: ds[i] for i in range(len(ds))}
    assert "image" in results["ok.png"]
    assert results["badcaption.png"]["text"] == "\ufffd" * 3  # a caption that is not UTF-8 keeps its image
    for bad in ("empty.jpg", "noise.jpg", "trunc.png"):
        assert set(results[bad]) == {"key", "bad"} and results[bad]["key"] == bad and results[bad]["bad"]
    assert "cannot identify image file" in results["noise.jpg"]["bad"]


def test_missing_and_empty_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.*does not exist"):
        ImageFolderDataset(tmp_path / "nope", 8)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "readme.txt").write_text("no images")
    with pytest.raises(ValueError, match=r"empty.*no images.*\.jpg.*\.webp"):
        ImageFolderDataset(tmp_path / "empty", 8)
    _tree(tmp_path / "one", ["a.png"])
    with pytest.raises(ValueError, match="split"):
        ImageFolderDataset(tmp_path / "one", 8, split="val", val_fraction=0.0)
    with pytest.raises(ValueError, match="val_fraction"):
        ImageFolderDataset(tmp_path / "one", 8, val_fraction=1.5)


def test_shapes_folder_round_trip(tmp_path):
    write_shapes_folder(tmp_path, 40, 16, seed=2)
    ds = ImageFolderDataset(tmp_path, 16, split="all")
    shapes = ShapesDataset(40, 16, seed=2)
    by_key = {shapes[i]["key"]: shapes[i] for i in range(40)}
    assert len(ds) == 40 and ds.num_classes == shapes.num_classes
    for i in range(len(ds)):
        s = ds[i]
        ref = by_key[s["key"].split("/")[1].removesuffix(".png")]
        assert s["label"] == ref["label"] and s["text"] == ref["text"]
        assert np.array_equal(s["image"].numpy(), ref["image"].numpy())


def test_hugging_face_metadata_captions_labels_and_unusable_rows(tmp_path):
    """metadata.jsonl / metadata.csv at any depth (file_name relative to it): the caption from data.caption_column
    (a sidecar .txt only where the row has none), the label from data.label_column (names sorted into 0..K-1);
    rows naming no image, second rows, bad lines and images without a row are unreadable samples."""
    _tree(tmp_path, ["a.png", "b.png", "c.png", "orphan.png", "sub/d.png", "sub/e.png"])
    (tmp_path / "a.txt").write_text("sidecar of a")
    (tmp_path / "b.txt").write_text("sidecar of b")
    rows = [{"file_name": "a.png", "caption": "a from metadata", "kind": "dog"},
            {"file_name": "b.png", "kind": "cat"},  # no caption: its sidecar
            {"file_name": "gone.png", "caption": "x", "kind": "cat"},
            {"file_name": "a.png", "caption": "again", "kind": "dog"},
            {"file_name": "c.png", "caption": "no label"}]
    lines = [json.dumps(row) for row in rows] + ["not json"]
    (tmp_path / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "sub" / "metadata.csv").write_text('file_name,caption,kind\nd.png,"d, from\ncsv",emu\ne.png,,cat\n')
    ds = ImageFolderDataset(tmp_path, 8, split="all", caption_column="caption", label_column="kind")
    samples = {ds.files[i]: ds[i] for i in range(len(ds))}
    assert ds.class_names == ["cat", "dog", "emu"] and ds.num_classes == 3
    good = {k: (s.get("text"), s["label"]) for k, s in samples.items() if "bad" not in s}
    assert good == {"a.png": ("a from metadata", 1), "b.png": ("sidecar of b", 0), "sub/d.png": ("d, from\ncsv", 2),
                    "sub/e.png": (None, 0)}
    bad = {k: s["bad"] for k, s in samples.items() if "bad" in s}
    assert bad == {"metadata.jsonl@2": "file_name 'gone.png': gone.png does not exist",
                   "metadata.jsonl@3": "a second row for a.png (the first is metadata.jsonl@0)",
                   "metadata.jsonl@4": "no kind value",
                   "metadata.jsonl@5": bad["metadata.jsonl@5"]}
    assert bad["metadata.jsonl@5"].startswith("not JSON")
    assert ds.left_out == ["orphan.png"] and "left out 1 image(s)" in ds.notes()[0]  # no row: not read, as datasets
    assert [FolderSource().class_names(DataConfig(source="folder", path=str(tmp_path), label_column="kind",
                                                  caption_column="caption"))] == [["cat", "dog", "emu"]]
    (tmp_path / "labels").mkdir()
    _tree(tmp_path / "labels", ["x.png", "y.png"])
    (tmp_path / "labels" / "metadata.csv").write_text("file_name,text,label\nx.png,ex,3\ny.png,why,0\n")
    ints = ImageFolderDataset(tmp_path / "labels", 8, split="all", label_column="label")  # integers stay indices
    assert [ints[i]["label"] for i in range(2)] == [3, 0] and ints.num_classes == 4 and ints.class_names == []
    assert [ints[i]["text"] for i in range(2)] == ["ex", "why"]  # the default caption column: text


def test_metadata_files_missing_a_column_are_refused_naming_it(tmp_path):
    _tree(tmp_path, ["a.png"])
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "a.png", "text": "t"}) + "\n")
    with pytest.raises(BadDataError, match=r"metadata.jsonl has no column 'label' \(data.label_column\); its "
                                           r"columns: 'file_name', 'text'"):
        ImageFolderDataset(tmp_path, 8, label_column="label")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"image": "a.png"}) + "\n")
    with pytest.raises(BadDataError, match=r"has no column 'file_name' \(the image of each row\); its columns: "
                                           r"'image'"):
        ImageFolderDataset(tmp_path, 8)
    (tmp_path / "metadata.jsonl").unlink()
    with pytest.raises(BadDataError, match="data.label_column='label' names a column of metadata.jsonl / .csv"):
        ImageFolderDataset(tmp_path, 8, label_column="label")
    with pytest.raises(ValueError, match="data.label_column is not read by data.source=shapes"):
        DataConfig(source="shapes", label_column="label")


def train_clip_debug_on(folder, run_dir, monkeypatch) -> tuple[list[str], object]:
    """Train clip-debug 3 steps on an image folder; return the captions its batches held, and its config."""
    from genforge.app.config import load_config
    from genforge.app.runs import make_trainer
    from genforge.families.clip.task import ClipTask

    seen: list[str] = []
    plain = ClipTask.loss

    def loss(self, batch, phase, step):
        seen.extend(batch["text"])
        return plain(self, batch, phase, step)

    monkeypatch.setattr(ClipTask, "loss", loss)
    cfg = load_config("clip-debug", ["data.source=folder", f"data.path={folder}", "train.steps=3",
                                     "train.sample_every=0", "train.checkpoint_every=3", "eval.every=0"])
    make_trainer(cfg, run_dir).fit()
    return seen, cfg


def test_a_metadata_folder_trains_a_text_model_on_its_captions(tmp_path, monkeypatch):
    """A folder laid out for diffusers' train_text_to_image.py (images + metadata.jsonl, no sidecars) trains CLIP's
    text tower: the metadata captions are the batch's `text`, and the row naming no image is listed as skipped."""
    names = [f"{i:02d}.png" for i in range(7)]  # + the row naming no image: 8 samples, one global batch
    _tree(tmp_path / "data", names)
    captions = {name: f"picture number {i}" for i, name in enumerate(names)}
    rows = [{"file_name": name, "text": caption} for name, caption in captions.items()]
    rows.append({"file_name": "missing.png", "text": "nothing"})
    (tmp_path / "data" / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    seen, _ = train_clip_debug_on(tmp_path / "data", tmp_path / "run", monkeypatch)
    assert len(seen) == 3 * 8 and set(seen) <= set(captions.values())
    skipped = [json.loads(line) for line in (tmp_path / "run" / "skipped.jsonl").read_text().splitlines()]
    assert [(s["key"], s["reason"]) for s in skipped] == [
        ("metadata.jsonl@7", "file_name 'missing.png': missing.png does not exist")]


def test_a_split_folder_trains_on_train_with_list_captions_and_counts_what_it_leaves_out(tmp_path, monkeypatch,
                                                                                          status):
    """train/ and test/ with metadata.jsonl (lists of captions, as diffusers' datasets hold them): only train's rows
    train, one caption of each list drawn per sample; an image without a row is left out, said at the start and in
    the closing summary (not a skipped sample); held-out samples come from test, which the run says."""
    from genforge.data.loader import heldout_batch

    root = tmp_path / "data"
    train_names, test_names = [f"train/{i}.png" for i in range(8)], ["test/a.png", "test/b.png"]
    _tree(root, train_names + test_names + ["train/no-row.png"])
    train_captions = {name: [f"train {i} one", f"train {i} two"] for i, name in enumerate(train_names)}
    (root / "train" / "metadata.jsonl").write_text("".join(
        json.dumps({"file_name": name.split("/")[1], "text": captions}) + "\n"
        for name, captions in train_captions.items()))
    (root / "test" / "metadata.jsonl").write_text("".join(
        json.dumps({"file_name": name.split("/")[1], "text": [f"held out {name}"]}) + "\n" for name in test_names))
    seen, cfg = train_clip_debug_on(root, tmp_path / "run", monkeypatch)
    allowed = {c for captions in train_captions.values() for c in captions}
    assert len(seen) == 3 * 8 and set(seen) <= allowed and len(set(seen)) > 8  # both captions of some images
    assert not (tmp_path / "run" / "skipped.jsonl").exists()
    assert status.text.count("left out 1 image(s)") == 2 and "train/no-row.png" in status.text  # start + summary
    held = heldout_batch(cfg.data, 2)
    assert held["key"] == test_names and held["text"] == [f"held out {name}" for name in test_names]
    assert "held-out samples (evaluation, FID reference, previews): the 'test' split of" in status.text
