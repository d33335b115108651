"""MUSE's VQGAN objective (muse-maskgit-pytorch VQGanVAE / VQGanVAETrainer) beside taming's, the family's default:
the adaptive weight measured on the perceptual term's gradient alone, the feature-MSE perceptual term, and the
vqgan-muse preset, read from the built config and task."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from vector_quantize_pytorch import LFQ

from fake_vgg16 import vgg_classifier_state, vgg_state

from genforge.app.config import ConfigError, config_from_dict, load_config
from genforge.app.runs import build_task, make_trainer
from genforge.core.random import BatchRandom
from genforge.families.vqgan.config import VQGANConfig
from genforge.nn import features
from genforge.nn.perceptual import FeatureMSELoss, PerceptualLoss

FC_WIDTH = 8  # the stand-in VGG16's fc6/fc7 (torchvision's: 4096)
MUSE = ("model.gan.adversarial_weight=adaptive_perceptual", "model.gan.weight=1.0")


@pytest.fixture
def small_vgg(tmp_path, monkeypatch):
    """A torchvision-named VGG16 file with a FC_WIDTH-wide classifier: MUSE's VGG16 fc7 feature MSE, cheaply."""
    monkeypatch.setattr(features, "VGG16_FC_WIDTH", FC_WIDTH)
    path = tmp_path / "vgg16.safetensors"
    save_file({**vgg_state(), **vgg_classifier_state(FC_WIDTH)}, str(path))
    return path


def test_the_vqgan_muse_preset_trains_with_muses_objective_on_vqgan_shapes_data_and_model():
    cfg = load_config("vqgan-muse")
    task = build_task(cfg, device="meta")
    model, train = cfg.model, cfg.train
    # MUSE's objective: adversarial weight 1.0 · ‖∇perceptual‖/‖∇g‖ from step 0, the MSE of network features
    assert (model.gan.adversarial_weight, model.gan.weight, model.gan.start_step) == ("adaptive_perceptual", 1.0, 0)
    assert isinstance(task.perceptual, FeatureMSELoss) and task.perceptual.network == "inception"
    assert model.perceptual.weight == 1.0 and model.reconstruction_loss == "l1"
    # LFQ with the seed's diversity_gamma 4 and vector-quantize-pytorch's LFQ weights, 512 codes (9 bits)
    assert isinstance(task.autoencoder.quantizer, LFQ) and task.autoencoder.codebook_size == 512
    q = model.quantizer
    assert (q.diversity_gamma, q.entropy_loss_weight, q.commitment_weight) == (4.0, 0.1, 0.25)
    # VQGanVAETrainer: Adam 3e-4 for both networks, constant, no clipping; its ema_beta 0.995
    for phase in task.phases:
        settings = train.for_phase(phase)
        assert (settings.lr, settings.lr_schedule, settings.warmup_steps, settings.weight_decay) == \
            (3e-4, "constant", 0, 0.0)
        assert settings.grad_clip == 0.0 and settings.ema_decay == 0.995
    # the discriminator and its penalty, the architecture, data, steps and evaluation are vqgan-shapes'
    shapes = load_config("vqgan-shapes")
    different = {"quantizer", "perceptual", "gan"}
    assert model.model_dump(exclude=different) == shapes.model.model_dump(exclude=different)
    gan_keys = {"channels", "num_layers", "penalty", "penalty_weight", "penalty_every", "penalty_inputs"}
    assert model.gan.model_dump(include=gan_keys) == shapes.model.gan.model_dump(include=gan_keys)
    assert cfg.data == shapes.data and cfg.eval == shapes.eval
    assert (train.steps, train.batch_size) == (shapes.train.steps, shapes.train.batch_size)


def test_the_familys_default_objective_stays_tamings(tmp_path):
    """A vqgan config that names no objective, vqgan-shapes, and an old run's config.yaml (no perceptual.distance):
    taming's LPIPS-style perceptual term and 0.1 · ‖∇(rec + perceptual)‖/‖∇g‖."""
    default = VQGANConfig()
    assert (default.perceptual.distance, default.gan.adversarial_weight, default.gan.weight) == \
        ("lpips", "adaptive", 0.1)
    path = tmp_path / "mine.yaml"
    path.write_text("model: {family: vqgan}\ndata: {image_size: 32}\n")
    assert isinstance(build_task(load_config(str(path)), device="meta").perceptual, PerceptualLoss)
    shapes = load_config("vqgan-shapes")
    assert (shapes.model.gan.adversarial_weight, shapes.model.gan.weight) == ("adaptive", 0.1)
    old = load_config("vqgan-debug", ["model.perceptual.weight=1.0"]).model_dump(mode="json")
    del old["model"]["perceptual"]["distance"]  # written before the key existed
    assert config_from_dict(old).model.perceptual.distance == "lpips"


