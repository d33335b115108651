import os

import numpy as np
import pytest
from PIL import Image

from genforge.data import folder as folder_module
from genforge.data.folder import ImageFolderDataset, split_of
from genforge.data.shapes import ShapesDataset, write_shapes_folder


def _tree(root, names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (12, 10), (len(name) * 9 % 255, 50, 90)).save(path)
    return root


def test_recursive_discovery_labels_and_captions(tmp_path):
    _tree(tmp_path, ["cats/a.jpg", "cats/deep/b.PNG", "dogs/c.webp", "dogs/d.Jpeg", "dogs/e.bmp",
                     "dogs/.hidden.png", ".git/x.png", "dogs/notes.gif"])
    (tmp_path / "cats" / "a.txt").write_text("  a cat\n", encoding="utf-8")
    ds = ImageFolderDataset(tmp_path, 8, split="all")
    assert ds.files == ["cats/a.jpg", "cats/deep/b.PNG", "dogs/c.webp", "dogs/d.Jpeg", "dogs/e.bmp"]
    assert ds.class_names == ["cats", "dogs"] and ds.num_classes == 2
    s = ds[0]
    assert s["label"] == 0 and s["text"] == "a cat" and s["key"] == "cats/a.jpg"
    assert s["image"].shape == (3, 8, 8) and s["image"].dtype.is_floating_point
    assert ds[1]["label"] == 0 and ds[2]["label"] == 1 and "text" not in ds[2]


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
    _tree(tmp_path / "mixed", ["a.png", "sub/b.png"])
    with pytest.raises(ValueError, match="a.png"):
        ImageFolderDataset(tmp_path / "mixed", 8)


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
