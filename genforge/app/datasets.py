"""The built-in data sets written to disk (`genforge data shapes`, `genforge data moving_shapes`): the procedural
shapes as an image folder, webdataset shards or parquet files, the moving shapes as a folder of GIFs / MP4s or
video shards; each returns the lines that say what was written and how to train on it."""

from __future__ import annotations

from pathlib import Path

from genforge.data.moving_shapes import PATHS, write_moving_shapes_folder, write_moving_shapes_shards
from genforge.data.shapes import write_shapes_folder, write_shapes_parquet, write_shapes_shards

__all__ = ["CLIP_FORMATS", "PATHS", "write_moving_shapes", "write_shapes"]

CLIP_FORMATS = ("gif", "mp4")


def write_shapes(out: Path, n: int, image_size: int, seed: int = 0, layout: str = "folder",
                 shard_size: int = 1000) -> list[str]:
    """`n` shapes images of `image_size` px into `out` as `layout`: "folder" (class sub-folders, .txt captions),
    "shards" (webdataset .png, .txt, .cls; `shard_size` records each) or "parquet" (image, text, label as a Hugging
    Face dataset saves them; `shard_size` rows a file). Returns what to print."""
    size = f"{image_size}x{image_size}"
    if layout == "parquet":
        pattern, count = write_shapes_parquet(out, n, image_size, seed=seed, rows_per_file=shard_size)
        return [f"wrote {n} images of {size} in {count} parquet file(s): {pattern}",
                f"train on them: --set data.source=parquet --set \"data.path={pattern}\""]
    if layout == "shards":
        pattern, count = write_shapes_shards(out, n, image_size, seed=seed, shard_size=shard_size)
        return [f"wrote {n} images of {size} in {count} shard(s): {pattern}",
                f"train on them: --set data.source=shards --set \"data.path={pattern}\" --set model.num_classes=16"]
    if layout != "folder":
        raise ValueError(f"layout {layout!r}: allowed folder, shards, parquet")
    return [f"wrote {n} images of {size} to {write_shapes_folder(out, n, image_size, seed=seed)}"]


def write_moving_shapes(out: Path, n: int, image_size: int, frames: int, fmt: str = "gif", fps: float = 8.0,
                        seed: int = 0, shards: bool = False, shard_size: int = 1000, paths: str = "inside"
                        ) -> list[str]:
    """`n` moving-shapes clips of `frames` frames as a folder of `fmt` files (class sub-folders, .txt captions "a red
    circle moving left"), or with `shards` as webdataset video shards. Returns what to print."""
    if fmt not in CLIP_FORMATS:
        raise ValueError(f"--format {fmt!r}: allowed {', '.join(CLIP_FORMATS)}")
    if paths not in PATHS:
        raise ValueError(f"--paths {paths!r}: allowed {', '.join(PATHS)}")
    clips = f"{n} clips of {frames} frames at {image_size}x{image_size} ({fmt})"
    if shards:
        pattern, count = write_moving_shapes_shards(out, n, image_size, frames, seed=seed, fmt=fmt, fps=fps,
                                                    shard_size=shard_size, paths=paths)
        return [f"wrote {clips} in {count} shard(s): {pattern}",
                f"train on them: --set data.source=video_shards --set \"data.path={pattern}\" "
                f"--set data.video.num_frames={frames}"]
    root = write_moving_shapes_folder(out, n, image_size, frames, seed=seed, fmt=fmt, fps=fps, paths=paths)
    return [f"wrote {clips} to {root}",
            f"train on them: --set data.source=video_folder --set data.path={root} "
            f"--set data.video.num_frames={frames}"]
