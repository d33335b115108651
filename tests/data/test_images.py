import numpy as np
import pytest
import torch
from PIL import Image

from genforge.data.images import center_crop_resize, load_rgb, to_tensor


def _palette_with_transparency() -> Image.Image:
    img = Image.new("P", (4, 4), 1)
    img.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    img.putpixel((0, 0), 0)  # index 0 is transparent -> white
    return img


# name: (image, file name, save options, expected RGB of pixel (0, 0), expected RGB of pixel (3, 3))
CASES = {
    "RGB": (Image.new("RGB", (4, 4), (10, 20, 30)), "rgb.png", {}, (10, 20, 30), (10, 20, 30)),
    "RGBA": (Image.new("RGBA", (4, 4), (255, 0, 0, 128)), "rgba.png", {}, (255, 127, 127), (255, 127, 127)),
    "LA": (Image.new("LA", (4, 4), (0, 0)), "la.png", {}, (255, 255, 255), (255, 255, 255)),
    "P": (_palette_with_transparency(), "p.png", {"transparency": 0}, (255, 255, 255), (10, 200, 30)),
    "CMYK": (Image.new("CMYK", (4, 4), (0, 255, 255, 0)), "c.jpg", {"quality": 100}, (255, 0, 0), (255, 0, 0)),
    "1": (Image.new("1", (4, 4), 1), "one.png", {}, (255, 255, 255), (255, 255, 255)),
    "L": (Image.new("L", (4, 4), 77), "l.bmp", {}, (77, 77, 77), (77, 77, 77)),
    "F": (Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32)), "f.tiff", {}, (128, 128, 128), (128, 128, 128)),
    "I": (Image.fromarray(np.full((4, 4), 65535, dtype=np.int32)), "i.tiff", {}, (255, 255, 255), (255, 255, 255)),
}


@pytest.fixture(params=sorted(CASES))
def written(request, tmp_path):
    """One file per PIL mode, with the RGB values it must load as."""
    img, name, options, first, last = CASES[request.param]
    assert img.mode == request.param
    img.save(tmp_path / name, **options)
    return tmp_path / name, first, last


def test_every_mode_loads_as_rgb(written):
    path, first, last = written
    out = load_rgb(path)
    assert out.mode == "RGB" and out.size == (4, 4)
    arr = np.asarray(out).astype(int)
    tolerance = 3 if path.suffix == ".jpg" else 1
    assert np.abs(arr[0, 0] - first).max() <= tolerance and np.abs(arr[3, 3] - last).max() <= tolerance


def test_sixteen_bit_uses_full_range(tmp_path):
    arr = np.linspace(0, 65535, 64).astype(np.uint16).reshape(8, 8)
    img = Image.fromarray(arr)
    img.save(tmp_path / "s.png")
    with Image.open(tmp_path / "s.png") as opened:
        assert opened.mode.startswith("I")
    out = np.asarray(load_rgb(tmp_path / "s.png"))[..., 0]
    assert out.min() == 0 and out.max() == 255 and len(np.unique(out)) > 50
    assert np.abs(out.astype(int) - np.round(arr / 257)).max() <= 1


def test_float_range(tmp_path):
    f = Image.fromarray(np.array([[0.0, 0.5], [1.0, 2.0]], dtype=np.float32))
    f.save(tmp_path / "f.tiff")
    assert np.asarray(load_rgb(tmp_path / "f.tiff"))[..., 0].tolist() == [[0, 64], [128, 255]]


def test_exif_rotation(tmp_path):
    img = Image.new("RGB", (40, 20), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 20, 20))  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # displayed rotated 90° clockwise: the left half goes on top
    img.save(tmp_path / "r.jpg", exif=exif.tobytes(), quality=95)
    out = load_rgb(tmp_path / "r.jpg")
    assert out.size == (20, 40)
    arr = np.asarray(out).astype(int)
    assert arr[5, 10, 0] > 200 and arr[5, 10, 2] < 60 and arr[35, 10, 2] > 200 and arr[35, 10, 0] < 60


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp", "bmp"])
def test_formats(tmp_path, fmt):
    Image.new("RGB", (6, 6), (10, 20, 30)).save(tmp_path / f"x.{fmt}")
    out = load_rgb(tmp_path / f"x.{fmt}")
    assert out.size == (6, 6) and np.abs(np.asarray(out)[2, 2].astype(int) - (10, 20, 30)).max() <= 4


def test_decode_errors_surface_in_load_rgb(tmp_path):
    Image.new("RGB", (64, 64), (1, 2, 3)).save(tmp_path / "x.png")
    data = (tmp_path / "x.png").read_bytes()
    (tmp_path / "t.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(Exception):
        load_rgb(tmp_path / "t.png")


def test_center_crop_resize_box_then_bicubic():
    wide = Image.fromarray(np.tile(np.arange(256, dtype=np.uint8)[None, :, None], (128, 1, 3)))
    out = center_crop_resize(wide, 32)
    assert out.size == (32, 32)
    # 256x128 -> box halvings to 128x64 (short side 64 >= 2*32), then 64x32 bicubic, centre columns
    ref = wide.resize((128, 64), Image.Resampling.BOX).resize((64, 32), Image.Resampling.BICUBIC).crop((16, 0, 48, 32))
    assert np.array_equal(np.asarray(out), np.asarray(ref))


def test_center_crop_resize_small_and_tall():
    tall = Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 20, 3), dtype=np.uint8))
    out = center_crop_resize(tall, 32)  # upscaled: 20 -> 32 wide, 80 tall, rows 24..56 kept
    ref = tall.resize((32, 80), Image.Resampling.BICUBIC).crop((0, 24, 32, 56))
    assert out.size == (32, 32) and np.array_equal(np.asarray(out), np.asarray(ref))


def test_to_tensor_range_and_layout():
    arr = np.zeros((2, 3, 3), dtype=np.uint8)
    arr[0, 1] = [255, 0, 128]
    t = to_tensor(arr)
    assert t.shape == (3, 2, 3) and t.dtype == torch.float32
    assert t[0, 0, 1] == 1.0 and t[1, 0, 1] == -1.0 and abs(t[2, 0, 1].item()) < 0.01
    assert to_tensor(Image.fromarray(arr)).equal(t)
    assert to_tensor(np.stack([arr, arr])).shape == (2, 3, 2, 3)

