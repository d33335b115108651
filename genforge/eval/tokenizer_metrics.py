"""Reconstruction metrics of tokenizers: PSNR, SSIM (Wang et al. 2004) and codebook usage."""

from __future__ import annotations

import torch
from torch import Tensor

DATA_RANGE = 2.0  # images live in [-1, 1]


def psnr(x: Tensor, y: Tensor) -> Tensor:
    """Per-image PSNR [B] in dB of images in [-1, 1]: 10·log10(2² / MSE); inf for identical images."""
    from torchmetrics.functional.image import peak_signal_noise_ratio  # deferred: torchmetrics takes ~1 s to import

    return peak_signal_noise_ratio(x.float(), y.float(), data_range=DATA_RANGE, reduction="none", dim=(1, 2, 3))


def ssim(x: Tensor, y: Tensor) -> Tensor:
    """Per-image SSIM [B] of images in [-1, 1] (11x11 Gaussian window, sigma 1.5); 1 for identical images."""
    from torchmetrics.functional.image import structural_similarity_index_measure  # deferred: ~1 s to import

    return structural_similarity_index_measure(x.float(), y.float(), data_range=DATA_RANGE, reduction="none")


def batch_codebook_usage(ids: Tensor, codebook_size: int) -> dict[str, Tensor]:
    """Training-time logs of one batch's token ids: share of the codebook used, perplexity exp(H) of their
    histogram (tensors; no host sync)."""
    counts = torch.bincount(ids.detach().reshape(-1), minlength=codebook_size).float()
    p = counts / counts.sum()
    entropy = -torch.special.xlogy(p, p).sum()
    return {"codebook_usage": (counts > 0).float().mean(), "codebook_perplexity": entropy.exp()}


class CodebookUsage:
    """Code counts over an evaluation pass: share of codes used, perplexity exp(H) of the code distribution
    (codebook_size when every code is equally frequent), and the number of codes never used (dead)."""

    def __init__(self, codebook_size: int) -> None:
        if codebook_size < 1:
            raise ValueError(f"codebook_size must be >= 1, got {codebook_size}")
        self.codebook_size = codebook_size
        self.counts = torch.zeros(codebook_size, dtype=torch.long)

    def update(self, ids: Tensor) -> None:
        """Count the token ids (long, any shape, in [0, codebook_size))."""
        ids = ids.detach().reshape(-1).long()
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.codebook_size):
            raise ValueError(f"token ids must lie in [0, {self.codebook_size}), got [{ids.min()}, {ids.max()}]")
        self.counts = self.counts.to(ids.device) + torch.bincount(ids, minlength=self.codebook_size)

    def compute(self) -> dict[str, float | int]:
        """codebook_usage (share used), codebook_perplexity (exp of the entropy in nats), codebook_dead."""
        total = int(self.counts.sum())
        if total == 0:
            raise ValueError("CodebookUsage.compute() before any update()")
        p = self.counts.double() / total
        entropy = -torch.special.xlogy(p, p).sum()  # 0·log 0 = 0
        used = int((self.counts > 0).sum())
        return {"codebook_usage": used / self.codebook_size, "codebook_perplexity": float(entropy.exp()),
                "codebook_dead": self.codebook_size - used}
