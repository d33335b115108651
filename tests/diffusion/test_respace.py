import numpy as np
import pytest
import torch

from genforge.diffusion import beta_schedule, create_diffusion, space_timesteps


def test_ddim_stride_and_sections():
    assert space_timesteps(1000, "ddim50") == set(range(0, 1000, 20))
    assert space_timesteps(100, "10") == {round(i * 99 / 9) for i in range(10)}
    kept = space_timesteps(30, "2,3")
    assert len(kept) == 5 and {0, 14, 15, 29} <= kept
    with pytest.raises(ValueError):
        space_timesteps(10, "20")


@pytest.mark.parametrize("respacing", ["ddim25", "50", "10,20,30"])
def test_respacing_keeps_the_marginals(respacing):
    base = np.cumprod(1 - beta_schedule("cosine", 1000))
    d = create_diffusion(respacing, noise_schedule="cosine")
    kept = d.timestep_map.numpy()
    np.testing.assert_allclose(d.np["alphas_cumprod"], base[kept], rtol=1e-10)


def test_model_sees_original_timesteps():
    d = create_diffusion("ddim10", num_timesteps=100, learn_sigma=False)
    seen = []

    def model(x, t, **kw):
        seen.append(t.clone())
        return torch.zeros_like(x)

    d.ddim_sample_loop(model, (2, 1, 2, 2), generator=torch.Generator().manual_seed(0))
    assert [s[0].item() for s in seen] == list(range(90, -1, -10))
