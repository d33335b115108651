import math

import pytest
import torch
from diffusers import AutoencoderKL

from genforge.app.runs import build_task
from genforge.app.config import ConfigError, load_config
from genforge.data.loader import scan_data_info
from genforge.core.random import BatchRandom
from genforge.families.klvae.model import KLAutoencoder
from genforge.core.codec import GaussianLatentCodec, LatentCodec


def build(overrides=()):
    torch.manual_seed(0)
    cfg = load_config("klvae-debug", list(overrides))
    return cfg, build_task(cfg, scan_data_info(cfg.data))


def test_codec_shapes_and_determinism():
    cfg, task = build()
    codec = task.codec()
    assert isinstance(codec, LatentCodec) and codec.downsample == 2 and codec.latent_channels == 4
    image = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        latent = codec.encode(image)
        assert latent.shape == (2, 4, 8, 8)
        assert torch.equal(latent, codec.encode(image))  # the posterior mean: a cache is reproducible
        assert codec.decode(latent).shape == (2, 3, 16, 16)


def test_encode_moments_are_the_posteriors_in_latent_units():
    """mean + std · ε of `encode_moments` is DiT's vae.encode(x).latent_dist.sample() · scale_factor."""
    _, task = build(["model.scale_factor=0.5"])
    codec = task.codec()
    assert isinstance(codec, GaussianLatentCodec)
    image = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        mean, std = codec.encode_moments(image)
        posterior = codec.posterior(image)
        assert torch.equal(mean, codec.encode(image)) and torch.equal(mean, posterior.mean * 0.5)
        assert torch.equal(std, posterior.std * 0.5) and (std > 0).all()
        noise = torch.randn(mean.shape, generator=torch.Generator().manual_seed(0))
        sample = posterior.sample(generator=torch.Generator().manual_seed(0)) * 0.5  # diffusers' own draw
        torch.testing.assert_close(mean + std * noise, sample)


def test_kl_term_is_the_closed_form_and_zero_at_the_prior():
    _, task = build(["model.kl_weight=1.0"])
    with torch.no_grad():
        posterior = task.autoencoder.posterior(torch.zeros(2, 3, 16, 16))
    mean, var, logvar = posterior.mean, posterior.var, posterior.logvar
    expected = 0.5 * (mean.square() + var - 1 - logvar).sum((1, 2, 3))
    torch.testing.assert_close(posterior.kl(), expected)
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    prior = DiagonalGaussianDistribution(torch.zeros(2, 8, 8, 8))  # mean 0, logvar 0: the prior itself
    assert prior.kl().abs().max() < 1e-6


def test_regulariser_is_the_weighted_kl_per_pixel():
    cfg, task = build(["model.kl_weight=0.5"])
    image = torch.rand(4, 3, 16, 16) * 2 - 1
    _, regulariser, logs = task.autoencode(image, BatchRandom(0, 0, 0, 4, 0, 4), 0)
    torch.testing.assert_close(regulariser, 0.5 * logs["kl"] / (3 * 16 * 16))


def test_scale_factor_is_one_over_the_latent_std():
    vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=2)
    codec = KLAutoencoder(vae)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        codec.update_latent_var(torch.randn(64, 2, 4, 4, generator=gen) * 3.0 + 1.0)
    assert codec.scale_factor() == pytest.approx(1 / 3.0, rel=0.03)
    assert KLAutoencoder(vae, scale_factor=0.18215).scale_factor() == 0.18215


def test_training_updates_the_running_latent_variance_and_eval_does_not():
    cfg, task = build()
    batch_rng = BatchRandom(0, 0, 0, 8, 0, 8)
    image = torch.rand(8, 3, 16, 16) * 2 - 1
    task.train()
    task.loss({"image": image, "rng": batch_rng}, "main", 0)
    assert int(task.autoencoder.latent_var_updates) == 1
    task.eval()
    with torch.no_grad():
        task.loss({"image": image, "rng": BatchRandom(0, 0, 0, 8, 0, 8)}, "main", 0)
    assert int(task.autoencoder.latent_var_updates) == 1


def test_loads_a_local_pretrained_autoencoder(tmp_path):
    torch.manual_seed(1)
    vae = AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=4, latent_channels=3,
                        scaling_factor=0.25)
    vae.save_pretrained(tmp_path / "vae", safe_serialization=True)
    cfg, task = build([f"model.pretrained={tmp_path / 'vae'}"])
    assert task.autoencoder.latent_channels == 3 and task.autoencoder.scale_factor() == 0.25
    for name, value in vae.state_dict().items():
        assert torch.equal(task.autoencoder.vae.state_dict()[name], value), name


def test_missing_pretrained_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.pretrained"):
        build([f"model.pretrained={tmp_path / 'nothing'}"])


@pytest.mark.parametrize("overrides, field", [
    (["model.block_out_channels=[16, 30]"], "model.norm_num_groups"),
    (["data.image_size=17"], "data.image_size"),
    (["eval.metrics=[codebook]"], "codebook"),
    (["eval.metrics=[judge]"], "judge"),
    (["data.source=cache", "data.path=x"], "data.source"),
    (["model.gan={num_layers: 3}"], "model.gan.num_layers"),
])
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config("klvae-debug", overrides)


def test_default_metrics_are_the_tokenizer_ones():
    assert load_config("klvae-debug").eval.metrics == ["psnr", "ssim"]
    assert load_config("dit-debug").eval.metrics == ["judge"]
    assert math.isfinite(load_config("klvae-debug").model.kl_weight)


def test_train_then_sample_shows_originals_above_reconstructions(tmp_path):
    """Training previews: originals, EMA and online reconstructions; `genforge sample`: originals and the EMA's."""
    from PIL import Image
    from typer.testing import CliRunner

    from genforge.cli import app

    runner = CliRunner()
    assert runner.invoke(app, ["train", "klvae-debug", "--run-dir", str(tmp_path)]).exit_code == 0
    preview = Image.open(tmp_path / "samples" / "step-000006.png")
    # 4 held-out images in a row, below them their reconstructions by the EMA weights, then by the online weights
    assert preview.size == (2 + 4 * 18, 2 + 3 * 18)
    out = runner.invoke(app, ["sample", str(tmp_path), "--n", "10", "--out", str(tmp_path / "g.png")])
    assert out.exit_code == 0, out.output
    assert Image.open(tmp_path / "g.png").size == (2 + 8 * 18, 2 + 4 * 18)  # 8 + 2 originals, each row doubled
