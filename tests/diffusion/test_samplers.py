"""The sampler registry (one signature, chosen by name), and the two options of DiT's create_diffusion that the
config now reaches: the fixed variance (sigma_small) and the KL losses (use_kl)."""

import inspect

import pytest
import torch
from pydantic import ValidationError

from genforge.app.config import load_config
from genforge.app.runs import build_task
from genforge.core.errors import ConfigError
from genforge.data.loader import build_dataset, data_info
from genforge.diffusion import (SAMPLERS, LossType, MeanType, Sampler, SamplingProcess, VarType,
                                classifier_free_guidance, create_diffusion, sample_ddim, sample_ddpm)
from genforge.diffusion.build import build_diffusion
from genforge.diffusion.config import DiffusionConfig
from genforge.core.config import SampleOptions


def _model(out_channels: int = 3):
    """A small random model x_t, t → [B, out_channels, ...] that uses t (and a label y when given)."""
    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, out_channels, 1)

    def model(x, t, y=None):
        out = torch.tanh(net(x)) + 0.001 * t.view(-1, 1, 1, 1).float()
        return out if y is None else out + 0.1 * y.view(-1, 1, 1, 1).float()

    return model


def test_registry_has_ddpm_and_ddim_with_their_respacing():
    assert list(SAMPLERS) == ["ddpm", "ddim", "euler", "heun", "euler_ancestral", "dpmpp_2m"]
    assert SAMPLERS.get("ddpm") == Sampler("ddpm", sample_ddpm, SAMPLERS.get("ddpm").respacing, discrete=True)
    assert SAMPLERS.get("ddpm").run is sample_ddpm and SAMPLERS.get("ddim").run is sample_ddim
    assert SAMPLERS.get("ddpm").respacing(50) == "50" and SAMPLERS.get("ddim").respacing(50) == "ddim50"
    assert [n for n, e in SAMPLERS.items() if e.discrete] == ["ddpm", "ddim"]
    with pytest.raises(ConfigError, match="allowed: ddpm, ddim, euler"):
        SAMPLERS.get("lms")


def test_every_sampler_has_one_signature_and_a_one_line_docstring():
    signatures = {name: inspect.signature(entry.run) for name, entry in SAMPLERS.items()}
    assert len(set(map(str, signatures.values()))) == 1, signatures
    params = list(signatures["ddpm"].parameters.values())
    assert [p.name for p in params] == ["process", "noise", "generator", "progress", "eta"]
    assert all(p.kind == p.KEYWORD_ONLY for p in params[2:])
    for name, entry in SAMPLERS.items():
        assert entry.run.__doc__ and "\n" not in entry.run.__doc__.strip(), name
    assert "Algorithm 2" in sample_ddpm.__doc__ and "eq. 12" in sample_ddim.__doc__ and "eq. 16" in sample_ddim.__doc__


@pytest.mark.parametrize("learn_sigma", [False, True])
@pytest.mark.parametrize("name,eta", [("ddpm", 0.0), ("ddim", 0.0), ("ddim", 0.7)])
def test_registered_sampler_is_bit_identical_to_the_old_loop(name, eta, learn_sigma):
    """x_T drawn as the loops draw it, then the registered function: the same samples as the loop drawing x_T."""
    sampler = SAMPLERS.get(name)
    diffusion = create_diffusion(sampler.respacing(10), num_timesteps=100, learn_sigma=learn_sigma)
    model = _model(6 if learn_sigma else 3)
    shape, kwargs = (3, 3, 4, 4), {"y": torch.tensor([0, 1, 2])}
    gen = torch.Generator().manual_seed(7)
    x_T = torch.randn(shape, generator=gen, device=gen.device).to("cpu")
    process = SamplingProcess(model, kwargs, clip_denoised=True, diffusion=diffusion)
    new = sampler.run(process, x_T, generator=gen, progress=False, eta=eta)
    loop = diffusion.ddim_sample_loop if name == "ddim" else diffusion.p_sample_loop
    old = loop(model, shape, model_kwargs=kwargs, clip_denoised=True, generator=torch.Generator().manual_seed(7),
               **({"eta": eta} if name == "ddim" else {}))
    assert torch.equal(new, old)
    assert not torch.equal(new, x_T)


