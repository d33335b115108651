"""The objectives (ddpm, flow, edm) and the σ-samplers against closed forms."""

import math

import pytest
import torch

from genforge.core.random import BatchRandom
from genforge.diffusion import (SAMPLERS, DDPMObjective, EDMObjective, FlowObjective, SamplingProcess,
                                classifier_free_guidance, create_diffusion, karras_sigmas)
from genforge.diffusion.build import sampling_process
from genforge.diffusion.config import DiffusionConfig
from genforge.diffusion.objectives import gaussian_denoiser


def test_flow_interpolant_has_the_right_marginal():
    """x_t = (1 − t)·x₀ + t·ε: mean (1 − t)·x₀, std t, for fixed x₀."""
    x0, t = torch.full((20000, 1), 0.8), torch.full((20000,), 0.3)
    x_t = FlowObjective.interpolate(x0, t, torch.randn(20000, 1, generator=torch.Generator().manual_seed(0)))
    assert x_t.mean().item() == pytest.approx(0.7 * 0.8, abs=0.01) and x_t.std().item() == pytest.approx(0.3, rel=0.02)


def test_flow_velocity_integrates_back_to_x0_exactly():
    """For one data point x₀ the true velocity is v = (x_t − x₀)/t; Euler along it (straight paths) lands on x₀."""
    x0 = torch.tensor([[0.5, -0.25, 0.9]])
    objective = FlowObjective()

    def velocity(x_t, t_model, **_):
        return (x_t - x0) / (t_model / objective.TIME_SCALE).view(-1, 1)

    loss = objective.training_losses(velocity, x0, torch.tensor([0.4]), torch.tensor([[1.0, 2.0, -1.0]]))["loss"]
    assert loss.item() == pytest.approx(0.0, abs=1e-10)
    for steps in (1, 3, 10):
        process = SamplingProcess(denoise=objective.denoiser(velocity, {}, 3), sigmas=objective.sigmas(steps))
        out = SAMPLERS.get("euler").run(process, torch.randn(1, 3), generator=None, progress=False)
        torch.testing.assert_close(out, x0, atol=1e-4, rtol=0)  # float32 at σ up to 999


def test_edm_preconditioning_matches_table_1_and_a_perfect_model_returns_x0():
    objective, sigma, sd = EDMObjective(sigma_data=0.5), torch.tensor([0.02, 0.5, 3.0, 80.0]), 0.5
    c_skip, c_out, c_in, c_noise = objective.preconditioning(sigma)
    torch.testing.assert_close(c_skip, sd**2 / (sigma**2 + sd**2))
    torch.testing.assert_close(c_out, sigma * sd / (sigma**2 + sd**2).sqrt())
    torch.testing.assert_close(c_in, 1 / (sd**2 + sigma**2).sqrt())
    torch.testing.assert_close(c_noise, sigma.log() / 4)
    torch.testing.assert_close(objective.loss_weight(sigma), (sigma**2 + sd**2) / (sigma * sd) ** 2)
    x0 = torch.randn(4, 2)
    noise = torch.randn(4, 2)
    x = x0 + sigma[:, None] * noise

    def perfect(scaled, t_model, **_):  # F such that c_skip·x + c_out·F = x₀
        s = (t_model / objective.TIME_SCALE * 4).exp()[:, None]
        skip, out, c_in_s, _ = objective.preconditioning(s)
        return (x0 - skip * scaled / c_in_s) / out

    torch.testing.assert_close(objective.denoiser(perfect, {}, 2)(x, sigma), x0, atol=1e-4, rtol=1e-4)
    assert objective.training_losses(perfect, x0, sigma, noise)["mse"].abs().max() < 1e-8


def test_ddpm_denoiser_of_a_perfect_eps_model_returns_x0():
    objective = DDPMObjective(create_diffusion("", num_timesteps=100, learn_sigma=False), lambda rng: None)
    x0, noise = torch.randn(3, 2), torch.randn(3, 2)
    sigma = torch.tensor([0.05, 1.0, 20.0])

    def eps(x_t, t, **_):  # the ε that makes x_t from x₀ at this σ
        alpha_bar = 1 / (1 + objective.sigma_of_time(t) ** 2)
        return (x_t - alpha_bar.sqrt()[:, None] * x0) / (1 - alpha_bar).sqrt()[:, None]

    x = x0 + sigma[:, None] * noise
    torch.testing.assert_close(objective.denoiser(eps, {}, 2)(x, sigma), x0, atol=1e-4, rtol=1e-4)
    t = objective.time_of_sigma(sigma)
    torch.testing.assert_close(objective.sigma_of_time(t), sigma, rtol=1e-4, atol=0)


