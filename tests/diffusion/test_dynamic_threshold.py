"""Dynamic thresholding of x̂₀ (Imagen, Saharia et al. 2022 §2.3): the percentile clip on known tensors, and every
sampler that clips x̂₀ of pixel data applies it when `model.diffusion.dynamic_threshold` is set."""

import pytest
import torch

from genforge.diffusion import SAMPLERS, DDPMObjective, EDMObjective, FlowObjective, clip_x0, create_diffusion
from genforge.diffusion.build import sampling_process
from genforge.core.config import OnResume, on_resume
from genforge.diffusion.config import DiffusionConfig

# two samples of 9 values each: |A| sorted is 0, .5, .5, 1, 1, 2, 2, 3, 4; |B| sorted is .1, .2, .3, .4, .5, .8, .9,
# 1.5, 3
A = [-4.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0]
B = [0.9, -0.8, 0.1, 0.2, -0.3, 0.4, 0.5, 1.5, -3.0]


def test_percentile_clip_of_a_known_tensor():
    x0 = torch.tensor([A, B]).view(2, 1, 3, 3)
    # p = 0.75: the quantile sits on the 7th smallest |x̂₀| (position 0.75·8 = 6): s_A = 2, s_B = max(0.9, 1) = 1
    out = clip_x0(x0, 0.75).view(2, 9)
    assert out[0].tolist() == [-1.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 1.0]  # clamp to ±2, then / 2
    assert out[1].tolist() == torch.tensor(B).clamp(-1, 1).tolist()  # s = 1: the static clip
    # p = 0.8125: position 6.5, halfway between 2 and 3: s_A = 2.5
    out = clip_x0(x0, 0.8125).view(2, 9)
    assert torch.equal(out[0], torch.tensor(A).clamp(-2.5, 2.5) / 2.5)
    assert out[0].max().item() == 1.0 and out[0].min().item() == -1.0
    # p = 1: the largest |x̂₀| — the sample is scaled into [-1, 1] without clipping anything
    assert torch.equal(clip_x0(x0, 1.0).view(2, 9)[0], torch.tensor(A) / 4)
    # None: the static clip
    assert torch.equal(clip_x0(x0), x0.clamp(-1, 1))


def test_percentile_is_torch_quantiles_linear_interpolation_per_sample():
    x0 = 3 * torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    for p in (0.5, 0.9, 0.95, 0.995):
        s = torch.quantile(x0.abs().flatten(1), p, dim=1).clamp_min(1).view(-1, 1, 1, 1)
        torch.testing.assert_close(clip_x0(x0, p), x0.clamp(-s, s) / s, rtol=1e-5, atol=1e-5)


def _saturated_x0(shape=(2, 3, 8, 8)):
    """A fixed x̂₀ well outside [-1, 1] (what a large guidance scale produces)."""
    return 3 * torch.randn(shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_every_sampler_thresholds_x0_of_pixel_data(sampler):
    """A model predicting a fixed saturated x̂₀ (prediction x0): every sampler ends on x̂₀ as clipped at its last
    step, so its output is the dynamically thresholded x̂₀ with `dynamic_threshold`, the clipped one without, and the
    raw one for latents (clip=False)."""
    target = _saturated_x0()

    def model(x, t):
        return target

    outs = {}
    for threshold, clip in [(0.9, True), (None, True), (0.9, False)]:
        cfg = DiffusionConfig(num_timesteps=100, prediction="x0", learn_sigma=False, sampler=sampler,
                              dynamic_threshold=threshold)
        process = sampling_process(cfg, model=model, model_kwargs={}, channels=3, clip=clip, sampler=sampler, steps=5,
                                   cfg_scale=1.0, null_kwargs=None)
        assert process.dynamic_threshold == threshold
        gen = torch.Generator().manual_seed(0)
        noise = torch.randn(target.shape, generator=gen)
        outs[threshold, clip] = SAMPLERS.get(sampler).run(process, noise, generator=gen, progress=False)
    torch.testing.assert_close(outs[0.9, True], clip_x0(target, 0.9), rtol=0, atol=1e-4)
    torch.testing.assert_close(outs[None, True], target.clamp(-1, 1), rtol=0, atol=1e-4)
    torch.testing.assert_close(outs[0.9, False], target, rtol=0, atol=1e-4)
    assert (outs[0.9, True] - target.clamp(-1, 1)).abs().max() > 0.1  # not the static clip


@pytest.mark.parametrize("objective", [DDPMObjective(create_diffusion("", num_timesteps=100, learn_sigma=False),
                                                     lambda rng: None), FlowObjective(), EDMObjective()])
def test_every_objectives_denoiser_thresholds_when_it_clips(objective):
    def model(x, t):
        return 4 * torch.tanh(x) + 0.01 * t.view(-1, 1, 1, 1)

    x, sigma = 2 * _saturated_x0(), torch.tensor([0.5, 3.0])
    raw = objective.denoiser(model, {}, 3)(x, sigma)
    torch.testing.assert_close(objective.denoiser(model, {}, 3, True, 0.95)(x, sigma), clip_x0(raw, 0.95))
    torch.testing.assert_close(objective.denoiser(model, {}, 3, True)(x, sigma), raw.clamp(-1, 1))


def test_the_key_is_a_quantile_and_sampling_only():
    with pytest.raises(ValueError):
        DiffusionConfig(dynamic_threshold=1.5)
    with pytest.raises(ValueError):
        DiffusionConfig(dynamic_threshold=0.0)
    assert on_resume(DiffusionConfig, "dynamic_threshold") is OnResume.CHANGE
