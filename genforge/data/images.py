"""Reading any image file as RGB, and the ADM/DiT resize + center crop. PIL + numpy only."""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps

BACKGROUND = (255, 255, 255)  # transparent pixels are composited over white
WIDE_GRAY_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")


def _to_8bit(img: Image.Image) -> Image.Image:
    """16-bit, 32-bit integer and float grayscale -> "L", scaled by the real range of the data type."""
    arr = np.nan_to_num(np.asarray(img, dtype=np.float64))
    if img.mode.startswith("I;16"):
        arr = arr / 257.0  # 0..65535 -> 0..255
    elif img.mode == "I":  # 32-bit ints: 8-bit data (an "L" image converted), 16-bit PNG data, or wider
        top = arr.max()
        arr = arr if top <= 255 else arr / 257.0 if top <= 65535 else arr * (255.0 / top)
    else:  # "F": [0, 1] maps to 0..255; data outside it stretches the range to cover it
        lo, hi = min(arr.min(), 0.0), max(arr.max(), 1.0)
        arr = (arr - lo) * (255.0 / (hi - lo))
    return Image.fromarray(np.clip(np.round(arr), 0, 255).astype(np.uint8))


class DecompressionBomb(ValueError):
    """An image whose header claims more pixels than allowed (decoding it would exhaust memory)."""


def load_rgb(path: str | Path | BinaryIO, max_pixels: int | None = None) -> Image.Image:
    """Decode `path` fully (decode errors surface here) and return an RGB image: EXIF orientation applied,
    alpha composited over white, palette/CMYK/YCbCr/HSV/1-bit/16-bit/float modes converted. Images of more
    than `max_pixels` pixels are refused from their header, before decoding."""
    with Image.open(path) as opened:
        if max_pixels is not None and opened.width * opened.height > max_pixels:
            raise DecompressionBomb(f"{opened.width}x{opened.height} pixels is more than data.max_image_pixels="
                                    f"{max_pixels}")
        opened.load()
        img = ImageOps.exif_transpose(opened)
    if img.mode in WIDE_GRAY_MODES:
        img = _to_8bit(img)
    if img.mode == "La":  # premultiplied alpha: undo it first
        img = img.convert("LA")
    if (img.mode == "P" and "transparency" in img.info) or img.mode in ("LA", "PA", "RGBa"):
        img = img.convert("RGBA")
    if img.mode == "RGBA":
        canvas = Image.new("RGB", img.size, BACKGROUND)
        canvas.paste(img, mask=img.getchannel("A"))  # colour * alpha + white * (1 - alpha)
        return canvas
    return img.convert("RGB")


def center_crop_resize(img: Image.Image, size: int) -> Image.Image:
    """ADM/DiT preprocessing: halve with a box filter while the short side is >= 2*size, resize the short
    side to `size` with bicubic, then crop the centre size x size."""
    while min(img.size) >= 2 * size:
        img = img.resize((img.width // 2, img.height // 2), Image.Resampling.BOX)
    scale = size / min(img.size)
    img = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.BICUBIC)
    left, top = (img.width - size) // 2, (img.height - size) // 2
    return img.crop((left, top, left + size, top + size))


def flip_drawn(aug_seed: int | None) -> bool:
    """The per-sample coin of the random horizontal flip: heads for half of the sampler's `aug_seed`s, never
    without one (every data set, and a cache's flipped variant, draws it the same way)."""
    return aug_seed is not None and np.random.default_rng(aug_seed).random() < 0.5


def read_image(source: str | Path | BinaryIO, size: int, flip: bool = False, aug_seed: int | None = None,
                max_pixels: int | None = None) -> torch.Tensor:
    """An image file (a path or its bytes) as every image source reads it: RGB (`load_rgb`), ADM resize and centre
    crop to `size` (`center_crop_resize`), flipped when `flip` and the per-sample coin of `aug_seed` says so:
    float32 [3, size, size] in [-1, 1]."""
    image = np.asarray(center_crop_resize(load_rgb(source, max_pixels), size))
    if flip and flip_drawn(aug_seed):
        image = image[:, ::-1]
    return to_tensor(image)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """float images in [-1, 1] (clamped) -> uint8 pixel values, as saved to PNG; the inverse of `to_tensor`."""
    return ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def to_tensor(image: Image.Image | np.ndarray) -> torch.Tensor:
    """uint8 [H, W, 3] (or a batch [N, H, W, 3]) -> float32 [3, H, W] ([N, 3, H, W]) in [-1, 1]."""
    arr = np.array(image, dtype=np.uint8)  # a writable, contiguous copy
    tensor = torch.from_numpy(arr).float().div_(127.5).sub_(1.0)
    return tensor.movedim(-1, -3)


def to_pil(image: torch.Tensor) -> Image.Image:
    """A float image [C, H, W] in [-1, 1] (C = 3, or 1: grayscale) as a PIL image, the pixels a PNG of it holds."""
    pixels = to_uint8(image).movedim(0, -1).cpu().numpy()
    return Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)


def png_bytes(image: torch.Tensor) -> bytes:
    """A float image [3, H, W] in [-1, 1] as PNG file bytes (lossless: `to_tensor` of the decoded file gives it
    back to within the uint8 rounding)."""
    buffer = io.BytesIO()
    to_pil(image).save(buffer, format="PNG")
    return buffer.getvalue()
