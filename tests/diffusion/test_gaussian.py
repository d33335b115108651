import math

import numpy as np
import pytest
import torch

from genforge.diffusion import (GaussianDiffusion, LossType, MeanType, VarType, beta_schedule, create_diffusion,
                                discretized_gaussian_log_likelihood, normal_kl)


def make(mean=MeanType.EPSILON, var=VarType.FIXED_SMALL, loss=LossType.MSE, T=1000, schedule="linear"):
    return GaussianDiffusion(beta_schedule(schedule, T), mean, var, loss)


def test_q_sample_statistics():
    d = make()
    x0 = torch.tensor([0.7, -0.3]).view(1, 2, 1, 1).expand(20000, 2, 1, 1)
    for step in (10, 500, 990):
        t = torch.full((20000,), step)
        xt = d.q_sample(x0, t, torch.randn(x0.shape, generator=torch.Generator().manual_seed(step)))
        ab = d.coefs["alphas_cumprod"][step].item()
        torch.testing.assert_close(xt.mean(0).flatten(), math.sqrt(ab) * x0[0].flatten(), atol=0.03, rtol=0)
        torch.testing.assert_close(xt.var(0).flatten(), torch.full((2,), 1 - ab), atol=0.03, rtol=0.05)


def test_posterior_matches_closed_form():
    T = 200
    betas = beta_schedule("cosine", T)
    d = GaussianDiffusion(betas, MeanType.EPSILON, VarType.FIXED_SMALL, LossType.MSE)
    alphas = 1 - betas
    ab = np.cumprod(alphas)
    x0, xt = torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)
    t = torch.tensor([0, 57, 199])
    mean, var, logvar = d.q_posterior_mean_variance(x0, xt, t)
    for i, s in enumerate(t.tolist()):
        ab_prev = ab[s - 1] if s > 0 else 1.0
        c1 = math.sqrt(ab_prev) * betas[s] / (1 - ab[s])
        c2 = math.sqrt(alphas[s]) * (1 - ab_prev) / (1 - ab[s])
        torch.testing.assert_close(mean[i], (c1 * x0[i] + c2 * xt[i]).float(), rtol=1e-5, atol=1e-6)
        beta_tilde = (1 - ab_prev) / (1 - ab[s]) * betas[s]
        assert var[i].flatten()[0].item() == pytest.approx(beta_tilde, rel=1e-5, abs=1e-12)
        expected_log = math.log(beta_tilde if s > 0 else betas[1] * (1 - ab[0]) / (1 - ab[1]))
        assert logvar[i].flatten()[0].item() == pytest.approx(expected_log, rel=1e-5)


def test_kl_of_identical_gaussians_is_zero_and_vb_nonnegative():
    m, lv = torch.randn(5), torch.randn(5)
    assert torch.allclose(normal_kl(m, lv, m, lv), torch.zeros(5), atol=1e-6)
    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, 6, 1)  # a random model: mean and variance channels

    def model(x, t):
        return torch.tanh(net(x))

    x0 = torch.rand(16, 3, 4, 4) * 2 - 1
    t = torch.randint(0, 100, (16,))
    t[0] = 0  # the decoder NLL term
    for var in VarType:
        d = make(var=var, T=100)
        xt = d.q_sample(x0, t, torch.randn_like(x0))
        vb = d.vb_terms_bpd(model if var == VarType.LEARNED_RANGE else lambda x, tt: model(x, tt)[:, :3],
                            x0, xt, t)["output"]
        assert vb.shape == (16,) and torch.all(vb >= -1e-6), var
    kl = make(var=VarType.LEARNED_RANGE, loss=LossType.RESCALED_KL, T=100).training_losses(model, x0, t)
    assert kl["loss"].shape == (16,) and torch.all(kl["loss"] >= -1e-4)


def test_oracle_xstart_with_posterior_variance_has_zero_kl():
    """With Σ = β̃_t and x̂_0 = x_0, p_θ(x_{t−1}|x_t) is exactly q(x_{t−1}|x_t,x_0): L_t = 0 for t > 0."""
    d = make(mean=MeanType.START_X, var=VarType.FIXED_SMALL, T=100)
    x0 = torch.rand(6, 2, 3, 3) * 2 - 1
    t = torch.tensor([1, 2, 10, 50, 90, 99])
    xt = d.q_sample(x0, t, torch.randn_like(x0))
    assert d.vb_terms_bpd(lambda x, tt: x0, x0, xt, t)["output"].abs().max() < 1e-5


