"""FID, KID, precision/recall/density/coverage and the Inception Score on synthetic Gaussian "features"."""

import math

import pytest
import torch

from genforge.eval import distribution_metrics as dm


def gaussian(n, d, seed, shift=0.0, scale=1.0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale + shift


def test_fid_of_a_set_with_itself_is_zero():
    x = gaussian(300, 16, 0)
    assert abs(dm.fid(x, x)) < 1e-9
    few = gaussian(5, 32, 1)  # fewer samples than dimensions: singular covariances, whose zero eigenvalues
    assert abs(dm.fid(few, few)) < 1e-6 * float(few.var(0).sum())  # carry round-off of order sqrt(1e-16)


def test_fid_matches_the_closed_form_for_diagonal_gaussians():
    # ||mu1 - mu2||² + Σ (sqrt(a) - sqrt(b))² for N(mu1, diag a) and N(mu2, diag b)
    a, b = torch.tensor([1.0, 4.0, 0.25, 9.0]).double(), torch.tensor([2.0, 1.0, 1.0, 0.0]).double()
    mu1, mu2 = torch.tensor([0.0, 1.0, -1.0, 2.0]).double(), torch.tensor([0.5, 1.0, 1.0, 0.0]).double()
    exact = float((mu1 - mu2).square().sum() + (a.sqrt() - b.sqrt()).square().sum())
    assert dm.frechet_distance(mu1, torch.diag(a), mu2, torch.diag(b)) == pytest.approx(exact, abs=1e-9)
    # and from samples of those Gaussians
    x = gaussian(40_000, 4, 2) * a.sqrt() + mu1
    y = gaussian(40_000, 4, 3) * b.sqrt() + mu2
    assert dm.fid(x, y) == pytest.approx(exact, rel=0.03)


def test_fid_agrees_with_the_eigenvalues_of_s1_s2_for_full_covariances():
    x, y = gaussian(200, 6, 4) @ gaussian(6, 6, 5), gaussian(200, 6, 6) @ gaussian(6, 6, 7) + 1
    (mu1, s1), (mu2, s2) = dm.gaussian_stats(x), dm.gaussian_stats(y)
    trace_sqrt = torch.linalg.eigvals(s1 @ s2).real.clamp(min=0).sqrt().sum()
    expected = float((mu1 - mu2).square().sum() + s1.trace() + s2.trace() - 2 * trace_sqrt)
    assert dm.frechet_distance(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-9)


def test_fid_grows_with_added_noise():
    x = gaussian(2000, 16, 8)
    noise = gaussian(2000, 16, 9)
    values = [dm.fid(x, x + s * noise) for s in (0.0, 0.1, 0.3, 1.0, 3.0)]
    assert values[0] < 1e-9 and all(a < b for a, b in zip(values, values[1:])), values


def test_kid_is_unbiased_near_zero_for_one_distribution_and_positive_for_a_shift():
    x = gaussian(400, 16, 10)
    same = [dm.kid(x[:200], x[200:], subsets=20, subset_size=100, seed=s)[0] for s in range(8)]
    mean_same = sum(same) / len(same)
    shifted = dm.kid(x[:200], gaussian(200, 16, 11, shift=0.5), subsets=20, subset_size=100)
    assert min(same) < 0 < max(same) or abs(mean_same) < 0.01  # unbiased: can be negative
    assert abs(mean_same) < shifted[0] / 10 and shifted[0] > 0 and shifted[1] > 0


def test_kid_subsets_are_clipped_and_reproducible():
    x, y = gaussian(30, 8, 12), gaussian(40, 8, 13, shift=1.0)
    assert dm.kid(x, y, subsets=5) == dm.kid(x, y, subsets=5)  # subset size 30, seeded draws
    with pytest.raises(ValueError, match="at least 2"):
        dm.kid(x[:1], y)


def test_polynomial_mmd2_equals_the_definition():
    x, y = gaussian(6, 3, 14), gaussian(6, 3, 15)
    k = lambda a, b: (a @ b / 3 + 1) ** 3  # noqa: E731
    m = 6
    xx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    yy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    xy = sum(k(x[i], y[j]) for i in range(m) for j in range(m)) / (m * m)
    assert float(dm.polynomial_mmd2(x[None], y[None])[0]) == pytest.approx(float(xx + yy - 2 * xy), rel=1e-9)


def test_prdc_identical_sets_and_disjoint_sets():
    x = gaussian(200, 8, 16)
    assert dm.prdc(x, x) == {"precision": 1.0, "recall": 1.0, "density": 1.0, "coverage": 1.0}
    far = dm.prdc(x, gaussian(200, 8, 17, shift=100.0))
    assert far == {"precision": 0.0, "recall": 0.0, "density": 0.0, "coverage": 0.0}


def test_prdc_sees_fidelity_and_diversity_apart():
    real = gaussian(500, 4, 18)
    collapsed = gaussian(500, 4, 19, scale=0.1)  # inside the real support, little diversity
    result = dm.prdc(real, collapsed)
    assert result["precision"] > 0.9 and result["recall"] < 0.3 and result["coverage"] < 0.5
    same = dm.prdc(real, gaussian(500, 4, 20), chunk=64)  # another draw of the same distribution, chunked
    assert all(0.6 < same[k] for k in ("precision", "recall", "coverage")) and 0.6 < same["density"] < 1.4
    with pytest.raises(ValueError, match="more than 5"):
        dm.prdc(real[:5], real)


def test_inception_score_bounds():
    classes = 10
    confident = torch.eye(classes).repeat(10, 1) * 50  # every class equally often, each sample certain
    mean, std = dm.inception_score(confident)
    assert mean == pytest.approx(classes, rel=1e-6) and std < 1e-6
    assert dm.inception_score(torch.zeros(100, classes))[0] == pytest.approx(1.0)  # uniform predictions
    one_class = torch.zeros(100, classes)
    one_class[:, 3] = 50
    assert dm.inception_score(one_class)[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 10"):
        dm.inception_score(torch.zeros(9, classes))


def test_statistics_are_float64():
    mu, sigma = dm.gaussian_stats(torch.randn(10, 3))
    assert mu.dtype == sigma.dtype == torch.float64 and sigma.shape == (3, 3)
    assert not math.isnan(dm.fid(torch.randn(10, 1), torch.randn(10, 1)))
