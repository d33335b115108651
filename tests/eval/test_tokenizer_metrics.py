import math

import pytest
import torch

from genforge.eval.tokenizer_metrics import CodebookUsage, batch_codebook_usage, psnr, ssim


def images(seed: int = 0, shape=(3, 3, 16, 16)) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_psnr_identical_and_known_noise():
    x = images()
    assert torch.isinf(psnr(x, x)).all()
    noise = 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    mse = noise.square().mean((1, 2, 3))
    expected = 10 * torch.log10(4 / mse)  # data range of [-1, 1] is 2
    assert psnr(x + noise, x).shape == (3,)
    assert torch.allclose(psnr(x + noise, x), expected, atol=1e-4)


def test_ssim_identical_is_one_and_noise_lowers_it():
    x = images()
    assert torch.allclose(ssim(x, x), torch.ones(3))
    noisy = ssim((x + 0.3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(2))).clamp(-1, 1), x)
    assert noisy.shape == (3,) and (noisy < 0.9).all()


def test_codebook_usage_closed_forms():
    usage = CodebookUsage(8)
    usage.update(torch.tensor([[0, 1], [2, 3]]))
    usage.update(torch.tensor([0, 1, 2, 3]))  # accumulates across updates, any shape
    assert usage.compute() == {"codebook_usage": 0.5, "codebook_perplexity": pytest.approx(4.0), "codebook_dead": 4}

    two = CodebookUsage(4)
    two.update(torch.tensor([1, 1, 1, 1]))
    two.update(torch.tensor([0, 0, 0, 0]))  # counts [4, 4, 0, 0]: two equally likely codes
    assert two.compute()["codebook_perplexity"] == pytest.approx(2.0)

    uneven = CodebookUsage(16)
    uneven.update(torch.tensor([3, 3, 3, 9]))
    p = (0.75, 0.25)
    assert uneven.compute()["codebook_perplexity"] == pytest.approx(math.exp(-sum(q * math.log(q) for q in p)))
    assert uneven.compute()["codebook_dead"] == 14

    full = CodebookUsage(5)
    full.update(torch.arange(5).repeat(3))
    assert full.compute() == {"codebook_usage": 1.0, "codebook_perplexity": pytest.approx(5.0), "codebook_dead": 0}


def test_codebook_usage_errors():
    usage = CodebookUsage(4)
    with pytest.raises(ValueError, match="before any update"):
        usage.compute()
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        usage.update(torch.tensor([0, 4]))
    with pytest.raises(ValueError):
        usage.update(torch.tensor([-1]))


def test_batch_codebook_usage_and_perplexity():
    logs = batch_codebook_usage(torch.tensor([0, 1, 2, 3]), 8)
    assert logs["codebook_usage"].item() == 0.5 and logs["codebook_perplexity"].item() == pytest.approx(4.0)
    logs = batch_codebook_usage(torch.zeros(10, dtype=torch.long), 8)
    assert logs["codebook_usage"].item() == 1 / 8 and logs["codebook_perplexity"].item() == pytest.approx(1.0)
