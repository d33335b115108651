from collections import Counter

import numpy as np
import pytest

from genforge.data.shapes import (NUM_CLASSES, ShapesDataset, ShapesSpec, class_name, class_names,
                                  mirror_caption, render_shapes)


def test_deterministic_from_seed_and_index():
    a, la, ca = render_shapes(0, 7, 32)
    b, lb, cb = render_shapes(0, 7, 32)
    assert np.array_equal(a, b) and la == lb and ca == cb
    assert not np.array_equal(a, render_shapes(0, 8, 32)[0])
    assert not np.array_equal(a, render_shapes(1, 7, 32)[0])


@pytest.mark.parametrize("size", [16, 32, 64, 100])
def test_any_resolution(size):
    image, label, _ = render_shapes(3, 1, size)
    assert image.shape == (size, size, 3) and image.dtype == np.uint8
    assert render_shapes(3, 1, 32)[1] == label  # same scene at every resolution


def test_labels_uniform_and_captions_consistent():
    labels = []
    for i in range(2000):
        _, label, caption = render_shapes(0, i, 16, ShapesSpec())
        assert caption.startswith(f"a large {class_name(label)}")
        labels.append(label)
    counts = Counter(labels)
    assert set(counts) == set(range(NUM_CLASSES))
    assert min(counts.values()) > 2000 / NUM_CLASSES * 0.6
    assert len(set(class_names())) == NUM_CLASSES


def test_shape_counts_follow_spec_and_relations_appear():
    captions = [render_shapes(0, i, 16, ShapesSpec(2, 2, 0.0))[2] for i in range(200)]
    assert all(c.count(" a small ") == 1 for c in captions)
    assert all(any(w in c for c in captions) for w in ("above", "below", "left of", "right of"))
    assert all(" a small " not in render_shapes(0, i, 16, ShapesSpec(1, 1))[2] for i in range(20))


def test_flip_mirrors_image_and_caption():
    ds = ShapesDataset(50, 32, flip=True)
    plain = ShapesDataset(50, 32, flip=False)
    flipped = 0
    for i in range(50):
        a, b = ds[(i, i)], plain[i]
        if not np.array_equal(a["image"].numpy(), b["image"].numpy()):
            flipped += 1
            assert np.array_equal(a["image"].numpy(), b["image"].numpy()[:, :, ::-1])
            assert a["text"] == mirror_caption(b["text"])
    assert 10 < flipped < 40
    assert mirror_caption("a large red circle left of a small blue square") == \
        "a large red circle right of a small blue square"


def test_sample_format():
    s = ShapesDataset(10, 16, seed=4)[3]
    assert s["image"].shape == (3, 16, 16) and -1 <= s["image"].min() and s["image"].max() <= 1
    assert s["key"] == "shapes-4-00000003" and isinstance(s["label"], int) and isinstance(s["text"], str)


@pytest.mark.parametrize("kwargs", [dict(min_shapes=0), dict(min_shapes=3, max_shapes=2), dict(max_shapes=4),
                                    dict(textured_fraction=1.5)])
def test_spec_validation(kwargs):
    with pytest.raises(ValueError):
        ShapesSpec(**kwargs)
