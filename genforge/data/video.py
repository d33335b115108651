"""Video clips: seeking decode with PyAV, the clip's frame indices (count, stride or fps, random temporal crop), the
resize + centre crop and flip shared by every frame, GIF / MP4 writing, and `data.source: video_folder`.

A clip is `num_frames` frames [C, T, H, W] in [-1, 1], RGB (PyAV converts to rgb24: no BGR order). Reading one
seeks to the keyframe before the clip and decodes forward until the clip is complete, so a clip from a long file
never decodes the whole file. A video too short for the clip, or that ends before its header says (truncated),
is an unreadable sample: skipped and listed in `skipped.jsonl` like an unreadable image.

Variable-length clips (`data.video.min_frames`, phenaki-pytorch's `video_frame_mask`): a video too short for the
clip but long enough for `min_frames` of its frames gives those frames from its start, padded to `num_frames` by
repeating the last one, and every clip sample then carries `frame_mask` bool [T] (True = a real frame; all True for
a full clip, so batches stack). The video families keep the padded frames out of their losses.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, BinaryIO

import av
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from genforge.core.config import DataConfig, VideoConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import DataInfo
from genforge.data.folder import FolderSource, ImageFolderDataset, check_folder, folder_listing
from genforge.data.images import flip_drawn
from genforge.data.shards import Record, ShardDataset, ShardsSource, add_text_and_label, record_meta, shard_name

VIDEO_EXTENSIONS = (".mp4", ".webm", ".mov", ".mkv", ".avi", ".gif")
VIDEO_RESIZE = ("short side resized to data.image_size (bicubic, antialiased), centre crop; the same crop and flip on "
                "every frame")


class VideoTooShort(ValueError):
    """A video with fewer frames than the clip spans."""


@dataclass(frozen=True)
class DecodedClip:
    """The clip's frames uint8 [T, H, W, 3] (RGB), and how many frames the decoder produced to get them."""

    frames: np.ndarray
    decoded: int


def short_clip(real: int, spec: VideoConfig, why: str) -> int:
    """The `real` frames a video too short for a whole clip still gives (from its start), when `spec.min_frames`
    allows that many; VideoTooShort (`why`) otherwise."""
    if spec.min_frames is None:
        raise VideoTooShort(why)
    if real < spec.min_frames:
        raise VideoTooShort(f"{why}, and only {real} of them, fewer than data.video.min_frames={spec.min_frames}")
    return real


def clip_frame_indices(total: int, spec: VideoConfig, u: float | None) -> np.ndarray:
    """Source frame indices [T] of a `frame_stride` clip from a video of `total` frames, starting at a uniform
    position `u` in [0, 1) of the valid starts (None, or random_start false: frame 0). When it does not fit: with
    `min_frames`, the indices that fit from frame 0 (fewer than T: `short_clip`), else VideoTooShort."""
    offsets = np.arange(spec.num_frames) * spec.frame_stride  # [T], from the clip's start
    span = int(offsets[-1]) + 1
    if span > total:
        return offsets[: short_clip(int((offsets < total).sum()), spec, f"{total} frames, fewer than the {span} a "
                                    f"clip of {spec.num_frames} frames with stride {spec.frame_stride} spans")]
    start = int(u * (total - span + 1)) if (u is not None and spec.random_start) else 0
    return start + offsets


def clip_times(duration: float, spec: VideoConfig, u: float | None) -> np.ndarray:
    """Times [T] in seconds of a clip resampled to `spec.fps` from a video lasting `duration` s (the frame shown at
    each time is taken: repeated when upsampling, skipped when downsampling), starting at a uniform position `u` of
    the valid starts. When it does not fit: with `min_frames`, the times inside the video from 0 (fewer than T:
    `short_clip`), else VideoTooShort."""
    length = (spec.num_frames - 1) / spec.fps
    times = np.arange(spec.num_frames) / spec.fps  # [T], from the clip's start
    if length >= duration:
        return times[: short_clip(int((times < duration).sum()), spec, f"{duration:.3g} s, not longer than the "
                                  f"{length:.3g} s a clip of {spec.num_frames} frames at {spec.fps:g} fps spans")]
    start = u * (duration - length) if (u is not None and spec.random_start) else 0.0
    return start + times


def _header_length(container: av.container.InputContainer, stream: av.video.stream.VideoStream,
                   fps: float) -> tuple[int | None, float | None]:
    """Frames and seconds of the stream from its header (the frame count, else the stream's or the file's
    duration), None where the header does not say."""
    seconds = None
    if stream.duration is not None and stream.time_base is not None:
        seconds = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        seconds = container.duration / av.time_base
    frames = int(stream.frames) if stream.frames else (int(round(seconds * fps)) if seconds is not None else None)
    return frames, (seconds if seconds is not None else (frames / fps if frames else None))


