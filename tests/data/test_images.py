import numpy as np
import pytest
from PIL import Image

from genforge.data.images import center_crop_resize, load_rgb, to_tensor


def _save(img, path, **kw):
    img.save(path, **kw)
    return path


def test_rgba_composited_over_white(tmp_path):
    img = Image.new("RGBA", (4, 4), (255, 0, 0, 128))
    out = np.asarray(load_rgb(_save(img, tmp_path / "a.png")))
    assert out.shape == (4, 4, 3) and abs(int(out[0, 0, 1]) - 127) <= 1 and out[0, 0, 0] == 255


def test_la_and_palette_transparency(tmp_path):
    la = Image.new("LA", (2, 2), (0, 0))  # fully transparent black -> white
    assert np.asarray(load_rgb(_save(la, tmp_path / "la.png")))[0, 0].tolist() == [255, 255, 255]
    p = Image.new("P", (2, 2), 1)
    p.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    p.info["transparency"] = 0
    p.putpixel((0, 0), 0)
    out = np.asarray(load_rgb(_save(p, tmp_path / "p.png", transparency=0)))
    assert out[0, 0].tolist() == [255, 255, 255] and out[1, 1].tolist() == [10, 200, 30]


def test_cmyk_one_bit_gray_and_float(tmp_path):
    cmyk = Image.new("CMYK", (2, 2), (0, 255, 255, 0))  # red
    assert np.asarray(load_rgb(_save(cmyk, tmp_path / "c.jpg", quality=100)))[0, 0, 0] > 200
    one = Image.new("1", (2, 2), 1)
    assert np.asarray(load_rgb(_save(one, tmp_path / "o.png")))[0, 0].tolist() == [255, 255, 255]
    gray = Image.new("L", (2, 2), 77)
    assert np.asarray(load_rgb(_save(gray, tmp_path / "g.bmp")))[0, 0].tolist() == [77, 77, 77]
    f = Image.fromarray(np.array([[0.0, 0.5], [1.0, 2.0]], dtype=np.float32), mode="F")
    out = np.asarray(load_rgb(_save(f, tmp_path / "f.tiff")))
    assert out[0, 0, 0] == 0 and out[1, 1, 0] == 255


def test_sixteen_bit_uses_full_range(tmp_path):
    arr = np.linspace(0, 65535, 64, dtype=np.uint16).reshape(8, 8)
    img = Image.fromarray(arr)
    assert img.mode.startswith("I;16")
    out = np.asarray(load_rgb(_save(img, tmp_path / "s.png")))[..., 0]
    assert out.min() == 0 and out.max() == 255 and len(np.unique(out)) > 50


def test_exif_rotation(tmp_path):
    img = Image.new("RGB", (20, 10), (0, 0, 255))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise on display
    path = _save(img, tmp_path / "r.jpg", exif=exif.tobytes())
    assert load_rgb(path).size == (10, 20)


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp", "bmp"])
def test_formats(tmp_path, fmt):
    path = _save(Image.new("RGB", (6, 6), (10, 20, 30)), tmp_path / f"x.{fmt}")
    assert load_rgb(path).size == (6, 6)


def test_center_crop_resize_box_then_bicubic():
    wide = Image.fromarray(np.tile(np.arange(256, dtype=np.uint8)[None, :, None], (128, 1, 3)))
    out = center_crop_resize(wide, 32)
    assert out.size == (32, 32)
    # 256x128 -> box halvings to 128x64 (short side 64 >= 2*32), then 64x32 bicubic, centre columns
    ref = wide.resize((128, 64), Image.Resampling.BOX).resize((64, 32), Image.Resampling.BICUBIC).crop((16, 0, 48, 32))
    assert np.array_equal(np.asarray(out), np.asarray(ref))


def test_to_tensor_range_and_layout():
    arr = np.zeros((2, 3, 3), dtype=np.uint8)
    arr[0, 1] = [255, 0, 128]
    t = to_tensor(arr)
    assert t.shape == (3, 2, 3) and t[0, 0, 1] == 1.0 and t[1, 0, 1] == -1.0 and t.dtype.is_floating_point
    assert to_tensor(np.stack([arr, arr])).shape == (2, 3, 2, 3)
