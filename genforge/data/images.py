"""Reading any image file as RGB, and the ADM/DiT resize + center crop. PIL + numpy only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

BACKGROUND = (255, 255, 255)  # transparent pixels are composited over white


def _to_8bit(img: Image.Image) -> Image.Image:
    """16-bit / 32-bit integer and float grayscale -> "L", scaled by the mode's real range."""
    arr = np.asarray(img)
    if img.mode.startswith("I;16"):
        arr = arr.astype(np.float64) / 257.0  # 0..65535 -> 0..255
    elif img.mode == "I":
        arr = arr.astype(np.float64)
        arr = arr / 257.0 if arr.max() > 255 else arr  # 16-bit data often arrives as "I"
    else:  # "F": float data, stretch its own range
        arr = arr.astype(np.float64)
        lo, hi = float(arr.min()), float(arr.max())
        arr = (arr - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(arr)
    return Image.fromarray(np.clip(np.round(arr), 0, 255).astype(np.uint8), mode="L")


def load_rgb(path: str | Path) -> Image.Image:
    """Decode `path` fully and return an RGB image: EXIF orientation applied, alpha composited over
    white, palette/CMYK/YCbCr/1-bit/16-bit/float modes converted."""
    with Image.open(path) as opened:
        opened.load()
        img = ImageOps.exif_transpose(opened)
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        img = _to_8bit(img)
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    if img.mode in ("LA", "PA", "La", "RGBa"):
        img = img.convert("RGBA")
    if img.mode == "RGBA":
        canvas = Image.new("RGB", img.size, BACKGROUND)
        canvas.paste(img, mask=img.getchannel("A"))
        return canvas
    return img.convert("RGB")


def center_crop_resize(img: Image.Image, size: int) -> Image.Image:
    """ADM/DiT preprocessing: halve with a box filter while the short side is ≥ 2·size, resize the short
    side to `size` with bicubic, then crop the centre size×size."""
    while min(img.size) >= 2 * size:
        img = img.resize((img.width // 2, img.height // 2), Image.Resampling.BOX)
    scale = size / min(img.size)
    img = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.BICUBIC)
    left, top = (img.width - size) // 2, (img.height - size) // 2
    return img.crop((left, top, left + size, top + size))


def to_tensor(image: Image.Image | np.ndarray) -> torch.Tensor:
    """uint8 [H, W, 3] (or a batch [N, H, W, 3]) -> float32 [3, H, W] ([N, 3, H, W]) in [-1, 1]."""
    arr = np.array(image, dtype=np.uint8)  # a writable, contiguous copy
    tensor = torch.from_numpy(arr).float().div_(127.5).sub_(1.0)
    return tensor.movedim(-1, -3)