def read_clip(source: str | Path | BinaryIO, spec: VideoConfig, u: float | None = None) -> DecodedClip:
    """Decode the clip of `spec` starting at position `u` (clip_frame_indices / clip_times) from a video file or
    file-like object: seek to the keyframe at or before the clip, decode forward, keep for each of the clip's frame
    indices (or times, with `fps`) the last frame at or before it, stop when the clip is complete.

    GIFs are read from the start and counted in decode order (their frames may last different times); other files
    place a decoded frame by its timestamp. VideoTooShort when the video is shorter than the clip (with
    `min_frames`: than that many frames; a shorter clip's frames are fewer than T) or ends before its header says
    (truncated); PyAV errors pass through."""
    with av.open(source if not isinstance(source, Path) else str(source)) as container:
        if not container.streams.video:
            raise ValueError("no video stream")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        fps = float(rate) if rate else 25.0
        time_base = stream.time_base or Fraction(1, 1)
        origin = stream.start_time or 0  # pts of the first frame
        in_order = container.format.name == "gif"
        frames_total, seconds = _header_length(container, stream, fps)
        if frames_total is None or seconds is None:
            raise ValueError("the header gives neither a frame count nor a duration")
        if spec.fps:  # frame coordinate = its time in seconds
            targets = clip_times(seconds, spec, u)
            first_seconds = float(targets[0])
        else:  # frame coordinate = its index
            targets = clip_frame_indices(frames_total, spec, u).astype(np.float64)
            first_seconds = float(targets[0]) / fps
        if first_seconds > 0 and not in_order:  # to the keyframe at or before the clip
            container.seek(origin + int(first_seconds / time_base), stream=stream, backward=True)

        # each target takes the last frame at or before it: a frame is kept once the next one is past the target
        kept, decoded, previous, coordinate = [], 0, None, -math.inf
        for frame in container.decode(stream):
            decoded += 1
            seconds_in = float((frame.pts - origin) * time_base) if frame.pts is not None else (decoded - 1) / fps
            coordinate = seconds_in if spec.fps else (decoded - 1 if in_order else round(seconds_in * fps))
            pixels = frame.to_ndarray(format="rgb24")  # [H, W, 3] RGB
            if previous is None:
                previous = pixels  # targets before the first decoded frame take it
            while len(kept) < len(targets) and targets[len(kept)] < coordinate - 1e-6:
                kept.append(previous)
            previous = pixels
            if coordinate >= targets[-1] - 1e-6:
                break  # the clip's last frame is decoded: stop without reading on
        slack = 1.5 / fps if spec.fps else 0.0  # a frame shows until the next one; an index must be reached
        if previous is None or coordinate < targets[-1] - slack - 1e-6:
            raise VideoTooShort(f"the video ended after {decoded} decoded frames, before the clip's last frame (the "
                                f"header lists {frames_total}: truncated?)")
        kept += [previous] * (len(targets) - len(kept))  # the targets at or after the last decoded frame
    return DecodedClip(np.stack(kept), decoded)


def read_frames(source: str | Path, max_frames: int) -> np.ndarray:
    """The first `max_frames` frames uint8 [T, H, W, 3] (RGB) of a video file, in decode order (a clip a user gives,
    e.g. to prime a generator with). ValueError when it has no video stream or no frame; PyAV errors pass through."""
    with av.open(str(source)) as container:
        if not container.streams.video:
            raise ValueError("no video stream")
        frames = []
        for frame in container.decode(container.streams.video[0]):
            frames.append(frame.to_ndarray(format="rgb24"))
            if len(frames) == max_frames:
                break
    if not frames:
        raise ValueError("no frames")
    return np.stack(frames)


def clip_frames(x: torch.Tensor) -> torch.Tensor:
    """Clips [B, C, T, H, W] -> their frames [B·T, C, H, W] (clip-major); images [B, C, H, W] as they are."""
    return x.transpose(1, 2).flatten(0, 1) if x.ndim == 5 else x