def test_config_sampler_is_validated_against_the_registry():
    assert DiffusionConfig(sampler="ddim").sampler == "ddim"
    with pytest.raises(ValidationError, match=r"sampler='lms' is not a registered sampler; allowed: ddpm, ddim"):
        DiffusionConfig(sampler="lms")
    cfg = DiffusionConfig()
    with pytest.raises(ValidationError, match="allowed: ddpm, ddim"):
        cfg.sampler = "lms"  # assignments are validated too


@pytest.mark.parametrize("name,steps", [("ddpm", 50), ("ddim", 50), ("ddpm", 7), ("ddim", 7)])
def test_build_respaces_as_the_sampler_says(name, steps):
    built = build_diffusion(DiffusionConfig(sampler=name, num_timesteps=1000), sample_steps=steps)
    expected = create_diffusion("ddim" + str(steps) if name == "ddim" else str(steps))  # the old switch
    assert torch.equal(built.timestep_map, expected.timestep_map) and built.num_timesteps == steps
    assert build_diffusion(DiffusionConfig(sampler=name)).num_timesteps == 1000  # training: all steps


# ------------------------------------------------------------------------------------ DiT's sample


@pytest.fixture(scope="module", params=["dit-debug", "dit-latent-debug"])
def dit_task(request):
    torch.manual_seed(0)
    cfg = load_config(request.param)
    task = build_task(cfg, data_info(build_dataset(cfg.data), cfg.data))
    with torch.no_grad():  # adaLN-Zero starts at an output of exactly 0: perturb it into a model that does something
        for p in task.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return task.eval()


@pytest.mark.parametrize("name,eta", [("ddpm", 0.0), ("ddim", 0.0), ("ddim", 1.0)])
def test_dit_sample_is_bit_identical_to_the_old_call_path(dit_task, name, eta):
    """DiffusionTask.sample (x_T drawn by the task, sampler looked up by name) against the old switch over the loops."""
    task, d = dit_task, dit_task.cfg.diffusion
    task.cfg.diffusion = d.model_copy(update={"ddim_eta": eta})
    try:
        options = task.resolve(SampleOptions(sampler=name))
        cond = task.sample_conditions(3, torch.Generator().manual_seed(0), options)
        new = task.sample(cond, torch.Generator().manual_seed(11), 3, options)
        # the old path: respacing switched on the name, the loop drawing x_T itself
        respacing = f"ddim{d.sample_steps}" if name == "ddim" else str(d.sample_steps)
        diffusion = create_diffusion(respacing, noise_schedule=d.noise_schedule, num_timesteps=d.num_timesteps,
                                     mean_type={"eps": MeanType.EPSILON, "x0": MeanType.START_X,
                                                "v": MeanType.VELOCITY}[d.prediction],
                                     learn_sigma=d.learn_sigma, loss_type=LossType.MSE)
        shape = (3, task.channels, task.input_size, task.input_size)
        model_fn, kwargs = task.model, {}
        if task.num_classes:
            kwargs = {"y": cond["label"]}
            null = {"y": torch.full_like(kwargs["y"], task.model.y_embedder.null_id)}
            model_fn = classifier_free_guidance(task.model, d.cfg_scale, null, out_channels=task.channels)
        clip, gen = task.latent_codec is None, torch.Generator().manual_seed(11)
        if name == "ddim":
            x = diffusion.ddim_sample_loop(model_fn, shape, model_kwargs=kwargs, clip_denoised=clip, generator=gen,
                                           eta=eta)
        else:
            x = diffusion.p_sample_loop(model_fn, shape, model_kwargs=kwargs, clip_denoised=clip, generator=gen)
        old = (task.latent_codec.decode(x) if task.latent_codec else x).clamp(-1, 1)
    finally:
        task.cfg.diffusion = d
    assert torch.equal(new, old)
    assert new.std() > 0


# ------------------------------------------------------------------------------- fixed variance


