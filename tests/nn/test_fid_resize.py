"""`fid_resize` is the resize the FID Inception was made for: TF1's `tf.image.resize_bilinear` with
align_corners=False (no half-pixel centres), checked against a plain numpy transcription of that formula."""

import numpy as np
import pytest
import torch

from genforge.nn.features import fid_resize, resize


def tf1_resize_bilinear(image: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """TF1 resize_bilinear(align_corners=False) of image [C, H, W], in float64: output row y reads input row
    y * H / out_h (column likewise), between rows floor(.) and min(floor(.) + 1, last), weighted by the fraction."""
    _, in_h, in_w = image.shape
    src_y, src_x = np.arange(out_h) * in_h / out_h, np.arange(out_w) * in_w / out_w
    y0, x0 = np.floor(src_y).astype(int), np.floor(src_x).astype(int)
    y1, x1 = np.minimum(y0 + 1, in_h - 1), np.minimum(x0 + 1, in_w - 1)
    fy, fx = (src_y - y0)[:, None], (src_x - x0)[None, :]
    top = image[:, y0][:, :, x0] * (1 - fx) + image[:, y0][:, :, x1] * fx
    bottom = image[:, y1][:, :, x0] * (1 - fx) + image[:, y1][:, :, x1] * fx
    return top * (1 - fy) + bottom * fy


@pytest.mark.parametrize("height,width,size", [(32, 32, 299), (17, 40, 299), (300, 512, 299), (8, 8, 21),
                                               (299, 299, 299)])
def test_fid_resize_is_tf1_resize_bilinear(height, width, size):
    gen = torch.Generator().manual_seed(height * 1000 + width)
    pixels = torch.randint(0, 256, (2, 3, height, width), generator=gen).float()
    ours = fid_resize(pixels, size)
    assert ours.shape == (2, 3, size, size) and ours.dtype == torch.float32
    for image, got in zip(pixels.double().numpy(), ours.double().numpy()):
        error = np.abs(got - tf1_resize_bilinear(image, size, size))
        # values 0..255; the float32 sampling grid is off by up to ~1e-7 x the input width: < 1/100 grey level
        assert error.max() < 1e-2 and error.mean() < 1e-3, (error.max(), error.mean())


def test_it_is_not_the_half_pixel_resize_of_pytorch_fid():
    pixels = torch.randint(0, 256, (1, 3, 32, 32), generator=torch.Generator().manual_seed(0)).float()
    assert (fid_resize(pixels) - resize(pixels, 299)).abs().mean() > 5  # a shift of almost half an input pixel
