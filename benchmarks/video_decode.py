"""Video clip loading throughput: clips per second that one data-loader worker decodes from mp4 files, the way
`data.source: video_folder` reads them (seek to the keyframe before the clip, decode forward to its last frame,
resize + centre crop, flip), beside decoding each whole file to cut one clip (what phenaki-pytorch's reader does).

Writes `--videos` mp4 files of `--seconds` s at `--fps` (a textured scene panning across a `--source-size` px frame,
H.264 with a keyframe every 16 frames, as `genforge data moving_shapes --format mp4` writes them) into a temporary
folder, then times `--clips` clips of `--frames` frames at `--size` px from random starts, in this process (one
worker, `--threads` torch threads). `--step-seconds` is the training step to compare with: the batch time of one
worker divided by the workers needed.

    python benchmarks/video_decode.py --size 64 --frames 16 --clips 64 --batch 16 --step-seconds 3.7
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from genforge.core.config import VideoConfig
from genforge.data.video import VideoFolderDataset, read_clip, resize_crop_frames, write_video


def panning_scene(frames: int, size: int, seed: int) -> np.ndarray:
    """uint8 frames [T, size, size, 3]: a window moving across a smooth random colour field with a little grain,
    so the encoder has real motion and texture to code (not a static or empty frame)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (size // 8 + frames // 8 + 2, size // 8 + 2, 3)).astype(np.float32)
    field = np.kron(coarse, np.ones((8, 8, 1), np.float32))  # [(size + frames) ~, size + 16, 3] blocky field
    field = (field + np.roll(field, 4, 0) + np.roll(field, 4, 1) + np.roll(field, (4, 4), (0, 1))) / 4  # soften
    rows = np.arange(frames)[:, None] + np.arange(size)[None, :]  # [T, size]: the window pans one row per frame
    scene = field[rows][:, :, :size]  # [T, size, size, 3]
    grain = rng.normal(0, 6, scene.shape).astype(np.float32)
    return np.clip(scene + grain, 0, 255).astype(np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=8, help="mp4 files written")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each file")
    parser.add_argument("--fps", type=float, default=24.0)
    parser.add_argument("--source-size", type=int, default=128, help="frame side of the files")
    parser.add_argument("--size", type=int, default=64, help="clip side after resize + crop (data.image_size)")
    parser.add_argument("--frames", type=int, default=16, help="frames per clip (data.video.num_frames)")
    parser.add_argument("--clips", type=int, default=64, help="clips timed")
    parser.add_argument("--batch", type=int, default=16, help="clips per training batch")
    parser.add_argument("--step-seconds", type=float, default=None, help="a training step's time to compare with")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a loader worker uses 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = VideoConfig(num_frames=args.frames)
    length = int(args.seconds * args.fps)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        for index in range(args.videos):
            write_video(panning_scene(length, args.source_size, index), Path(folder) / f"{index:03d}.mp4", args.fps)
        print(f"wrote {args.videos} mp4 files of {length} frames ({args.seconds:g} s at {args.fps:g} fps), "
              f"{args.source_size} px, in {time.perf_counter() - start:.1f} s")
        dataset = VideoFolderDataset(folder, args.size, spec, flip=True)
        seeds = np.random.default_rng(0).integers(0, 2**31, args.clips)

        start = time.perf_counter()
        for n, seed in enumerate(seeds):
            sample = dataset[(n % len(dataset), int(seed))]
            assert "bad" not in sample, sample
        seeking = time.perf_counter() - start
        assert sample["video"].shape == (3, args.frames, args.size, args.size)
        decoded = [read_clip(Path(folder) / dataset.files[n % len(dataset)], spec, float(s) / 2**31).decoded
                   for n, s in enumerate(seeds[:16])]

        whole_clips = min(args.clips, 8)
        start = time.perf_counter()
        for n in range(whole_clips):  # decode the whole file, then cut the clip: the reader genforge replaces
            whole = read_clip(Path(folder) / dataset.files[n % len(dataset)], VideoConfig(num_frames=length,
                                                                                          random_start=False))
            first = int(seeds[n] % (length - args.frames + 1))
            resize_crop_frames(whole.frames[first : first + args.frames], args.size, flip=True)
        whole_file = time.perf_counter() - start

    rate = args.clips / seeking
    print(f"seeking reader: {rate:.1f} clips/s per worker ({args.frames} frames at {args.size} px; "
          f"{np.mean(decoded):.1f} frames decoded per clip of {args.frames}, files of {length})")
    print(f"whole-file decode: {whole_clips / whole_file:.2f} clips/s per worker "
          f"({rate / (whole_clips / whole_file):.0f}x slower than seeking)")
    batch_s = args.batch / rate
    print(f"a batch of {args.batch} clips: {batch_s:.2f} s for one worker")
    if args.step_seconds:
        workers = max(1, math.ceil(batch_s / args.step_seconds))
        print(f"training step {args.step_seconds:g} s: {workers} worker(s) keep up "
              f"(one worker fills {min(1.0, args.step_seconds / batch_s):.0%} of the step's demand)")


if __name__ == "__main__":
    main()
