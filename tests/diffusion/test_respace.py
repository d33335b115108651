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
    np.testing.assert_allclose(d.coefs["alphas_cumprod"].numpy(), base[kept], rtol=1e-10)
    assert len(kept) == {"ddim25": 25, "50": 50, "10,20,30": 60}[respacing]


def test_model_sees_original_timesteps():
    d = create_diffusion("ddim10", num_timesteps=100, learn_sigma=False)
    seen = []

    def model(x, t, y):
        assert torch.equal(y, torch.tensor([7, 8]))  # model_kwargs reach the model
        seen.append(t.clone())
        return torch.zeros_like(x)

    d.ddim_sample_loop(model, (2, 1, 2, 2), model_kwargs={"y": torch.tensor([7, 8])},
                       generator=torch.Generator().manual_seed(0))
    assert [s.tolist() for s in seen] == [[k, k] for k in range(90, -1, -10)]
    seen.clear()
    d.training_losses(model, torch.zeros(2, 1, 2, 2), torch.tensor([0, 9]), model_kwargs={"y": torch.tensor([7, 8])})
    assert seen[0].tolist() == [0, 90]


def test_ddim_without_exact_stride_and_full_respacing():
    assert len(space_timesteps(1000, "ddim7")) == 7
    assert space_timesteps(100, "ddim100") == set(range(100))
    assert create_diffusion("", num_timesteps=30).timestep_map.tolist() == list(range(30))