def test_learned_range_interpolates_between_the_two_fixed_variances():
    """IDDPM eq. 15: v = -1 gives β̃_t (clipped), v = +1 gives β_t."""
    betas = beta_schedule("linear", 100)
    d = GaussianDiffusion(betas, MeanType.EPSILON, VarType.LEARNED_RANGE, LossType.MSE)
    small = GaussianDiffusion(betas, MeanType.EPSILON, VarType.FIXED_SMALL, LossType.MSE)
    x, t = torch.randn(3, 2, 4), torch.tensor([0, 40, 99])
    for v, expected in ((-1.0, small.p_mean_variance(lambda x, tt: x, x, t)["log_variance"]),
                        (1.0, torch.tensor(np.log(betas), dtype=torch.float32)[t].view(3, 1, 1).expand_as(x))):
        out = d.p_mean_variance(lambda x, tt: torch.cat([x, torch.full_like(x, v)], 1), x, t)
        torch.testing.assert_close(out["log_variance"], expected)


def test_discretized_decoder_is_a_distribution_over_256_bins():
    """The 8-bit decoder (DDPM §3.3): bin probabilities of one Gaussian sum to 1 over all 256 values."""
    bins = torch.linspace(-1, 1, 256)
    for mean, log_scale in ((0.3, -3.0), (-0.9, -1.0), (0.0, 0.5)):
        logp = discretized_gaussian_log_likelihood(bins, torch.full_like(bins, mean), torch.full_like(bins, log_scale))
        assert logp.exp().sum().item() == pytest.approx(1.0, abs=1e-4)


