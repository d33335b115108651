"""The built-in `moving_shapes` video set: one shape of the `shapes` kinds and colours sliding across a still
background in one of four directions, captioned "a red circle moving left".

Deterministic from (seed, index), any resolution and clip length. Labels: `label` is the shapes class of the moving
shape (kind × colour, 16 classes, so the shapes judge scores each frame) and `direction` its motion (0..3 in
DIRECTIONS). A horizontal flip mirrors left and right in the frames, the direction and the caption.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import Dataset

from genforge.core.config import DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import DataInfo, DataSource
from genforge.data.images import flip_drawn, to_tensor
from genforge.data.shapes import (COLORS, HELDOUT_SEED_OFFSET, KINDS, MIN_SIZE, NUM_CLASSES, SUPERSAMPLE, Shape,
                                  class_name, class_names, draw_shape, render_background)
from genforge.data.shards import shard_pattern
from genforge.data.video import video_bytes, write_video

DIRECTIONS = ("left", "right", "up", "down")
DIRECTION_VECTORS = np.array([(-1.0, 0.0), (1.0, 0.0), (0.0, -1.0), (0.0, 1.0)])  # (dx, dy); image y grows down
MIRRORED_DIRECTION = (1, 0, 2, 3)  # left <-> right under a horizontal flip
PATHS = ("inside", "from_centre")  # where a clip's path lies (data.shapes.paths; render_moving_shapes)


def render_moving_shapes(seed: int, index: int, size: int, num_frames: int, textured_fraction: float = 0.5,
                         paths: str = "inside") -> tuple[np.ndarray, int, int, str]:
    """Frames uint8 [T, size, size, 3], class label, direction and caption of clip `index` of the set `seed`: the
    shape moves along its direction at constant speed and stays inside the frame. `paths` (PATHS): `inside`
    travels 30–45 % of the side from wherever that fits, so the start says much of the direction (a shape moving
    left starts in the right part); `from_centre` starts near the centre and travels 20–26 %, so only the caption
    (and the later frames) says which way it goes."""
    if paths not in PATHS:
        raise ValueError(f"paths={paths!r}: allowed {', '.join(PATHS)}")
    if size < MIN_SIZE:
        raise ValueError(f"image size {size} is too small for moving shapes (need >= {MIN_SIZE})")
    rng = np.random.default_rng([seed, index, 1])
    side = size * SUPERSAMPLE
    textured = rng.random() < textured_fraction
    background = Image.fromarray(np.clip(render_background(rng, side, textured), 0, 255).astype(np.uint8))
    kind, colour = int(rng.integers(len(KINDS))), int(rng.integers(len(COLORS)))
    direction = int(rng.integers(len(DIRECTIONS)))
    radius = rng.uniform(0.14, 0.2)
    low, high = radius + 0.03, 0.97 - radius  # where the centre may be
    vector = DIRECTION_VECTORS[direction]
    if paths == "inside":
        travel = rng.uniform(0.3, 0.45)
        start = rng.uniform(low, high, size=2)
        along = int(vector[1] != 0)  # the axis of motion: 0 = x, 1 = y
        start[along] = rng.uniform(low + travel, high) if vector[along] < 0 else rng.uniform(low, high - travel)
    else:  # from_centre: a start that any of the four directions keeps inside (a square about the centre)
        travel = rng.uniform(0.2, 0.26)
        start = rng.uniform(low + travel, high - travel, size=2)  # non-empty: travel <= 0.26 < 0.47 - radius
    progress = np.linspace(0.0, 1.0, num_frames) if num_frames > 1 else np.zeros(1)
    frames = []
    for p in progress:  # one small PIL drawing per frame (T of them), not per pixel
        canvas = background.copy()
        shape = Shape(KINDS[kind], list(COLORS)[colour], radius, start + vector * travel * p)
        draw_shape(ImageDraw.Draw(canvas), shape, side)
        frames.append(np.asarray(canvas.resize((size, size), Image.Resampling.BOX)))
    label = kind * len(COLORS) + colour
    return np.stack(frames), label, direction, f"a {class_name(label)} moving {DIRECTIONS[direction]}"


def mirror_direction_caption(caption: str) -> str:
    """The caption of the horizontally flipped clip."""
    return caption.replace("moving left", "\0").replace("moving right", "moving left").replace("\0", "moving right")


def moving_shapes_key(seed: int, index: int) -> str:
    return f"moving-shapes-{seed}-{index:08d}"


class MovingShapesDataset(Dataset):
    """Index i -> clip i of the set `seed` as `video` [3, T, H, W] in [-1, 1] with `label`, `direction`, `text` (and,
    with `frame_mask`, an all-True `frame_mask` [T]: every rendered clip is whole, data.video.min_frames)."""

    num_classes = NUM_CLASSES
    mirror_text = staticmethod(mirror_direction_caption)

    def __init__(self, n: int, image_size: int, num_frames: int, seed: int = 0, textured_fraction: float = 0.5,
                 flip: bool = False, frame_mask: bool = False, paths: str = "inside") -> None:
        if n < 0 or image_size < MIN_SIZE or num_frames < 1:
            raise ValueError(f"MovingShapesDataset needs n >= 0, image_size >= {MIN_SIZE} and num_frames >= 1, got "
                             f"n={n}, image_size={image_size}, num_frames={num_frames}")
        self.n, self.image_size, self.num_frames, self.seed = n, image_size, num_frames, seed
        self.textured_fraction, self.flip, self.frame_mask, self.paths = textured_fraction, flip, frame_mask, paths

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, item: int | tuple[int, int]) -> dict[str, Any]:
        index, aug_seed = item if isinstance(item, tuple) else (item, None)
        if not 0 <= index < self.n:
            raise IndexError(index)
        frames, label, direction, caption = render_moving_shapes(self.seed, index, self.image_size, self.num_frames,
                                                                 self.textured_fraction, self.paths)
        if self.flip and flip_drawn(aug_seed):
            frames, direction, caption = frames[:, :, ::-1], MIRRORED_DIRECTION[direction], \
                mirror_direction_caption(caption)
        video = to_tensor(frames).movedim(0, 1)  # [T, 3, H, W] -> [3, T, H, W]
        sample = {"video": video, "label": label, "direction": direction, "text": caption,
                  "key": moving_shapes_key(self.seed, index)}
        if self.frame_mask:
            sample["frame_mask"] = torch.ones(self.num_frames, dtype=torch.bool)
        return sample


def render_clips(n: int, image_size: int, num_frames: int, seed: int = 0, textured_fraction: float = 0.5,
                 start: int = 0, paths: str = "inside") -> dict[str, torch.Tensor]:
    """n clips `video` [n, 3, T, H, W] with `label` [n] and `direction` [n], for judges and reference sets."""
    items = [render_moving_shapes(seed, i, image_size, num_frames, textured_fraction, paths)
             for i in range(start, start + n)]
    frames, labels, directions, _ = zip(*items)
    return {"video": to_tensor(np.stack(frames)).movedim(1, 2), "label": torch.tensor(labels),
            "direction": torch.tensor(directions)}


def write_moving_shapes_folder(out: str | Path, n: int, image_size: int, num_frames: int, seed: int = 0,
                               fmt: str = "gif", fps: float = 8.0, textured_fraction: float = 0.5,
                               paths: str = "inside") -> Path:
    """Write the set as `out/<NN>_<colour>_<kind>/<key>.<gif|mp4>` + `<key>.txt` caption (the class folders of
    `write_shapes_folder`, so a video folder of it has the shapes labels)."""
    root = Path(out)
    folders = [root / f"{label:02d}_{class_name(label).replace(' ', '_')}" for label in range(NUM_CLASSES)]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    for index in range(n):
        frames, label, _, caption = render_moving_shapes(seed, index, image_size, num_frames, textured_fraction, paths)
        key = moving_shapes_key(seed, index)
        write_video(frames, folders[label] / f"{key}.{fmt}", fps, fmt)
        (folders[label] / f"{key}.txt").write_text(caption + "\n", encoding="utf-8")
    return root


def write_moving_shapes_shards(out: str | Path, n: int, image_size: int, num_frames: int, seed: int = 0,
                               fmt: str = "mp4", fps: float = 8.0, textured_fraction: float = 0.5,
                               shard_size: int = 1000, paths: str = "inside") -> tuple[str, int]:
    """Write the set as webdataset shards `out/moving-shapes-NNNNNN.tar` of `shard_size` records `<key>.<mp4|gif>`,
    `<key>.txt` (caption), `<key>.cls` (label), `<key>.json` ({"direction": d}); returns the brace pattern naming
    them (a `data.path` for `data.source=video_shards`) and the number of shards."""
    from webdataset import ShardWriter

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(root / "moving-shapes-%06d.tar"), maxcount=shard_size, verbose=0) as sink:
        for index in range(n):
            frames, label, direction, caption = render_moving_shapes(seed, index, image_size, num_frames,
                                                                     textured_fraction, paths)
            sink.write({"__key__": moving_shapes_key(seed, index), fmt: video_bytes(frames, fmt, fps),
                        "txt": caption, "cls": label, "json": json.dumps({"direction": int(direction)})})
    return shard_pattern(root, "moving-shapes", n, shard_size)


class MovingShapesSource(DataSource):
    """`data.source: moving_shapes`: rendered on the fly (`data.shapes.n`, `.seed`, `.textured_fraction`, `.paths`;
    clip length `data.video.num_frames`); the held-out split is another seed."""

    name = "moving_shapes"
    field = "video"
    sections = ("shapes", "video", "images")
    resize = "rendered at data.image_size (4x supersampled, box-filtered)"
    judge_classes, motion = True, True

    def build(self, cfg: DataConfig, split: str, flip: bool, world_size: int | None) -> MovingShapesDataset:
        seed = cfg.shapes.seed + (HELDOUT_SEED_OFFSET if split == "val" else 0)
        return MovingShapesDataset(cfg.shapes.n, cfg.image_size, cfg.video.num_frames, seed=seed,
                                   textured_fraction=cfg.shapes.textured_fraction, flip=flip,
                                   frame_mask=cfg.video.min_frames is not None, paths=cfg.shapes.paths)

    def info(self, dataset: Dataset, cfg: DataConfig) -> DataInfo:
        return DataInfo(num_classes=NUM_CLASSES, channels=3, image_size=cfg.image_size, kind="video")

    def heldout_split(self, cfg: DataConfig) -> str:
        return "val"

    def class_names(self, cfg: DataConfig) -> list[str]:
        return class_names()


DATA_SOURCES.register("moving_shapes", MovingShapesSource())
