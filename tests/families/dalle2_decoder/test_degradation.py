"""The BSR degradation of an upsampler's low-res input (Zhang et al. 2021; DALL·E 2 App. C): JPEG against PIL's
encoder, the anisotropic blur's covariance, the three kinds of noise's statistics, the draws' ranges and
frequencies, and their determinism from the batch's random stream."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from PIL import Image

from genforge.core.random import BatchRandom
from genforge.families.dalle2_decoder.degradation import (JPEG_QUALITIES, NOISE_LEVELS, anisotropic_blur,
                                                         bsr_degrade, bsr_noise, draw_bsr, jpeg)
from genforge.families.dalle2_decoder.model import gaussian_blur, resize


def _test_image(size: int = 64) -> np.ndarray:
    """An 8-bit RGB image with smooth parts, edges and texture."""
    yy, xx = np.mgrid[0:size, 0:size]
    image = np.stack([(np.sin(xx / 5) + 1) * 100 + 20, (yy * 3) % 255,
                      ((xx - size / 2) ** 2 + (yy - size / 2) ** 2 < size * 5) * 200 + 20], -1)
    noise = np.random.default_rng(0).normal(0, 10, image.shape)
    return np.clip(image + noise, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("quality", [30, 60, 95])
def test_jpeg_matches_pils_encoder(quality):
    """The torch JPEG (YCbCr 4:2:0, Annex K tables at IJG quality scaling, 8×8 DCT quantisation) decodes to within
    a fraction of a level of what PIL's libjpeg makes, whose own error to the original is 5–20 times larger."""
    image = _test_image()
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    pil = np.asarray(Image.open(buffer)).astype(np.float64)
    x = torch.from_numpy(image).permute(2, 0, 1)[None].float() / 127.5 - 1
    ours = ((jpeg(x, torch.tensor([quality]))[0].permute(1, 2, 0).double().numpy() + 1) * 127.5)
    pil_error, ours_error = np.abs(pil - image).mean(), np.abs(ours - image).mean()
    assert np.abs(ours - pil).mean() < 0.2 * pil_error
    assert ours_error == pytest.approx(pil_error, rel=0.05)


def test_jpeg_loses_more_at_lower_quality_per_row():
    """Each row at its own quality: the error falls as the quality rises; at 100 a grey image (no chroma to
    subsample) comes back within a level."""
    image = torch.from_numpy(_test_image()).permute(2, 0, 1).float() / 127.5 - 1
    batch = image[None].repeat(4, 1, 1, 1)
    out = jpeg(batch, torch.tensor([20, 50, 90, 100]))
    errors = (out - batch).abs().flatten(1).mean(1) * 127.5  # levels
    assert errors[0] > errors[1] > errors[2] > errors[3]
    assert torch.equal(out[1:2], jpeg(batch[1:2], torch.tensor([50])))  # rows are independent
    grey = batch[:1, :1].expand(1, 3, -1, -1)
    assert (jpeg(grey, torch.tensor([100])) - grey).abs().mean() * 127.5 < 1


