"""Latent DiT on a trained klvae run: the posterior mean (the default, as genforge encode caches it) or a sample of
the posterior per step (model.latent.sample_posterior, DiT's `vae.encode(x).latent_dist.sample() * 0.18215`),
its noise from the batch's random stream."""

import pytest
import torch

from genforge.app.config import ConfigError, load_config
from genforge.app.runs import build_task, make_trainer
from genforge.core.random import BatchRandom


@pytest.fixture(scope="module")
def klvae_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("klvae")
    torch.manual_seed(0)
    make_trainer(load_config("klvae-debug", ["train.steps=1", "train.checkpoint_every=1", "train.sample_every=0",
                                             "eval.every=0"]), run_dir).fit()
    return run_dir


def latent_dit(run_dir, *overrides):
    torch.manual_seed(0)
    return build_task(load_config("dit-latent-debug", [f"model.latent={{codec: tokenizer, tokenizer: {run_dir}}}",
                                                       *overrides]))


def images(n=4):
    return torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1


def test_the_default_is_the_posterior_mean_with_no_draw(klvae_run):
    task = latent_dit(klvae_run)
    rng = BatchRandom(0, 3, 0, 4, 0, 4)
    with torch.no_grad():
        x = task.to_model_space({"image": images(), "rng": rng})
        assert torch.equal(x, task.latent_codec.encode(images())) and rng.draws == 0


def test_sample_posterior_is_mean_plus_std_times_the_batch_streams_noise(klvae_run):
    task = latent_dit(klvae_run, "model.latent.sample_posterior=true")
    with torch.no_grad():
        mean, std = task.latent_codec.encode_moments(images())
        torch.manual_seed(123)  # the global RNG plays no part
        x = task.to_model_space({"image": images(), "rng": BatchRandom(0, 3, 0, 4, 0, 4)})
        noise = BatchRandom(0, 3, 0, 4, 0, 4).randn(*mean.shape[1:])
        torch.testing.assert_close(x, mean + std * noise, rtol=0, atol=0)
        assert not torch.allclose(x, mean)
        part = task.to_model_space({"image": images()[2:], "rng": BatchRandom(0, 3, 0, 4, 2, 2)})
        torch.testing.assert_close(part, x[2:])  # rows 2..3 alone draw the same noise (split-invariant)
        other = task.to_model_space({"image": images(), "rng": BatchRandom(0, 4, 0, 4, 0, 4)})
        assert not torch.allclose(other, x)  # a new sample every step
    rng = BatchRandom(0, 3, 0, 4, 0, 4)
    loss, _ = task.loss({"image": images(), "label": torch.arange(4) % 2, "rng": rng}, "main", 3)
    assert torch.isfinite(loss) and rng.draws >= 3  # the posterior's draw, then the objective's


@pytest.mark.parametrize("overrides", [
    ["model.latent={codec: space_to_depth, sample_posterior: true}"],
    ["model.latent={codec: tokenizer, tokenizer: runs/none, sample_posterior: true}", "data.source=cache",
     "data.path=caches/none"],
])
def test_sample_posterior_needs_a_tokenizer_and_images(overrides):
    with pytest.raises(ConfigError, match=r"model\.latent\.sample_posterior"):
        load_config("dit-latent-debug", overrides)
