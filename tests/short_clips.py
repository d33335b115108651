"""A folder of moving-shapes GIFs with one clip shorter than the others, for the tests of variable-length clips
(data.video.min_frames)."""

from pathlib import Path

import torch

from genforge.data.moving_shapes import render_moving_shapes, write_moving_shapes_folder
from genforge.data.video import write_video


def short_clip_folder(root: Path, n: int = 4, frames: int = 5, short: int = 3) -> Path:
    """`n` captioned clips of `frames` frames in class folders, and one of `short` frames (`short.gif`, captioned)."""
    write_moving_shapes_folder(root, n, 16, frames, fmt="gif")
    clip, _, _, caption = render_moving_shapes(0, 99, 16, short)
    folder = sorted(p for p in root.iterdir() if p.is_dir())[0]
    write_video(clip, folder / "short.gif")
    (folder / "short.txt").write_text(caption + "\n")
    return root


def with_garbage(video: torch.Tensor, frame_mask: torch.Tensor, seed: int) -> torch.Tensor:
    """Clips [B, C, T, H, W] whose padded frames (frame_mask [B, T] False) are replaced by random pixels of `seed`."""
    garbage = torch.rand(video.shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return torch.where(frame_mask[:, None, :, None, None], video, garbage)
