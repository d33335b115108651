"""Video data: seeking decode, clip indices, colour order, crops, skipped files, moving shapes, video shards, video
previews."""

from __future__ import annotations

import io
import itertools
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from genforge.app.config import load_config
from genforge.core.config import DataConfig, TrainConfig, VideoConfig
from genforge.data.base import collate
from genforge.data.loader import (ReplaceUnreadable, build_dataset, build_train_batches, data_info, image_batches_before,
                                  is_image_batch)
from genforge.data.moving_shapes import (DIRECTIONS, MovingShapesDataset, render_moving_shapes,
                                         write_moving_shapes_folder, write_moving_shapes_shards)
from genforge.data.previews import write_preview
from genforge.data.video import (VideoFolderDataset, VideoTooShort, clip_frame_indices, clip_times,
                                 decode_video_record, read_clip, resize_crop_frames, video_bytes, write_video)


def counting_video(n: int, size: int = 16) -> np.ndarray:
    """Frame i is uniformly grey at level 4·i: its index can be read back from any frame (through H.264 too)."""
    levels = (4 * np.arange(n)).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (n, size, size, 3)).copy()


def frame_numbers(frames: np.ndarray) -> list[int]:
    return [int(round(f.mean() / 4)) for f in frames]


@pytest.mark.parametrize("fmt", ["mp4", "gif"])
def test_a_pure_red_clip_decodes_red_not_bgr(tmp_path, fmt):
    red = np.zeros((5, 16, 16, 3), np.uint8)
    red[..., 0] = (220 + 5 * np.arange(5))[:, None, None]  # frames differ (PIL merges identical GIF frames)
    write_video(red, tmp_path / f"red.{fmt}")
    frames = read_clip(tmp_path / f"red.{fmt}", VideoConfig(num_frames=5)).frames
    assert frames.shape == (5, 16, 16, 3)
    r, g, b = (frames[..., c].astype(float).mean() for c in range(3))
    assert r > 200 and r > b + 150 and r > g + 150
    clip = resize_crop_frames(frames, 8)  # [3, T, 8, 8] in [-1, 1]
    assert clip.shape == (3, 5, 8, 8) and clip[0].mean() > 0.6 and clip[2].mean() < -0.8


@pytest.mark.parametrize("fmt", ["mp4", "gif"])
def test_clip_count_stride_and_fps(tmp_path, fmt):
    write_video(counting_video(40), tmp_path / f"count.{fmt}", fps=24)
    path = tmp_path / f"count.{fmt}"
    assert frame_numbers(read_clip(path, VideoConfig(num_frames=6, frame_stride=3), 0.0).frames) == \
        [0, 3, 6, 9, 12, 15]
    # 24 fps resampled to 8 fps: every third frame; to 48 fps: every frame twice
    assert frame_numbers(read_clip(path, VideoConfig(num_frames=4, fps=8), 0.0).frames) == [0, 3, 6, 9]
    assert frame_numbers(read_clip(path, VideoConfig(num_frames=4, fps=48), 0.0).frames) == [0, 0, 1, 1]
    # a random start: a contiguous strided run inside the video
    numbers = frame_numbers(read_clip(path, VideoConfig(num_frames=5, frame_stride=2), 0.7).frames)
    assert np.all(np.diff(numbers) == 2) and 0 < numbers[0] and numbers[-1] <= 39


def test_first_and_last_frames_are_kept(tmp_path):
    write_video(counting_video(20), tmp_path / "all.mp4", fps=24)
    clip = read_clip(tmp_path / "all.mp4", VideoConfig(num_frames=20), 0.5)  # the whole video: one valid start
    assert frame_numbers(clip.frames) == list(range(20))