def test_an_isotropic_kernel_is_the_separable_gaussian():
    """σ equal on both axes: the same k×k Gaussian as the separable blur (in the interior, away from padding)."""
    images = torch.rand(3, 3, 32, 32) * 2 - 1
    sigma = torch.tensor([0.7, 1.3, 2.0])
    ours = anisotropic_blur(images, sigma[:, None].expand(-1, 2), torch.rand(3) * math.pi)
    kernel = 2 * math.ceil(3 * 2.0) + 1
    separable = gaussian_blur(images, sigma, kernel)
    inner = slice(kernel // 2, -(kernel // 2))
    assert torch.allclose(ours[..., inner, inner], separable[..., inner, inner], atol=1e-5)


def test_the_anisotropic_kernel_has_the_drawn_covariance():
    """The blur of an impulse is the kernel: its second moments are R·diag(σ₁², σ₂²)·Rᵀ, R the rotation by the
    drawn angle (to the 3σ truncation: within 5 %)."""
    impulse = torch.zeros(1, 1, 41, 41)
    impulse[..., 20, 20] = 1
    sigma, angle = torch.tensor([[2.5, 1.0]]), torch.tensor([0.6])
    kernel = anisotropic_blur(impulse, sigma, angle)[0, 0].double()
    offsets = torch.arange(41, dtype=torch.float64) - 20
    y, x = torch.meshgrid(offsets, offsets, indexing="ij")
    moments = torch.tensor([[(kernel * x * x).sum(), (kernel * x * y).sum()],
                            [(kernel * x * y).sum(), (kernel * y * y).sum()]])
    c, s = math.cos(0.6), math.sin(0.6)
    rotation = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    expected = rotation @ torch.diag(torch.tensor([2.5**2, 1.0**2], dtype=torch.float64)) @ rotation.T
    assert abs(kernel.sum().item() - 1) < 1e-5
    assert torch.allclose(moments, expected, rtol=0.05, atol=0.05)


def _draws(n: int, size: int = 16, seed: int = 0):
    return draw_bsr(BatchRandom(seed, 3, 1, n, 0, n), 3, size, 2.0)


def test_the_three_kinds_of_noise_have_their_statistics():
    """Colour: channels independent, each of std σ; grey: one field in every channel; correlated: the channel
    covariance σ²·Uᵀ·diag(w)·U of the drawn basis U and weights w."""
    draws = _draws(24, size=96)
    noise = bsr_noise(draws)  # [B, 3, 96, 96]
    for b in range(24):
        sigma, kind = draws.noise_sigma[b].item(), int(draws.noise_kind[b])
        channels = noise[b].flatten(1).double()  # [3, P²]
        covariance = channels @ channels.T / channels.shape[1]
        if kind == 0:
            expected = sigma**2 * torch.eye(3, dtype=torch.float64)
        elif kind == 1:
            expected = sigma**2 * torch.ones(3, 3, dtype=torch.float64)
            assert torch.equal(noise[b, 0], noise[b, 1]) and torch.equal(noise[b, 0], noise[b, 2])
        else:
            u, w = draws.noise_basis[b].double(), draws.noise_weights[b].double()
            expected = sigma**2 * u.T @ torch.diag(w) @ u
        assert torch.allclose(covariance, expected, atol=0.08 * sigma**2), (kind, covariance, expected)


def test_draws_cover_bsrgans_ranges_at_its_frequencies():
    """Over 4000 rows: JPEG qualities in 30..95, noise σ in 2..25 levels, the resize modes a third each, colour /
    grey / correlated noise at 0.4 / 0.4 / 0.2, half of the blurs anisotropic (within 4 binomial std)."""
    n = 4000
    d = _draws(n)
    assert int(d.jpeg_quality.min()) == JPEG_QUALITIES[0] and int(d.jpeg_quality.max()) == JPEG_QUALITIES[1]
    levels = d.noise_sigma * 255 / 2
    assert NOISE_LEVELS[0] <= levels.min() and levels.max() <= NOISE_LEVELS[1]

    def near(count: int, p: float) -> bool:
        return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p))

    assert all(near(int((d.resize_mode == m).sum()), 1 / 3) for m in range(3))
    assert all(near(int((d.noise_kind == k).sum()), p) for k, p in enumerate((0.4, 0.4, 0.2)))
    assert near(int((d.blur_sigma[:, 0] != d.blur_sigma[:, 1]).sum()), 0.5)
    u = d.noise_basis
    assert torch.allclose(u @ u.transpose(1, 2), torch.eye(3).expand(n, 3, 3), atol=1e-5)  # orthonormal


def test_the_degradation_is_a_function_of_the_batch_stream():
    """The same (seed, step, phase) gives the same draws and the same degraded images whatever the global RNG (a
    resumed step degrades as the first run did); another step, other ones. Output: the low-res side, in [-1, 1]."""
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    torch.manual_seed(0)
    first = bsr_degrade(images, 16, _draws(6))
    torch.manual_seed(123)
    again = bsr_degrade(images, 16, _draws(6))
    other = bsr_degrade(images, 16, _draws(6, seed=1))
    assert first.shape == (6, 3, 16, 16) and first.abs().max() <= 1
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_a_mild_degradation_is_close_to_the_plain_resize():
    """The pipeline's order: with the smallest blur (σ 0.1: a delta), bilinear resize and no noise, the degraded
    image is the JPEG of the antialiased resize; noise moves it further from the resize."""
    images = torch.from_numpy(_test_image(32)).permute(2, 0, 1)[None].float().repeat(2, 1, 1, 1) / 127.5 - 1
    d = _draws(2)
    d.blur_sigma, d.resize_mode = torch.full((2, 2), 0.1), torch.zeros(2, dtype=torch.long)
    d.noise_sigma, d.jpeg_quality = torch.zeros(2), torch.full((2,), 95)
    plain = resize(images, 16)
    mild = bsr_degrade(images, 16, d)
    assert (mild - jpeg(plain, d.jpeg_quality)).abs().mean() * 127.5 < 0.5
    d.noise_sigma = torch.full((2,), 20 * 2 / 255)
    assert (bsr_degrade(images, 16, d) - plain).abs().mean() > (mild - plain).abs().mean()