def test_fixed_variance_large_gives_beta_t_and_small_the_posterior_variance():
    x, t = torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 37, 99])
    model = _model(3)
    large = build_diffusion(DiffusionConfig(num_timesteps=100, learn_sigma=False, fixed_variance="large"))
    small = build_diffusion(DiffusionConfig(num_timesteps=100, learn_sigma=False))
    assert large.var_type == VarType.FIXED_LARGE and small.var_type == VarType.FIXED_SMALL
    out_large, out_small = large.p_mean_variance(model, x, t), small.p_mean_variance(model, x, t)
    betas = large.coefs["betas"]
    for i, step in enumerate(t.tolist()):  # log β_t, with β̃_1 at t = 0 (IDDPM's choice for the decoder)
        expected = large.coefs["posterior_log_variance_clipped"][0] if step == 0 else torch.log(betas[step])
        torch.testing.assert_close(out_large["log_variance"][i], torch.full((3, 2, 2), expected.item()))
        torch.testing.assert_close(out_small["log_variance"][i],
                                   torch.full((3, 2, 2), small.coefs["posterior_log_variance_clipped"][step].item()))
    assert (out_large["log_variance"][1:] > out_small["log_variance"][1:]).all()  # β_t > β̃_t for t ≥ 1
    torch.testing.assert_close(out_large["mean"], out_small["mean"])  # the variance choice leaves the mean alone


def test_create_diffusion_fixed_variance():
    assert create_diffusion(learn_sigma=False).var_type == VarType.FIXED_SMALL  # today's default
    assert create_diffusion(learn_sigma=False, fixed_variance="large").var_type == VarType.FIXED_LARGE
    assert create_diffusion(learn_sigma=True, fixed_variance="large").var_type == VarType.LEARNED_RANGE
    with pytest.raises(ValueError, match="fixed_variance"):
        create_diffusion(learn_sigma=False, fixed_variance="medium")
    with pytest.raises(ValidationError):
        DiffusionConfig(fixed_variance="medium")


# ------------------------------------------------------------------------------------ KL losses


@pytest.mark.parametrize("learn_sigma", [False, True])
def test_kl_loss_is_the_vlb_term_and_rescaled_kl_that_times_T(learn_sigma):
    T = 100
    model = _model(6 if learn_sigma else 3)
    x0 = torch.rand(8, 3, 4, 4) * 2 - 1
    t = torch.tensor([0, 1, 5, 20, 50, 70, 98, 99])
    noise = torch.randn_like(x0)
    kl = build_diffusion(DiffusionConfig(num_timesteps=T, learn_sigma=learn_sigma, loss="kl"))
    rescaled = build_diffusion(DiffusionConfig(num_timesteps=T, learn_sigma=learn_sigma, loss="rescaled_kl"))
    assert kl.loss_type == LossType.KL and rescaled.loss_type == LossType.RESCALED_KL
    x_t = kl.q_sample(x0, t, noise)
    vb = kl.vb_terms_bpd(model, x0, x_t, t, clip_denoised=False)["output"]
    terms = kl.training_losses(model, x0, t, noise=noise)
    assert set(terms) == {"loss"} and torch.equal(terms["loss"], vb)
    torch.testing.assert_close(rescaled.training_losses(model, x0, t, noise=noise)["loss"], vb * T)
    mse = build_diffusion(DiffusionConfig(num_timesteps=T, learn_sigma=learn_sigma)).training_losses(model, x0, t, noise=noise)
    assert "mse" in mse and not torch.equal(mse["loss"], vb)


# ------------------------------------------------------------------------------------- defaults


def test_defaults_are_unchanged():
    cfg = DiffusionConfig()
    assert cfg.model_dump() == {
        "num_timesteps": 1000, "noise_schedule": "linear", "prediction": "eps", "learn_sigma": True,
        "fixed_variance": "small", "loss": "mse", "min_snr_gamma": None, "timestep_sampling": "uniform",
        "timestep_mean": 0.0, "timestep_std": 1.0, "sampler": "ddpm", "sample_steps": 250, "ddim_eta": 0.0,
        "cfg_scale": 4.0, "objective": "ddpm", "flow_shift": 1.0, "sigma_data": 0.5, "p_mean": -1.2, "p_std": 1.2,
        "rho": 7.0, "guidance_channels": None, "guidance_interval": None, "dynamic_threshold": None,
    }
    d = build_diffusion(cfg)
    assert (d.var_type, d.loss_type, d.mean_type) == (VarType.LEARNED_RANGE, LossType.MSE, MeanType.EPSILON)
    assert build_diffusion(DiffusionConfig(learn_sigma=False)).var_type == VarType.FIXED_SMALL