def test_seeking_decodes_only_part_of_a_long_video(tmp_path):
    write_video(counting_video(60, 8).repeat(5, axis=0), tmp_path / "long.mp4", fps=24, keyframe_every=16)  # 300
    clip = read_clip(tmp_path / "long.mp4", VideoConfig(num_frames=8), 0.9)
    start = int(0.9 * (300 - 8 + 1))
    assert len(clip.frames) == 8
    assert clip.decoded <= 8 + 16  # from the keyframe before the clip, never the 300 frames
    assert frame_numbers(clip.frames) == [(start + k) // 5 for k in range(8)]


def test_clip_indices_checks():
    spec = VideoConfig(num_frames=5, frame_stride=4)
    assert clip_frame_indices(17, spec, 0.99).tolist() == [0, 4, 8, 12, 16]  # exactly fits: one start
    with pytest.raises(VideoTooShort, match="fewer than the 17"):
        clip_frame_indices(16, spec, 0.0)
    assert clip_frame_indices(100, VideoConfig(num_frames=3, random_start=False), 0.9).tolist() == [0, 1, 2]
    assert clip_times(2.0, VideoConfig(num_frames=3, fps=4), 0.0).tolist() == [0.0, 0.25, 0.5]
    with pytest.raises(VideoTooShort, match="at 4 fps"):
        clip_times(0.5, VideoConfig(num_frames=3, fps=4), 0.0)


def test_resize_then_centre_crop_and_flip_are_the_same_on_every_frame():
    frames = np.zeros((3, 20, 40, 3), np.uint8)
    frames[:, :, :10] = 255  # a white band on the left, outside the centre crop
    frames[:, :, 10:20, 0] = 255  # red: inside the crop's left half
    clip = resize_crop_frames(frames, 10)
    assert clip.shape == (3, 3, 10, 10)
    assert torch.equal(clip[:, 0], clip[:, 1]) and torch.equal(clip[:, 1], clip[:, 2])
    assert clip[0, :, :, :4].mean() > 0.9 and clip[0, :, :, 6:].mean() < -0.9  # red on the left, black right
    flipped = resize_crop_frames(frames, 10, flip=True)
    assert torch.equal(flipped, clip.flip(-1))


def write_folder(root: Path) -> None:
    for cls in ("00_red", "01_blue"):
        (root / cls).mkdir(parents=True)
    for i in range(3):
        write_video(counting_video(12), root / "00_red" / f"good{i}.mp4")
        write_video(counting_video(12), root / "01_blue" / f"good{i}.gif")
        (root / "01_blue" / f"good{i}.txt").write_text("a blue clip\n")
    data = (root / "00_red" / "good0.mp4").read_bytes()
    (root / "00_red" / "truncated.mp4").write_bytes(data[: len(data) // 2])
    write_video(counting_video(3), root / "01_blue" / "short.mp4")


def test_truncated_and_too_short_videos_are_skipped_and_reported(tmp_path):
    write_folder(tmp_path)
    ds = VideoFolderDataset(tmp_path, 8, VideoConfig(num_frames=6, frame_stride=2), split="all")
    assert ds.num_classes == 2 and len(ds) == 8
    served = ReplaceUnreadable(ds)
    samples = [served[(i, 1234 + i)] for i in range(len(ds))]
    skipped = {key: reason for s in samples for key, reason in s["skipped"]}
    assert set(skipped) == {"00_red/truncated.mp4", "01_blue/short.mp4"}
    assert "fewer than the 11" in skipped["01_blue/short.mp4"]
    batch = collate(samples)
    assert batch["video"].shape == (8, 3, 6, 8, 8) and batch["video"].abs().max() <= 1
    assert sum(s.get("text") == "a blue clip" for s in samples) >= 3


def test_min_frames_pads_short_clips_and_masks_their_padding(tmp_path):
    spec = VideoConfig(num_frames=6, frame_stride=2, min_frames=2)
    assert clip_frame_indices(3, spec, 0.7).tolist() == [0, 2]  # what fits, from the start: no random crop
    assert clip_times(0.5, VideoConfig(num_frames=3, fps=4, min_frames=2), 0.3).tolist() == [0.0, 0.25]
    with pytest.raises(VideoTooShort, match="fewer than data.video.min_frames=3"):
        clip_frame_indices(3, VideoConfig(num_frames=6, frame_stride=2, min_frames=3), 0.0)
    with pytest.raises(ValueError, match="min_frames=7 must be at most data.video.num_frames=6"):
        VideoConfig(num_frames=6, min_frames=7)
    write_folder(tmp_path)  # the 3-frame short.mp4 spans frames 0 and 2 of a 6-frame clip with stride 2
    served = ReplaceUnreadable(VideoFolderDataset(tmp_path, 8, spec, split="all"))
    samples = [served[(i, 1234 + i)] for i in range(8)]
    assert {key for s in samples for key, _ in s["skipped"]} == {"00_red/truncated.mp4"}  # truncated: still skipped
    short = next(s for s in samples if s["key"] == "01_blue/short.mp4")
    assert short["frame_mask"].tolist() == [True, True, False, False, False, False]
    assert short["video"].shape == (3, 6, 8, 8)
    levels = short["video"].mean(dim=(0, 2, 3))  # counting video: frame i is grey level 4·i
    assert levels[1] > levels[0] + 0.04  # real frames 0 and 2, then frame 2 repeated
    assert torch.equal(short["video"][:, 2:], short["video"][:, 1:2].expand(-1, 4, -1, -1))
    assert all(s["frame_mask"].all() for s in samples if s is not short)  # full clips: all True, so batches stack
    batch = collate(samples)
    assert batch["video"].shape == (8, 3, 6, 8, 8) and batch["frame_mask"].shape == (8, 6)
    clip = decode_video_record({"__key__": "short", "gif": video_bytes(counting_video(3, 8), "gif"), "txt": b"a clip"},
                               "shard/short", 8, VideoConfig(num_frames=5, fps=8, min_frames=2), False, None)
    assert clip["frame_mask"].tolist() == [True, True, True, False, False] and clip["text"] == "a clip"
    strict = VideoFolderDataset(tmp_path, 8, VideoConfig(num_frames=6, frame_stride=2, min_frames=3), split="all")
    assert "fewer than data.video.min_frames=3" in strict[strict.files.index("01_blue/short.mp4")]["bad"]
    assert MovingShapesDataset(4, 16, 5, frame_mask=True)[0]["frame_mask"].tolist() == [True] * 5
    assert "frame_mask" not in VideoFolderDataset(tmp_path, 8, VideoConfig(num_frames=4), split="all")[0]


def test_video_folder_source_from_config(tmp_path):
    write_folder(tmp_path)
    cfg = load_config("dit-debug", ["data.source=video_folder", f"data.path={tmp_path}", "data.image_size=8",
                                    "data.video.num_frames=4", "data.video.fps=6"]).data
    ds = build_dataset(cfg)
    info = data_info(ds, cfg)
    assert info.kind == "video" and info.num_classes == 2
    assert ds[(1, 7)]["video"].shape == (3, 4, 8, 8)


def shape_centre(frame: np.ndarray) -> np.ndarray:
    """(x, y) of the pixels unlike the top-left corner's (a plain background) in a frame [H, W, 3]."""
    ys, xs = np.nonzero(np.abs(frame.astype(int) - frame[0, 0].astype(int)).sum(-1) > 60)
    return np.array([xs.mean(), ys.mean()])


@pytest.mark.parametrize("paths, travel", [("inside", 0.3 * 32 - 1), ("from_centre", 0.2 * 32 - 1)])
def test_moving_shapes_move_in_their_direction_and_flip_mirrors_them(paths, travel):
    starts = {d: [] for d in range(len(DIRECTIONS))}
    for index in range(24):
        frames, label, direction, caption = render_moving_shapes(0, index, 32, 9, textured_fraction=0.0, paths=paths)
        assert caption.endswith(f"moving {DIRECTIONS[direction]}") and 0 <= label < 16
        first, last = shape_centre(frames[0]), shape_centre(frames[-1])
        dx, dy = last - first
        expected = {"left": -dx, "right": dx, "up": -dy, "down": dy}[DIRECTIONS[direction]]
        assert expected > travel and min(abs(dx), abs(dy)) < 1, (index, DIRECTIONS[direction], dx, dy)
        starts[direction].append(first)
    if paths == "from_centre":  # every start within the square any direction keeps inside: [0.37, 0.63] of the side
        assert all(np.all((s > 0.37 * 32 - 1) & (s < 0.63 * 32)) for d in starts.values() for s in d), starts
    with pytest.raises(ValueError, match="paths"):
        render_moving_shapes(0, 0, 32, 9, paths="anywhere")
    again = render_moving_shapes(0, 5, 32, 9, paths=paths)
    assert np.array_equal(again[0], render_moving_shapes(0, 5, 32, 9, paths=paths)[0])  # a function of (seed, index)
    ds = MovingShapesDataset(64, 16, 5, flip=True, paths=paths)
    flipped = [ds[(i, s)] for i in range(64) for s in range(4)]
    plain = MovingShapesDataset(64, 16, 5, paths=paths)
    mirrored = [s for s in flipped if not torch.equal(s["video"], plain[int(s["key"][-8:])]["video"])]
    assert mirrored
    for sample in mirrored:
        original = plain[int(sample["key"][-8:])]
        assert torch.equal(sample["video"], original["video"].flip(-1))
        assert DIRECTIONS[sample["direction"]] == {"left": "right", "right": "left"}.get(
            DIRECTIONS[original["direction"]], DIRECTIONS[original["direction"]])
        assert sample["text"].endswith(DIRECTIONS[sample["direction"]])


def test_moving_shapes_folder_reads_back_as_a_video_folder(tmp_path):
    write_moving_shapes_folder(tmp_path, 6, 16, 9, fmt="gif")
    ds = VideoFolderDataset(tmp_path, 16, VideoConfig(num_frames=9), split="all")
    assert len(ds) == 6 and ds.num_classes == 16
    sample = ds[0]
    assert sample["video"].shape == (3, 9, 16, 16) and "moving" in sample["text"]


def test_video_shards_stream_clips_and_report_a_truncated_record(tmp_path):
    pattern, count = write_moving_shapes_shards(tmp_path / "good", 5, 16, 9, fmt="mp4", shard_size=5)
    assert count == 1
    with tarfile.open(pattern) as tar:  # the same records, one of them cut in half
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    mp4 = sorted(name for name in members if name.endswith(".mp4"))
    members[mp4[2]] = members[mp4[2]][: len(members[mp4[2]]) // 2]
    bad_shard = tmp_path / "clips-000000.tar"
    with tarfile.open(bad_shard, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    cfg = load_config("cvivit-debug", ["data.source=video_shards", f"data.path={bad_shard}", "data.image_size=16",
                                       "data.video.num_frames=5"]).data
    ds = build_dataset(cfg)
    assert data_info(ds, cfg).kind == "video"
    samples = list(ds)  # one pass in order
    assert [s["key"] for s in samples if "bad" in s] == [f"clips-000000/{Path(mp4[2]).stem}"]
    good = [s for s in samples if "bad" not in s]
    assert len(good) == 4 and all(s["video"].shape == (3, 5, 16, 16) for s in good)
    assert all("moving" in s["text"] and 0 <= s["label"] < 16 for s in good)
    batch = ds.batch([(str(bad_shard), {"__key__": Path(m).stem, "mp4": members[m], "txt": b"a clip"}, 7)
                      for m in mp4])
    assert batch["video"].shape == (4, 3, 5, 16, 16) and len(batch["skipped"]) == 1


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_video_previews_are_animated_grids(tmp_path, suffix):
    videos = torch.rand(4, 3, 5, 8, 8) * 2 - 1
    path = write_preview(videos, tmp_path / f"preview{suffix}", nrow=2)
    frames = read_clip(path, VideoConfig(num_frames=5)).frames
    assert frames.shape[0] == 5 and frames.shape[1] >= 2 * 8 and frames.shape[2] >= 2 * 8


def _joint_data(**images):
    return DataConfig(source="moving_shapes", image_size=16, num_workers=0, shapes={"n": 64},
                      video={"num_frames": 5}, images={"source": "shapes", **images})


def test_joint_image_and_video_batches_follow_the_ratio_and_resume_exactly():
    data, train = _joint_data(ratio=0.25), TrainConfig(batch_size=4, grad_accum=2, seed=5)
    batches = build_train_batches(build_dataset(data), data, train)
    straight = list(itertools.islice(batches, 2 * 12))  # 12 optimizer steps of 2 micro-batches
    kinds = [b["video"].shape[2] for b in straight]
    assert kinds[::2] == kinds[1::2]  # the micro-batches of one step are of one kind
    assert kinds[::2] == [5, 5, 5, 1] * 3  # every 4th step is images, evenly spread
    for batch in straight:
        assert batch["video"].shape[:2] == (2, 3) and batch["video"].shape[3:] == (16, 16)
        assert batch["video"].min() >= -1 and batch["video"].max() <= 1
        assert len(batch["text"]) == 2 and "label" in batch
    images = [b for b in straight if b["video"].shape[2] == 1]
    assert all("moving" not in text for b in images for text in b["text"])  # shapes captions: no motion
    resumed = list(itertools.islice(build_train_batches(build_dataset(data), data, train, start_position=7), 2 * 5))
    for a, b in zip(straight[2 * 7:], resumed):
        assert torch.equal(a["video"], b["video"]) and a["key"] == b["key"]


def test_joint_image_batches_are_images_of_the_image_source_seeded_apart_from_the_clips():
    assert [is_image_batch(p, 0.4) for p in range(10)].count(True) == 4
    assert sum(is_image_batch(p, 0.3) for p in range(1000)) == image_batches_before(1000, 0.3) == 300
    data, train = _joint_data(ratio=0.5), TrainConfig(batch_size=8, seed=0)
    batches = list(itertools.islice(build_train_batches(build_dataset(data), data, train), 4))
    clip_keys = [k for b in batches if b["video"].shape[2] > 1 for k in b["key"]]
    image_keys = [k for b in batches if b["video"].shape[2] == 1 for k in b["key"]]
    assert len(clip_keys) == len(image_keys) == 16
    assert all(k.startswith("moving-shapes-") for k in clip_keys) and all(k.startswith("shapes-") for k in image_keys)
    index = lambda keys: [int(k.rsplit("-", 1)[1]) for k in keys]
    assert index(clip_keys) != index(image_keys)  # not the same permutation of the two index ranges


def test_joint_images_config_checks_name_the_field():
    with pytest.raises(ValueError, match="data.source to give clips"):
        DataConfig(source="shapes", images={"source": "shapes"})
    with pytest.raises(ValueError, match="data.images.source to give images"):
        DataConfig(source="moving_shapes", images={"source": "moving_shapes"})
    with pytest.raises(ValueError, match="ratio"):
        DataConfig(source="moving_shapes", images={"source": "shapes", "ratio": 1.5})  # 1: images only
    with pytest.raises(ValueError, match="data.path"):
        DataConfig(source="moving_shapes", images={"source": "folder"})
