"""Sample-quality statistics on feature vectors [N, D] of real and generated images (no network here).

- FID: Fréchet distance of Gaussians fitted to the features (Heusel et al. 2017, eq. 6).
- KID: unbiased MMD² with a cubic polynomial kernel, over random subsets (Bińkowski et al. 2018, "Demystifying
  MMD GANs", eq. 3; subsets as torch-fidelity: 100 of size 1000, clipped to the set sizes).
- Precision/recall (Kynkäänniemi et al. 2019) and density/coverage (Naeem et al. 2020, "Reliable fidelity and
  diversity metrics for generative models", eqs. 1-4) on k-nearest-neighbour balls, k = 5.
- Inception Score exp(E_x KL(p(y|x) || p(y))) over 10 splits (Salimans et al. 2016) from class logits.

Everything is computed in float64; scipy is not needed (matrix square roots come from `torch.linalg.eigh`).
"""

from __future__ import annotations

import torch
from torch import Tensor

KID_SUBSETS = 100
KID_SUBSET_SIZE = 1000
PRDC_K = 5
IS_SPLITS = 10


def gaussian_stats(features: Tensor) -> tuple[Tensor, Tensor]:
    """Mean [D] and unbiased covariance [D, D] (float64) of features [N, D], N >= 2."""
    if features.ndim != 2 or len(features) < 2:
        raise ValueError(f"need features [N >= 2, D], got shape {tuple(features.shape)}")
    x = features.double()
    return x.mean(0), torch.cov(x.T).reshape(x.shape[1], x.shape[1])


def _psd_sqrt(matrix: Tensor) -> Tensor:
    """Symmetric square root of a symmetric positive semi-definite matrix (negative round-off clipped to 0)."""
    values, vectors = torch.linalg.eigh(matrix)
    return (vectors * values.clamp(min=0).sqrt()) @ vectors.T


def frechet_distance(mu1: Tensor, sigma1: Tensor, mu2: Tensor, sigma2: Tensor) -> float:
    """||mu1 - mu2||² + Tr(S1 + S2 - 2 (S1 S2)^½) (Heusel et al. 2017, eq. 6), in float64.

    Tr (S1 S2)^½ = Σ sqrt(eigenvalues of S1^½ S2 S1^½): that matrix is symmetric PSD and similar to S1 S2, so
    `eigvalsh` applies and no complex square root (scipy.linalg.sqrtm) is needed."""
    mu1, mu2, sigma1, sigma2 = (t.double() for t in (mu1, mu2, sigma1, sigma2))
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape or sigma1.shape != (len(mu1), len(mu1)):
        raise ValueError(f"mismatched statistics: mu {tuple(mu1.shape)} vs {tuple(mu2.shape)}, "
                         f"sigma {tuple(sigma1.shape)} vs {tuple(sigma2.shape)}")
    root1 = _psd_sqrt(sigma1)
    middle = root1 @ sigma2 @ root1
    trace_sqrt = torch.linalg.eigvalsh((middle + middle.T) / 2).clamp(min=0).sqrt().sum()
    value = (mu1 - mu2).square().sum() + sigma1.trace() + sigma2.trace() - 2 * trace_sqrt
    return float(value)


def fid(real: Tensor, fake: Tensor) -> float:
    """FID between two feature sets [N, D]."""
    return frechet_distance(*gaussian_stats(real), *gaussian_stats(fake))


def polynomial_mmd2(x: Tensor, y: Tensor) -> Tensor:
    """Unbiased MMD² [S] of subsets x [S, m, D] and y [S, m, D] with k(a, b) = (a·b / D + 1)³:
    mean of k over distinct pairs within x and within y, minus twice the mean of k across."""
    m, d = x.shape[1], x.shape[2]
    k_xx = (x @ x.transpose(1, 2) / d + 1) ** 3
    k_yy = (y @ y.transpose(1, 2) / d + 1) ** 3
    k_xy = (x @ y.transpose(1, 2) / d + 1) ** 3
    within = (k_xx.sum((1, 2)) - k_xx.diagonal(dim1=1, dim2=2).sum(1)
              + k_yy.sum((1, 2)) - k_yy.diagonal(dim1=1, dim2=2).sum(1)) / (m * (m - 1))
    return within - 2 * k_xy.sum((1, 2)) / (m * m)


