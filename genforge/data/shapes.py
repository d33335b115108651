"""The built-in `shapes` data set: 1–3 coloured shapes on a plain or textured background.

Deterministic from (seed, index), any resolution. The *primary* shape is the large one, drawn last; the
class label is its (kind, colour): 4 kinds × 4 colours = 16 classes. Captions describe the scene, e.g.
"a large red circle above a small blue square".
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset

from genforge.core.config import DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import DataSource
from genforge.data.images import flip_drawn, to_tensor
from genforge.data.parquet import write_parquet
from genforge.data.shards import shard_pattern

KINDS = ("circle", "square", "triangle", "cross")
COLORS = {"red": (220, 40, 40), "green": (40, 175, 60), "blue": (45, 85, 225), "yellow": (240, 215, 40)}
NUM_CLASSES = len(KINDS) * len(COLORS)
SUPERSAMPLE = 4  # draw at 4x and box-downsample: antialiased edges
MIN_SIZE = 8


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
    """All 16 class names, in label order."""
    return [class_name(i) for i in range(NUM_CLASSES)]


class Shape(NamedTuple):
    """One shape: half-extent `radius` and `centre` (x, y) in units of the image side."""

    kind: str
    colour: str
    radius: float
    centre: np.ndarray


def render_background(rng: np.random.Generator, side: int, textured: bool) -> np.ndarray:
    """A muted base colour, optionally with low-contrast stripes, checks, a gradient or smooth noise:
    float [side, side, 3]."""
    base = rng.uniform(70, 170) + rng.uniform(-15, 15, size=3)
    img = np.broadcast_to(base, (side, side, 3)).astype(np.float32)
    if textured:
        yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
        pattern = rng.integers(4)
        if pattern == 0:  # stripes in a random direction
            angle, freq = rng.uniform(0, np.pi), rng.uniform(3, 8)
            wave = np.sin(2 * np.pi * freq * (xx * np.cos(angle) + yy * np.sin(angle)))
        elif pattern == 1:  # checkerboard
            cells = rng.integers(3, 9)
            wave = ((np.floor(xx * cells) + np.floor(yy * cells)) % 2) * 2 - 1
        elif pattern == 2:  # linear gradient
            angle = rng.uniform(0, 2 * np.pi)
            wave = 2 * ((xx - 0.5) * np.cos(angle) + (yy - 0.5) * np.sin(angle))
        else:  # smooth noise: a coarse random grid, bicubic-upsampled
            coarse = Image.fromarray(rng.uniform(-1, 1, size=(4, 4)).astype(np.float32))
            wave = np.asarray(coarse.resize((side, side), Image.Resampling.BICUBIC))
        img = img + rng.uniform(8, 16) * wave[..., None]
    return img


def _place(rng: np.random.Generator, radius: float, taken: list[Shape]) -> np.ndarray:
    """A centre for a shape of half-extent `radius` whose bounding box keeps clear of the `taken` shapes:
    the first of 32 random candidates that fits, else the one with the most room."""
    margin = radius + 0.02
    candidates = rng.uniform(margin, 1 - margin, size=(32, 2))
    gaps = [np.abs(candidates - s.centre).max(axis=1) - (s.radius + radius + 0.02) for s in taken]
    room = np.min(gaps, axis=0)  # Chebyshev distance between centres minus the half-extents and a gap
    fits = np.flatnonzero(room > 0)
    return candidates[fits[0] if len(fits) else room.argmax()]


def draw_shape(draw: ImageDraw.ImageDraw, shape: Shape, side: int) -> None:
    """Draw `shape` on a canvas of `side` pixels."""
    (cx, cy), r, fill = shape.centre * side, shape.radius * side, COLORS[shape.colour]
    if shape.kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape.kind == "square":
        s = r * 0.9
        draw.rectangle([cx - s, cy - s, cx + s, cy + s], fill=fill)
    elif shape.kind == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=fill)
    else:  # cross
        w = r * 0.36
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)


def _relation(primary: np.ndarray, other: np.ndarray) -> str:
    """Where the primary shape is relative to another, from their centres (image y grows downwards)."""
    dx, dy = primary - other
    if abs(dy) >= abs(dx):
        return "above" if dy < 0 else "below"
    return "left of" if dx < 0 else "right of"


def render_shapes(seed: int, index: int, size: int, spec: ShapesSpec = ShapesSpec()) -> tuple[np.ndarray, int, str]:
    """Image [size, size, 3] uint8, class label and caption of sample `index` of the set `seed`."""
    if size < MIN_SIZE:
        raise ValueError(f"image size {size} is too small for shapes (need >= {MIN_SIZE})")
    rng = np.random.default_rng([seed, index])
    side = size * SUPERSAMPLE
    textured = rng.random() < spec.textured_fraction
    canvas = Image.fromarray(np.clip(render_background(rng, side, textured), 0, 255).astype(np.uint8))
    n_shapes = int(rng.integers(spec.min_shapes, spec.max_shapes + 1))

    colours = list(COLORS)
    r = rng.uniform(0.18, 0.27)
    primary = Shape(KINDS[rng.integers(len(KINDS))], colours[rng.integers(len(colours))], r,
                    rng.uniform(r + 0.03, 0.97 - r, size=2))
    others: list[Shape] = []
    for _ in range(n_shapes - 1):  # distractors: at most half the primary's size, beside it
        rd = rng.uniform(0.07, 0.5 * r)
        others.append(Shape(KINDS[rng.integers(len(KINDS))], colours[rng.integers(len(colours))], rd,
                            _place(rng, rd, [primary, *others])))
    draw = ImageDraw.Draw(canvas)
    for shape in [*others, primary]:  # the primary last, on top
        draw_shape(draw, shape, side)

    image = np.asarray(canvas.resize((size, size), Image.Resampling.BOX))
    label = KINDS.index(primary.kind) * len(COLORS) + colours.index(primary.colour)
    caption = f"a large {primary.colour} {primary.kind}"
    if others:
        caption += f" {_relation(primary.centre, others[0].centre)} "
        caption += " and ".join(f"a small {s.colour} {s.kind}" for s in others)
    return image, label, caption


def shapes_key(seed: int, index: int) -> str:
    """The sample id of image `index` of the set `seed`."""
    return f"shapes-{seed}-{index:08d}"


def mirror_caption(caption: str) -> str:
    """The caption of the horizontally flipped image."""
    return caption.replace("left of", "\0").replace("right of", "left of").replace("\0", "right of")


class ShapesDataset(Dataset):
    """Index i -> render_shapes(seed, i); items are ints or (index, aug_seed) tuples from the sampler."""

    num_classes = NUM_CLASSES
    mirror_text = staticmethod(mirror_caption)  # the caption of a flipped image (for caches' flipped variants)

    def __init__(self, n: int, image_size: int, seed: int = 0, spec: ShapesSpec = ShapesSpec(),
                 flip: bool = False) -> None:
        if n < 0 or image_size < MIN_SIZE:
            raise ValueError(f"ShapesDataset needs n >= 0 and image_size >= {MIN_SIZE}, got n={n}, "
                             f"image_size={image_size}")
        self.n, self.image_size, self.seed, self.spec, self.flip = n, image_size, seed, spec, flip

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, item: int | tuple[int, int]) -> dict:
        index, aug_seed = item if isinstance(item, tuple) else (item, None)
        if not 0 <= index < self.n:
            raise IndexError(index)
        image, label, caption = render_shapes(self.seed, index, self.image_size, self.spec)
        if self.flip and flip_drawn(aug_seed):
            image, caption = image[:, ::-1], mirror_caption(caption)
        return {"image": to_tensor(image), "label": label, "text": caption, "key": shapes_key(self.seed, index)}


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
    folders = [root / f"{label:02d}_{class_name(label).replace(' ', '_')}" for label in range(NUM_CLASSES)]
    for folder in folders:  # every class folder, so labels match even when a class is absent
        folder.mkdir(parents=True, exist_ok=True)
    for index in range(n):
        image, label, caption = render_shapes(seed, index, image_size, spec)
        key = shapes_key(seed, index)
        Image.fromarray(image).save(folders[label] / f"{key}.png")
        (folders[label] / f"{key}.txt").write_text(caption + "\n", encoding="utf-8")
    return root


def png_file(image: np.ndarray) -> bytes:
    """A uint8 [H, W, 3] image as the bytes of a PNG file."""
    png = io.BytesIO()
    Image.fromarray(image).save(png, format="PNG")
    return png.getvalue()


def write_shapes_shards(out: str | Path, n: int, image_size: int, seed: int = 0, spec: ShapesSpec = ShapesSpec(),
                        shard_size: int = 1000) -> tuple[str, int]:
    """Write the set as webdataset shards `out/shapes-NNNNNN.tar` of `shard_size` records `<key>.png`,
    `<key>.txt` (caption), `<key>.cls` (label); returns the brace pattern naming them (a `data.path` for
    `data.source=shards`) and the number of shards."""
    from webdataset import ShardWriter

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(root / "shapes-%06d.tar"), maxcount=shard_size, verbose=0) as sink:
        for index in range(n):
            image, label, caption = render_shapes(seed, index, image_size, spec)
            sink.write({"__key__": shapes_key(seed, index), "png": png_file(image), "txt": caption, "cls": label})
    return shard_pattern(root, "shapes", n, shard_size)


def write_shapes_parquet(out: str | Path, n: int, image_size: int, seed: int = 0, spec: ShapesSpec = ShapesSpec(),
                         rows_per_file: int = 1000) -> tuple[str, int]:
    """Write the set as a Hugging Face dataset saved as parquet (`write_parquet`): files `out/train-NNNNNN.parquet`
    of columns image (PNG bytes in datasets' {bytes, path} struct), text (caption), label (ClassLabel of the 16
    shapes classes); returns the glob naming them (a `data.path` for `data.source=parquet`) and the file count."""
    def rows() -> Iterator[tuple[bytes, str, int]]:
        for index in range(n):
            image, label, caption = render_shapes(seed, index, image_size, spec)
            yield png_file(image), caption, label

    return write_parquet(out, "train", rows(), class_names(), rows_per_file)


HELDOUT_SEED_OFFSET = 1_000_003  # the held-out split renders another seed: images the training set never has


class ShapesSource(DataSource):
    """`data.source: shapes`: rendered on the fly; the held-out split is another seed."""

    name = "shapes"
    resize = "rendered at data.image_size (4x supersampled, box-filtered)"
    sections = ("shapes",)
    judge_classes = True

    def build(self, cfg: DataConfig, split: str, flip: bool, world_size: int | None) -> ShapesDataset:
        spec = ShapesSpec(cfg.shapes.min_shapes, cfg.shapes.max_shapes, cfg.shapes.textured_fraction)
        seed = cfg.shapes.seed + (HELDOUT_SEED_OFFSET if split == "val" else 0)
        return ShapesDataset(cfg.shapes.n, cfg.image_size, seed=seed, spec=spec, flip=flip)

    def heldout_split(self, cfg: DataConfig) -> str:
        return "val"

    def class_names(self, cfg: DataConfig) -> list[str]:
        return class_names()


DATA_SOURCES.register("shapes", ShapesSource())
