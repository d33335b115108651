import numpy as np
import pytest

from genforge.diffusion import beta_schedule


def test_linear_endpoints_scale_with_T():
    b = beta_schedule("linear", 1000)
    assert b.shape == (1000,) and b[0] == pytest.approx(1e-4) and b[-1] == pytest.approx(0.02)
    assert beta_schedule("linear", 100)[-1] == pytest.approx(0.2)


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_alpha_bar_decreases_to_near_zero(name):
    ac = np.cumprod(1 - beta_schedule(name, 1000))
    assert np.all(np.diff(ac) < 0) and ac[-1] < 1e-4 and ac[0] > 0.99


def test_cosine_matches_eq17_and_clips():
    b = beta_schedule("cosine", 1000)
    f = lambda t: np.cos((t / 1000 + 0.008) / 1.008 * np.pi / 2) ** 2
    np.testing.assert_allclose(np.cumprod(1 - b)[499], f(500) / f(0), rtol=1e-9)
    assert b.max() <= 0.999


def test_unknown_schedule():
    with pytest.raises(ValueError, match="allowed: linear, cosine"):
        beta_schedule("quadratic", 10)