def kid(real: Tensor, fake: Tensor, subsets: int = KID_SUBSETS, subset_size: int = KID_SUBSET_SIZE,
        seed: int = 0, chunk: int = 10) -> tuple[float, float]:
    """KID mean and std (over subsets) of unbiased polynomial MMD² between random subsets (without
    replacement) of `real` and `fake` [N, D]; subset size clipped to the smaller set. Can be < 0."""
    m = min(subset_size, len(real), len(fake))
    if m < 2:
        raise ValueError(f"KID needs at least 2 real and 2 generated samples, got {len(real)} and {len(fake)}")
    gen = torch.Generator().manual_seed(seed)
    real, fake = real.double(), fake.double()
    values = []
    for start in range(0, subsets, chunk):  # `chunk` subsets at a time bounds the memory of the kernel matrices
        count = min(chunk, subsets - start)
        pick_r = torch.stack([torch.randperm(len(real), generator=gen)[:m] for _ in range(count)])
        pick_f = torch.stack([torch.randperm(len(fake), generator=gen)[:m] for _ in range(count)])
        values.append(polynomial_mmd2(real[pick_r], fake[pick_f]))
    scores = torch.cat(values)
    return float(scores.mean()), float(scores.std(correction=0))


def _kth_neighbour_radii(x: Tensor, k: int, chunk: int = 4096) -> Tensor:
    """Distance [N] from each row of x to its k-th nearest other row (Naeem et al.: the k-NN ball radius)."""
    return torch.cat([torch.cdist(x[i : i + chunk], x).topk(k + 1, dim=1, largest=False).values[:, k]
                      for i in range(0, len(x), chunk)])


def prdc(real: Tensor, fake: Tensor, k: int = PRDC_K, chunk: int = 4096) -> dict[str, float]:
    """Precision, recall (Kynkäänniemi et al. 2019), density and coverage (Naeem et al. 2020, eqs. 1-4) with
    k-NN balls in feature space: precision = share of fakes inside some real ball; recall = share of reals
    inside some fake ball; density = real balls containing each fake / k, averaged; coverage = share of real
    balls holding at least one fake."""
    if min(len(real), len(fake)) <= k:
        raise ValueError(f"precision/recall with k={k} needs more than {k} real and generated samples, "
                         f"got {len(real)} and {len(fake)}")
    real, fake = real.double(), fake.double()
    real_radii, fake_radii = _kth_neighbour_radii(real, k), _kth_neighbour_radii(fake, k)
    in_real_ball = torch.zeros(len(fake), dtype=torch.float64)  # per fake: how many real balls contain it
    covered = torch.zeros(len(real), dtype=torch.bool)  # per real: its ball holds a fake
    recalled = torch.zeros(len(real), dtype=torch.bool)  # per real: inside some fake ball
    for i in range(0, len(fake), chunk):
        dist = torch.cdist(real, fake[i : i + chunk])  # [N_real, c]
        inside = dist < real_radii[:, None]
        in_real_ball[i : i + chunk] = inside.sum(0)
        covered |= inside.any(1)
        recalled |= (dist < fake_radii[None, i : i + chunk]).any(1)
    return {"precision": float((in_real_ball > 0).double().mean()), "recall": float(recalled.double().mean()),
            "density": float(in_real_ball.mean() / k), "coverage": float(covered.double().mean())}


def inception_score(logits: Tensor, splits: int = IS_SPLITS) -> tuple[float, float]:
    """Mean and std over `splits` consecutive chunks of exp(mean_x KL(p(y|x) || p(y))), p(y|x) = softmax of
    `logits` [N, C] and p(y) its mean over the chunk (Salimans et al. 2016, section 4)."""
    if len(logits) < splits:
        raise ValueError(f"the Inception Score over {splits} splits needs at least {splits} samples, got "
                         f"{len(logits)}")
    scores = []
    for part in torch.tensor_split(logits.double(), splits):
        log_p = part.log_softmax(1)
        log_py = log_p.exp().mean(0).log()
        scores.append((log_p.exp() * (log_p - log_py)).sum(1).mean().exp())
    values = torch.stack(scores)
    return float(values.mean()), float(values.std(correction=0))