@pytest.mark.parametrize("name, steps", [("euler", 400), ("heun", 30), ("dpmpp_2m", 30), ("euler_ancestral", 400)])
def test_each_sampler_integrates_a_gaussian_to_its_mean_and_std(name, steps):
    """Data N(0.3, 0.5²): the ideal denoiser is analytic, so a sampler's output must have that mean and std."""
    process = SamplingProcess(denoise=gaussian_denoiser(0.3, 0.5), sigmas=karras_sigmas(steps, 0.002, 80.0))
    gen = torch.Generator().manual_seed(0)
    out = SAMPLERS.get(name).run(process, torch.randn(40000, 1, generator=gen), generator=gen, progress=False)
    assert out.mean().item() == pytest.approx(0.3, abs=0.02) and out.std().item() == pytest.approx(0.5, rel=0.03)


def test_karras_sigmas_follow_eq_5():
    sigmas = karras_sigmas(4, 0.002, 80.0, rho=7.0)
    assert sigmas[0].item() == pytest.approx(80.0) and sigmas[3].item() == pytest.approx(0.002)
    assert sigmas[-1] == 0 and (sigmas[:-1] > sigmas[1:]).all()
    mid = (80.0 ** (1 / 7) + 1 / 3 * (0.002 ** (1 / 7) - 80.0 ** (1 / 7))) ** 7
    assert sigmas[1].item() == pytest.approx(mid)


def test_guidance_interval_guides_only_inside_it():
    calls = []

    def model(x, t, y):
        calls.append(len(x))
        return x + y.view(-1, 1).float()

    guided = classifier_free_guidance(model, 3.0, {"y": torch.zeros(1, dtype=torch.long)}, 1,
                                      active=lambda t: t[0].item() > 500)
    x, y = torch.zeros(2, 1), torch.ones(2, dtype=torch.long)
    assert torch.equal(guided(x, torch.full((2,), 900.0), y=y), torch.full((2, 1), 3.0))  # u + 3·(c − u)
    assert torch.equal(guided(x, torch.full((2,), 100.0), y=y), torch.full((2, 1), 1.0))  # conditional only
    assert calls == [4, 2]


def test_samplers_and_objectives_that_do_not_fit_are_config_errors():
    with pytest.raises(ValueError, match="sampler=ddim steps the discrete DDPM chain and does not work with "
                                         "model.diffusion.objective=flow"):
        DiffusionConfig(objective="flow", learn_sigma=False, sampler="ddim")
    with pytest.raises(ValueError, match="learn_sigma applies to model.diffusion.objective=ddpm.*set it to false"):
        DiffusionConfig(objective="edm", sampler="heun")
    with pytest.raises(ValueError, match="prediction applies to model.diffusion.objective=ddpm"):
        DiffusionConfig(objective="flow", learn_sigma=False, prediction="x0", sampler="euler")
    cfg = DiffusionConfig(objective="flow", learn_sigma=False, sampler="euler")
    with pytest.raises(ValueError, match="does not work with model.diffusion.objective=flow"):
        sampling_process(cfg, model=lambda x, t: x, model_kwargs={}, channels=3, clip=True, sampler="ddpm", steps=10,
                         cfg_scale=1.0, null_kwargs=None)


def test_objective_draws_are_split_invariant():
    """Times and noise come from the batch's random stream: any split of the global batch sees the same rows."""
    x0 = torch.randn(6, 2, 4, 4)
    for objective in (FlowObjective(), EDMObjective(), FlowObjective("logit_normal")):
        whole = objective.draw(BatchRandom(1, 2, 0, 6, 0, 6), x0)
        parts = [objective.draw(BatchRandom(1, 2, 0, 6, o, 3), x0[o:o + 3]) for o in (0, 3)]
        assert all(torch.equal(whole[k], torch.cat([p[k] for p in parts])) for k in (0, 1))
    assert math.isfinite(EDMObjective().sigma_of_time(torch.tensor([0.0])).item())
