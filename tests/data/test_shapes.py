from collections import Counter

import numpy as np
import pytest
from PIL import Image

from genforge.data.shapes import (COLORS, KINDS, NUM_CLASSES, ShapesDataset, ShapesSpec, class_name, class_names,
                                  mirror_caption, render_shapes, write_shapes_folder)


def test_deterministic_from_seed_and_index():
    a, la, ca = render_shapes(0, 7, 32)
    b, lb, cb = render_shapes(0, 7, 32)
    assert a.tobytes() == b.tobytes() and la == lb and ca == cb
    assert a.tobytes() != render_shapes(0, 8, 32)[0].tobytes()
    assert a.tobytes() != render_shapes(1, 7, 32)[0].tobytes()


@pytest.mark.parametrize("size", [16, 32, 64, 100])
def test_any_resolution(size):
    image, label, caption = render_shapes(3, 1, size)
    assert image.shape == (size, size, 3) and image.dtype == np.uint8
    assert render_shapes(3, 1, 32)[1:] == (label, caption)  # the same scene at every resolution


def test_labels_uniform_and_captions_consistent():
    labels = []
    for i in range(2000):
        _, label, caption = render_shapes(0, i, 16)
        assert caption.startswith(f"a large {class_name(label)}")
        labels.append(label)
    counts = Counter(labels)
    assert set(counts) == set(range(NUM_CLASSES))
    assert min(counts.values()) > 2000 / NUM_CLASSES * 0.7 and max(counts.values()) < 2000 / NUM_CLASSES * 1.3
    assert class_names()[0] == "red circle" and class_name(NUM_CLASSES - 1) == "yellow cross"
    assert len(set(class_names())) == NUM_CLASSES == len(KINDS) * len(COLORS)


def test_shape_counts_follow_spec_and_relations_appear():
    captions = [render_shapes(0, i, 16, ShapesSpec(2, 2, 0.0))[2] for i in range(200)]
    assert all(c.count(" a small ") == 1 for c in captions)
    assert all(any(w in c for c in captions) for w in ("above", "below", "left of", "right of"))
    assert all(render_shapes(0, i, 16, ShapesSpec(3, 3))[2].count(" a small ") == 2 for i in range(20))
    assert all(" a small " not in render_shapes(0, i, 16, ShapesSpec(1, 1))[2] for i in range(20))


def test_primary_colour_dominates_a_plain_scene():
    for i in range(20):  # one shape, no texture: the pixels closest to the label's colour are many
        image, label, _ = render_shapes(0, i, 32, ShapesSpec(1, 1, 0.0))
        rgb = np.array(list(COLORS.values()), dtype=np.float32)
        distance = np.linalg.norm(image[..., None, :].astype(np.float32) - rgb, axis=-1)
        colour = list(COLORS).index(class_name(label).split()[0])
        assert (distance[..., colour] < 40).mean() > 0.05


def test_flip_mirrors_image_and_caption():
    ds = ShapesDataset(50, 32, flip=True)
    plain = ShapesDataset(50, 32, flip=False)
    flipped = 0
    for i in range(50):
        a, b = ds[(i, i)], plain[(i, i)]
        if not np.array_equal(a["image"].numpy(), b["image"].numpy()):
            flipped += 1
            assert np.array_equal(a["image"].numpy(), b["image"].numpy()[:, :, ::-1])
            assert a["text"] == mirror_caption(b["text"]) and a["label"] == b["label"]
    assert 10 < flipped < 40
    assert mirror_caption("a large red circle left of a small blue square") == \
        "a large red circle right of a small blue square"
    assert mirror_caption("a large red circle right of a small blue square") == \
        "a large red circle left of a small blue square"


def test_sample_format():
    s = ShapesDataset(10, 16, seed=4)[3]
    assert s["image"].shape == (3, 16, 16) and s["image"].dtype.is_floating_point
    assert -1 <= s["image"].min() and s["image"].max() <= 1
    assert s["key"] == "shapes-4-00000003" and isinstance(s["label"], int) and isinstance(s["text"], str)
    assert len(ShapesDataset(10, 16)) == 10 and ShapesDataset.num_classes == 16
    with pytest.raises(IndexError):
        ShapesDataset(10, 16)[10]


@pytest.mark.parametrize("kwargs, field", [(dict(min_shapes=0), "min_shapes"),
                                           (dict(min_shapes=3, max_shapes=2), "max_shapes"),
                                           (dict(max_shapes=4), "max_shapes"),
                                           (dict(textured_fraction=1.5), "textured_fraction")])
def test_spec_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ShapesSpec(**kwargs)


def test_write_shapes_folder(tmp_path):
    root = write_shapes_folder(tmp_path / "s", 12, 16, seed=1)
    folders = sorted(p.name for p in root.iterdir())
    assert len(folders) == NUM_CLASSES and folders[0] == "00_red_circle" and folders[-1] == "15_yellow_cross"
    image, label, caption = render_shapes(1, 5, 16)
    folder = root / folders[label]
    with Image.open(folder / "shapes-1-00000005.png") as written:
        assert np.array_equal(np.asarray(written), image)
    assert (folder / "shapes-1-00000005.txt").read_text().strip() == caption
    assert len(list(root.rglob("*.png"))) == 12