def test_conversions_round_trip():
    d = make()
    x0, eps = torch.randn(4, 3, 2, 2), torch.randn(4, 3, 2, 2)
    t = torch.tensor([1, 100, 500, 999])
    xt = d.q_sample(x0, t, eps)
    torch.testing.assert_close(d.predict_xstart_from_eps(xt, t, eps), x0, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(d.predict_eps_from_xstart(xt, t, x0), eps, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(d.predict_xstart_from_v(xt, t, d.velocity(x0, t, eps)), x0, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mean_type", list(MeanType))
def test_oracle_model_has_zero_mse(mean_type):
    d = make(mean=mean_type, T=100)
    x0, noise = torch.randn(8, 2, 4, 4), torch.randn(8, 2, 4, 4)
    t = torch.randint(0, 100, (8,))
    target = {MeanType.EPSILON: noise, MeanType.START_X: x0, MeanType.VELOCITY: d.velocity(x0, t, noise)}[mean_type]
    terms = d.training_losses(lambda x, tt: target, x0, t, noise=noise)
    assert terms["mse"].max() < 1e-10 and torch.equal(terms["loss"], terms["mse"])


def test_hybrid_loss_weights_and_stops_gradient_of_mean():
    d = create_diffusion(num_timesteps=100, learn_sigma=True, loss_type=LossType.MSE)
    rescaled = create_diffusion(num_timesteps=100, learn_sigma=True, loss_type=LossType.RESCALED_MSE)
    w = torch.zeros(1, requires_grad=True)
    model = lambda x, t: torch.cat([x * w, x * 0 + w], dim=1)
    x0, noise, t = torch.rand(4, 1, 4, 4) * 2 - 1, torch.randn(4, 1, 4, 4), torch.tensor([1, 5, 50, 99])
    plain = d.training_losses(model, x0, t, noise=noise)
    scaled = rescaled.training_losses(model, x0, t, noise=noise)
    torch.testing.assert_close(scaled["vb"], plain["vb"] * 0.1)
    torch.testing.assert_close(plain["loss"], plain["mse"] + plain["vb"])
    grad_vb, = torch.autograd.grad(plain["vb"].sum(), w)
    # the vb term reaches w only through the variance channel: with the mean detached, d(vb)/dw equals
    # the gradient through the variance path alone
    model_var_only = lambda x, tt: torch.cat([(x * w).detach(), x * 0 + w], dim=1)
    grad_var, = torch.autograd.grad(d.training_losses(model_var_only, x0, t, noise=noise)["vb"].sum(), w)
    torch.testing.assert_close(grad_vb, grad_var)


def _oracle_eps(x_star, T=1000):
    """The exact ε-predictor for data that is the single point x_star, at ORIGINAL timesteps."""
    ab = torch.tensor(np.cumprod(1 - beta_schedule("linear", T)), dtype=torch.float32)

    def model(x, t):
        a = ab[t].view(-1, *[1] * (x.ndim - 1))
        return (x - a.sqrt() * x_star) / (1 - a).sqrt()

    return model


X_STAR = torch.tensor([0.5, -0.25, 0.8]).view(1, 3, 1, 1)


def test_ddim_with_oracle_recovers_the_data_point():
    d = create_diffusion("ddim50", learn_sigma=False)
    out = d.ddim_sample_loop(_oracle_eps(X_STAR), (4, 3, 1, 1), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, X_STAR.expand(4, 3, 1, 1), atol=1e-3, rtol=0)


def test_ddpm_with_oracle_lands_near_the_data_point_and_is_seeded():
    d = create_diffusion("100", learn_sigma=False)
    run = lambda s: d.p_sample_loop(_oracle_eps(X_STAR), (4, 3, 1, 1), generator=torch.Generator().manual_seed(s))
    out = run(0)
    torch.testing.assert_close(out, X_STAR.expand(4, 3, 1, 1), atol=0.02, rtol=0)
    assert torch.equal(out, run(0)) and not torch.equal(out, run(1))


def test_stochastic_ddim_is_seeded_and_noise_argument_is_the_start():
    d = create_diffusion("ddim20", learn_sigma=False)
    model = lambda x, t: 0.1 * x
    run = lambda s: d.ddim_sample_loop(model, (2, 3, 4), generator=torch.Generator().manual_seed(s), eta=1.0)
    assert torch.equal(run(3), run(3)) and not torch.equal(run(3), run(4))
    noise = torch.randn(2, 3, 4)
    a = d.ddim_sample_loop(model, noise.shape, noise=noise)
    b = d.ddim_sample_loop(model, noise.shape, noise=noise.clone(), generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, b)  # eta = 0: deterministic given x_T


@pytest.mark.parametrize("shape", [(3, 2), (3, 2, 5), (3, 2, 2, 3, 3)])
def test_any_number_of_spatial_dims(shape):
    d = create_diffusion("10", num_timesteps=50, learn_sigma=True)
    model = lambda x, t: torch.cat([torch.zeros_like(x), torch.tanh(x)], dim=1)
    terms = d.training_losses(model, torch.rand(shape) * 2 - 1, torch.randint(0, d.num_timesteps, (3,)))
    assert all(terms[k].shape == (3,) for k in ("loss", "mse", "vb"))
    assert d.p_sample_loop(model, shape, generator=torch.Generator().manual_seed(0)).shape == shape


def test_single_step_process_samples():
    d = create_diffusion("ddim1", learn_sigma=True)
    assert d.num_timesteps == 1
    out = d.p_sample_loop(lambda x, t: torch.cat([torch.zeros_like(x), x], 1), (2, 3, 2, 2))
    assert torch.isfinite(out).all()


def test_min_snr_weights_agree_across_parametrizations():
    """The same x0 error costs the same weighted loss whatever the model predicts: ||Δε||² = SNR·||Δx0||² and
    ||Δv||² = (SNR+1)·||Δx0||², so w_ε·SNR = w_x0 = w_v·(SNR+1) = min(SNR, γ) (Hang et al. 2023)."""
    t = torch.arange(0, 1000, 37)
    weights = {}
    for mean_type in (MeanType.EPSILON, MeanType.START_X, MeanType.VELOCITY):
        diffusion = create_diffusion(noise_schedule="cosine", mean_type=mean_type, learn_sigma=False)
        weights[mean_type] = diffusion.min_snr_weight(t, gamma=5.0).double()
    ac = diffusion.coefs["alphas_cumprod"][t]
    snr = ac / (1 - ac)
    expected = snr.clamp(max=5.0)
    torch.testing.assert_close(weights[MeanType.START_X], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights[MeanType.EPSILON] * snr, expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(weights[MeanType.VELOCITY] * (snr + 1), expected, rtol=1e-4, atol=1e-6)


def test_min_snr_weight_enters_the_loss_but_not_the_logged_mse():
    diffusion = create_diffusion(mean_type=MeanType.START_X, learn_sigma=False)
    x0, noise = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8)
    t = torch.tensor([1, 100, 500, 999])
    model = lambda x, t: torch.zeros_like(x)  # noqa: E731
    plain = diffusion.training_losses(model, x0, t, noise=noise)
    weighted = diffusion.training_losses(model, x0, t, noise=noise, min_snr_gamma=5.0)
    torch.testing.assert_close(weighted["mse"], plain["mse"])
    torch.testing.assert_close(weighted["loss"], plain["mse"] * diffusion.min_snr_weight(t, 5.0))