def resize_crop_frames(frames: np.ndarray, size: int, flip: bool = False) -> torch.Tensor:
    """uint8 frames [T, H, W, 3] -> float [3, T, size, size] in [-1, 1]: the short side resized to `size` (bicubic
    with antialiasing, all frames at once), centre crop, and the same horizontal flip on every frame."""
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()  # [T, 3, H, W]
    h, w = video.shape[-2:]
    if min(h, w) != size:
        scale = size / min(h, w)
        video = F.interpolate(video, size=(max(size, round(h * scale)), max(size, round(w * scale))),
                              mode="bicubic", antialias=True, align_corners=False)
    top, left = (video.shape[-2] - size) // 2, (video.shape[-1] - size) // 2
    video = video[..., top : top + size, left : left + size]
    if flip:
        video = video.flip(-1)
    return (video.clamp(0, 255) / 127.5 - 1.0).permute(1, 0, 2, 3).contiguous()  # [3, T, size, size]


def start_position(aug_seed: int | None) -> float | None:
    """The clip's start in [0, 1) of the valid starts, drawn from the sampler's per-sample seed (None: no draw)."""
    return None if aug_seed is None else float(np.random.default_rng([aug_seed, 1]).random())


def padded_clip(video: torch.Tensor, spec: VideoConfig) -> dict[str, torch.Tensor]:
    """A clip [C, T', H, W] as sample fields: `video`, and with `spec.min_frames` set, `video` padded to
    `spec.num_frames` frames by repeating its last frame and `frame_mask` bool [num_frames] (True = a real frame)."""
    if spec.min_frames is None:
        return {"video": video}
    real = video.shape[1]
    padding = video[:, -1:].expand(-1, spec.num_frames - real, -1, -1)  # [C, T - T', H, W]
    return {"video": torch.cat([video, padding], dim=1), "frame_mask": torch.arange(spec.num_frames) < real}


def clip_sample(source: str | Path | BinaryIO, spec: VideoConfig, image_size: int, flip: bool,
                aug_seed: int | None) -> dict[str, torch.Tensor]:
    """The sample fields of a video file (`video` [3, T, S, S] in [-1, 1], `frame_mask` with min_frames): its clip
    of `spec`, its start and flip drawn from `aug_seed` (`flip`: flips allowed), resized, cropped and padded."""
    clip = read_clip(source, spec, start_position(aug_seed))
    return padded_clip(resize_crop_frames(clip.frames, image_size, flip and flip_drawn(aug_seed)), spec)


# ------------------------------------------------------------------------------------------------ writing
def write_video(frames: np.ndarray, path: str | Path | BinaryIO, fps: float = 8.0, fmt: str | None = None,
                keyframe_every: int = 16) -> None:
    """uint8 frames [T, H, W, 3] as a looping GIF (PIL) or an MP4 (H.264, yuv420p, a keyframe every
    `keyframe_every` frames so clips can be sought; odd sides padded by one pixel), chosen by `fmt` ("gif" | "mp4")
    or the path's suffix."""
    fmt = fmt or Path(str(path)).suffix.lower().lstrip(".")
    if fmt == "gif":
        images = [Image.fromarray(f) for f in frames]
        images[0].save(path, format="GIF", save_all=True, append_images=images[1:], loop=0,
                       duration=max(20, round(1000 / fps)), disposal=1)
        return
    if fmt != "mp4":
        raise ValueError(f"cannot write video format {fmt!r}; allowed: gif, mp4")
    t, h, w, _ = frames.shape
    frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")  # yuv420p needs even sides
    with av.open(path, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.options = {"crf": "12", "preset": "medium", "g": str(keyframe_every)}
        for pixels in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())  # flush


def video_bytes(frames: np.ndarray, fmt: str = "mp4", fps: float = 8.0) -> bytes:
    """`write_video` into memory (shard records)."""
    buffer = io.BytesIO()
    write_video(frames, buffer, fps, fmt)
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------------ video folders
class VideoFolderDataset(ImageFolderDataset):
    """Videos under `root` (mp4 / webm / mov / mkv / avi / gif, any depth) as clips `video` [3, T, H, W] (with
    `frame_mask` [T] under data.video.min_frames): splits, labels and captions as for images (ImageFolderDataset,
    as `datasets`' videofolder reads them); each epoch draws each video's temporal crop and flip
    from the sampler's per-sample seed."""

    extensions = VIDEO_EXTENSIONS
    field = "video"

    def __init__(self, root: str | Path, image_size: int, spec: VideoConfig, **kwargs: Any) -> None:
        super().__init__(root, image_size, **kwargs)
        self.spec = spec

    def load(self, path: Path, aug_seed: int | None) -> dict[str, torch.Tensor]:
        return clip_sample(path, self.spec, self.image_size, self.flip, aug_seed)


