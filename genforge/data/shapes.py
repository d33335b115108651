"""The built-in `shapes` data set: 1–3 coloured shapes on a plain or textured background.

Deterministic from (seed, index), any resolution. The *primary* shape is the large one, drawn last; the
class label is its (kind, colour): 4 kinds × 4 colours = 16 classes. Captions describe the scene, e.g.
"a large red circle above a small blue square".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset

from genforge.data.images import to_tensor

KINDS = ("circle", "square", "triangle", "cross")
COLORS = {"red": (220, 40, 40), "green": (40, 175, 60), "blue": (45, 85, 225), "yellow": (240, 215, 40)}
NUM_CLASSES = len(KINDS) * len(COLORS)
SUPERSAMPLE = 4  # draw at 4x and box-downsample: antialiased edges


@dataclass(frozen=True)
class ShapesSpec:
    """How many shapes per image and how often the background is textured."""

    min_shapes: int = 1
    max_shapes: int = 3
    textured_fraction: float = 0.5

    def __post_init__(self) -> None:
        if not 1 <= self.min_shapes <= 3:
            raise ValueError(f"min_shapes={self.min_shapes} must be in 1..3")
        if not self.min_shapes <= self.max_shapes <= 3:
            raise ValueError(f"max_shapes={self.max_shapes} must be in min_shapes..3")
        if not 0.0 <= self.textured_fraction <= 1.0:
            raise ValueError(f"textured_fraction={self.textured_fraction} must be in [0, 1]")


def class_name(label: int) -> str:
    """16 labels -> "red circle", "green circle", ... (kind-major)."""
    kind, colour = divmod(label, len(COLORS))
    return f"{list(COLORS)[colour]} {KINDS[kind]}"


def class_names() -> list[str]:
    return [class_name(i) for i in range(NUM_CLASSES)]


def _background(rng: np.random.Generator, side: int, textured: bool) -> np.ndarray:
    """A muted base colour, optionally with low-contrast stripes, checks or a gradient: [side, side, 3]."""
    base = rng.uniform(70, 170) + rng.uniform(-15, 15, size=3)
    img = np.broadcast_to(base, (side, side, 3)).astype(np.float32)
    if textured:
        yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
        pattern = rng.integers(3)
        if pattern == 0:  # stripes in a random direction
            angle, freq = rng.uniform(0, np.pi), rng.uniform(3, 8)
            wave = np.sin(2 * np.pi * freq * (xx * np.cos(angle) + yy * np.sin(angle)))
        elif pattern == 1:  # checkerboard
            cells = rng.integers(3, 9)
            wave = ((np.floor(xx * cells) + np.floor(yy * cells)) % 2) * 2 - 1
        else:  # linear gradient
            angle = rng.uniform(0, 2 * np.pi)
            wave = (xx - 0.5) * np.cos(angle) + (yy - 0.5) * np.sin(angle)
        img = img + rng.uniform(8, 16) * wave[..., None]
    return img


def _draw(draw: ImageDraw.ImageDraw, kind: str, cx: float, cy: float, r: float, fill: tuple[int, int, int]) -> None:
    """One shape of half-extent r centred at (cx, cy), in canvas pixels."""
    if kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif kind == "square":
        s = r * 0.9
        draw.rectangle([cx - s, cy - s, cx + s, cy + s], fill=fill)
    elif kind == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=fill)
    else:  # cross
        w = r * 0.36
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)


def _relation(primary: tuple[float, float], other: tuple[float, float]) -> str:
    """Where the primary shape is relative to another (image y grows downwards)."""
    dx, dy = primary[0] - other[0], primary[1] - other[1]
    if abs(dy) >= abs(dx):
        return "above" if dy < 0 else "below"
    return "left of" if dx < 0 else "right of"


def render_shapes(seed: int, index: int, size: int, spec: ShapesSpec = ShapesSpec()) -> tuple[np.ndarray, int, str]:
    """Image [size, size, 3] uint8, class label and caption of sample `index` of the set `seed`."""
    if size < 8:
        raise ValueError(f"image size {size} is too small for shapes (need >= 8)")
    rng = np.random.default_rng([seed, index])
    side = size * SUPERSAMPLE
    canvas = Image.fromarray(
        np.clip(_background(rng, side, rng.random() < spec.textured_fraction), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    colours = list(COLORS)
    n_shapes = int(rng.integers(spec.min_shapes, spec.max_shapes + 1))

    kind, colour = KINDS[rng.integers(len(KINDS))], colours[rng.integers(len(colours))]
    r = rng.uniform(0.18, 0.27)
    centre = rng.uniform(r + 0.03, 1 - r - 0.03, size=2)
    others = []
    for _ in range(n_shapes - 1):  # distractors: at most half the primary's size, mostly beside it
        rd = rng.uniform(0.07, 0.5 * r)
        for _try in range(20):
            c = rng.uniform(rd + 0.02, 1 - rd - 0.02, size=2)
            if np.abs(c - centre).max() > r + 0.5 * rd:
                break
        others.append((KINDS[rng.integers(len(KINDS))], colours[rng.integers(len(colours))], rd, c))
    for k, col, rd, c in others:
        _draw(draw, k, c[0] * side, c[1] * side, rd * side, COLORS[col])
    _draw(draw, kind, centre[0] * side, centre[1] * side, r * side, COLORS[colour])

    image = np.asarray(canvas.resize((size, size), Image.Resampling.BOX))
    label = KINDS.index(kind) * len(COLORS) + colours.index(colour)
    caption = f"a large {colour} {kind}"
    if others:
        k, col, _, c = others[0]
        caption += f" {_relation(tuple(centre), tuple(c))} a small {col} {k}"
        caption += "".join(f" and a small {col} {k}" for k, col, _, _ in others[1:])
    return image, label, caption


def mirror_caption(caption: str) -> str:
    """The caption of the horizontally flipped image."""
    return caption.replace("left of", "\0").replace("right of", "left of").replace("\0", "right of")


class ShapesDataset(Dataset):
    """Index i -> render_shapes(seed, i); items are ints or (index, aug_seed) tuples from the sampler."""

    num_classes = NUM_CLASSES

    def __init__(self, n: int, image_size: int, seed: int = 0, spec: ShapesSpec = ShapesSpec(),
                 flip: bool = False) -> None:
        self.n, self.image_size, self.seed, self.spec, self.flip = n, image_size, seed, spec, flip

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, item: int | tuple[int, int]) -> dict:
        index, aug_seed = item if isinstance(item, tuple) else (item, None)
        if not 0 <= index < self.n:
            raise IndexError(index)
        image, label, caption = render_shapes(self.seed, index, self.image_size, self.spec)
        if self.flip and aug_seed is not None and np.random.default_rng(aug_seed).random() < 0.5:
            image, caption = image[:, ::-1], mirror_caption(caption)
        return {"image": to_tensor(image), "label": label, "text": caption, "key": f"shapes-{self.seed}-{index:08d}"}


def render_batch(n: int, image_size: int, seed: int = 0, spec: ShapesSpec = ShapesSpec(),
                 start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n images [n, 3, H, W] in [-1, 1] and labels [n], for judges and reference sets."""
    images, labels = zip(*(render_shapes(seed, i, image_size, spec)[:2] for i in range(start, start + n)))
    return to_tensor(np.stack(images)), torch.tensor(labels)


def write_shapes_folder(out: str | Path, n: int, image_size: int, seed: int = 0,
                        spec: ShapesSpec = ShapesSpec()) -> Path:
    """Write the set as `out/<NN>_<colour>_<kind>/<key>.png` + `<key>.txt` caption (sorted folder names
    give the same label indices as ShapesDataset)."""
    root = Path(out)
    for label in range(NUM_CLASSES):  # every class folder, so labels match even when a class is absent
        (root / f"{label:02d}_{class_name(label).replace(' ', '_')}").mkdir(parents=True, exist_ok=True)
    for index in range(n):
        image, label, caption = render_shapes(seed, index, image_size, spec)
        folder = root / f"{label:02d}_{class_name(label).replace(' ', '_')}"
        folder.mkdir(parents=True, exist_ok=True)
        key = f"shapes-{seed}-{index:08d}"
        Image.fromarray(image).save(folder / f"{key}.png")
        (folder / f"{key}.txt").write_text(caption + "\n")
    return root