def test_muses_adaptive_weight_needs_a_perceptual_term():
    with pytest.raises(ConfigError, match="adaptive_perceptual .*needs model.perceptual.weight > 0"):
        load_config("vqgan-debug", [*MUSE])  # the debug preset has perceptual weight 0


@pytest.mark.parametrize("objective", ["muse", "taming"])
def test_the_adaptive_weight_is_measured_on_the_perceptual_gradient_alone(small_vgg, objective):
    """The generator loss by hand on the tiny model: rec + w_p·perceptual + quantizer loss + w·λ·g, with MUSE's
    λ = ‖∇_L(w_p·perceptual)‖ / max(‖∇_L g‖, 1e-8) (the reconstruction term's gradient left out) or taming's
    λ = ‖∇_L(rec + w_p·perceptual)‖ / (‖∇_L g‖ + 1e-4), L the decoder's last layer."""
    weight_p = 0.05  # small, so the reconstruction gradient is a large part of taming's nll gradient
    overrides = [f"model.perceptual={{weight: {weight_p}, distance: feature_mse, network: vgg16, "
                 f"weights_path: {small_vgg}, resize: 32}}", "model.quantizer={kind: lfq, codebook_size: 64}"]
    if objective == "muse":
        overrides += MUSE
    cfg = load_config("vqgan-debug", overrides)
    torch.manual_seed(0)
    task = build_task(cfg).train()
    x = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
    rng = BatchRandom(0, 0, 0, 4, 0, 4)
    loss, logs = task.loss({"image": x, "rng": rng}, "generator", 0)

    recon, regulariser, _ = task.autoencode(x, rng, 0)  # the same step, the same pass (deterministic)
    rec = F.l1_loss(recon, x)
    perceptual = weight_p * task.perceptual(recon, x).mean()
    g = -task.discriminator(recon).mean()
    last = task.autoencoder.decoder.conv_out.weight

    def grad_norm(term):
        return torch.autograd.grad(term, last, retain_graph=True)[0].norm()

    if objective == "muse":
        expected = cfg.model.gan.weight * grad_norm(perceptual) / grad_norm(g).clamp(min=1e-8)
        taming = 1.0 * grad_norm(rec + perceptual) / (grad_norm(g) + 1e-4)
        assert taming > 2 * expected  # the reconstruction gradient, left out, matters here
    else:
        expected = cfg.model.gan.weight * grad_norm(rec + perceptual) / (grad_norm(g) + 1e-4)
    torch.testing.assert_close(logs["adaptive_weight"], expected)
    torch.testing.assert_close(loss, rec + perceptual + regulariser + expected * g)
    torch.testing.assert_close(logs["perceptual"], perceptual / weight_p)


def test_a_shrunk_vqgan_muse_trains_and_logs_its_terms(tmp_path, small_vgg):
    """Two steps of the preset (feature MSE, LFQ, adaptive weight on the perceptual gradient) on 16px images with a
    smaller network, and the seed's network, VGG16 (the stand-in: fc7 8 wide, at 32px; Inception's features are
    tested in tests/nn): finite losses, the adaptive weight logged, a checkpoint written."""
    cfg = load_config("vqgan-muse", [
        "model.block_out_channels=[16, 16]", "model.norm_num_groups=8", "model.z_channels=8",
        "model.perceptual.network=vgg16", f"model.perceptual.weights_path={small_vgg}", "model.perceptual.resize=32",
        "model.gan.channels=16", "data.image_size=16", "data.shapes.n=32", "data.num_workers=0", "train.steps=2",
        "train.batch_size=4", "train.log_every=1", "train.sample_every=0", "train.num_samples=4",
        "train.checkpoint_every=0", "eval.every=0", "log.progress=false", "log.tensorboard=false"])
    make_trainer(cfg, tmp_path / "run").fit()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("generator/loss", "generator/adaptive_weight", "generator/perceptual", "discriminator/loss"):
        assert all(torch.isfinite(torch.tensor(r[key])) for r in rows), key
    assert all(r["generator/adaptive_weight"] > 0 for r in rows)
    assert (tmp_path / "run" / "checkpoints" / "step-000002" / "model.safetensors").is_file()