class VideoFolderSource(FolderSource):
    """`data.source: video_folder`: a folder of videos, clipped by `data.video`, split and labelled like an image
    folder (class names from the sub-folders)."""

    name = "video_folder"
    field = "video"
    sections = ("video", "images")
    path_help = "a folder of videos"
    resize = VIDEO_RESIZE
    extensions = VIDEO_EXTENSIONS

    def build(self, cfg: DataConfig, split: str, flip: bool, world_size: int | None) -> VideoFolderDataset:
        check_folder(cfg.path)
        return VideoFolderDataset(cfg.path, cfg.image_size, cfg.video, split=split, val_fraction=cfg.val_fraction,
                                  flip=flip, seed=cfg.split_seed, test_fraction=cfg.test_fraction,
                                  caption_column=cfg.caption_column, label_column=cfg.label_column,
                                  image_column=cfg.image_column, data_split=cfg.split)

    def info(self, dataset: VideoFolderDataset, cfg: DataConfig) -> DataInfo:
        return DataInfo(num_classes=dataset.num_classes, channels=3, image_size=cfg.image_size, kind="video")

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        return {"path": str(Path(cfg.path).resolve()), "files": folder_listing(cfg.path, VIDEO_EXTENSIONS)}


DATA_SOURCES.register("video_folder", VideoFolderSource())


# ------------------------------------------------------------------------------------------------ video shards
VIDEO_FIELDS = tuple(ext.lstrip(".") for ext in VIDEO_EXTENSIONS)  # the first one a record has is its video


def decode_video_record(record: Record, key: str, image_size: int, spec: VideoConfig, flip: bool,
                        aug_seed: int | None) -> dict[str, Any]:
    """A sample (`video` [3, T, S, S] in [-1, 1], `frame_mask` [T] with min_frames, `text`, `label`, `key`) of a
    shard record `<key>.mp4|.webm|...`, clipped, cropped and flipped like a video folder's file, or {"key", "bad":
    reason} when it cannot be used."""
    sample: dict[str, Any] = {"key": key}
    try:
        meta = record_meta(record)
        field = next((f for f in VIDEO_FIELDS if f in record), None)
        if field is None:
            fields = ", ".join(f".{f}" for f in sorted(record) if not f.startswith("__")) or "none"
            raise ValueError(f"no video (.{', .'.join(VIDEO_FIELDS)}); fields: {fields}")
        sample.update(clip_sample(io.BytesIO(record[field]), spec, image_size, flip, aug_seed))
        add_text_and_label(record, meta, sample)
    except Exception as err:  # any decoder error: skip and report, never kill the worker
        return {"key": key, "bad": f"{type(err).__name__}: {err}"}
    return sample


class VideoShardDataset(ShardDataset):
    """Webdataset shards of videos: each record one video (+ `.txt`, `.cls`, `.json`), decoded from memory by
    seeking to a clip of `spec` (the per-sample seed draws its start and flip), streamed as ShardDataset streams."""

    record_kind = "video"

    def __init__(self, spec: str, image_size: int, video: VideoConfig, **kwargs: Any) -> None:
        super().__init__(spec, image_size, **kwargs)
        self.video = video

    def decode(self, url: str, record: Record, aug_seed: int | None) -> dict[str, Any]:
        if "__bad__" in record:  # a shard that could not be read (read_shard_or_report)
            return {"key": record["__key__"], "bad": record["__bad__"]}
        return decode_video_record(record, f"{shard_name(url)}/{record['__key__']}", self.image_size, self.video,
                                   self.flip, aug_seed)


class VideoShardsSource(ShardsSource):
    """`data.source: video_shards`: webdataset shards of videos (`genforge data moving_shapes --shards` writes
    them), split by whole shards like image shards."""

    name = "video_shards"
    field = "video"
    reads = ("shuffle_buffer",)
    sections = ("video", "images")
    path_help = "webdataset shards of videos, e.g. data/clips-{000000..000127}.tar"
    resize = VIDEO_RESIZE

    def dataset(self, spec: str, cfg: DataConfig, flip: bool, world_size: int | None) -> VideoShardDataset:
        return VideoShardDataset(spec, cfg.image_size, cfg.video, flip=flip, shuffle_buffer=cfg.shuffle_buffer,
                                 world_size=world_size, num_workers=cfg.num_workers)

    def info(self, dataset: ShardDataset, cfg: DataConfig) -> DataInfo:
        return DataInfo(num_classes=0, channels=3, image_size=cfg.image_size, kind="video")


DATA_SOURCES.register("video_shards", VideoShardsSource())
