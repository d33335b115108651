"""C-ViViT's loss as Phenaki sums it (Villegas et al. 2022): L2 + 0.1·L_adv (a fixed weight) + 0.1·L_image-perceptual
+ 1.0·L_video-perceptual (I3D, the file of eval.i3d_weights) + L_VQ, with a 3-D discriminator over whole clips; each
piece on its own, then one step of a `cvivit-paper`-shaped run whose logged terms add up to its loss."""

from __future__ import annotations

import json

import pytest
import torch
from fake_i3d import conv_standin_file
from fake_vgg16 import vgg_file
from typer.testing import CliRunner

from genforge.app.config import ConfigError, load_config
from genforge.app.runs import build_task
from genforge.cli import app
from genforge.core.random import BatchRandom
from genforge.data.loader import build_dataset, data_info
from genforge.nn.discriminator import SpatioTemporalPatchDiscriminator

runner = CliRunner()


@pytest.fixture(scope="module")
def i3d(tmp_path_factory) -> str:
    """A scripted Conv3d stand-in with the I3D file's call signature (tests/fake_i3d.py)."""
    return conv_standin_file(tmp_path_factory.mktemp("i3d"))


def tiny_task(*overrides: str):
    torch.manual_seed(0)
    cfg = load_config("cvivit-debug", list(overrides))
    return build_task(cfg, data_info(build_dataset(cfg.data), cfg.data)).train()


def clips(frames: int = 5) -> torch.Tensor:
    return torch.rand(4, 3, frames, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1


def batch(video: torch.Tensor, step: int = 0, phase: int = 0) -> dict:
    return {"video": video, "rng": BatchRandom(0, step, phase, len(video), 0, len(video))}


DECODER = ("to_first.weight", "to_tubes.weight", "decoder.spatial.0.attn.qkv.weight")


def test_the_video_perceptual_term_reaches_the_decoder_and_its_weight_scales_it(i3d):
    """Weight 2 adds twice the term of weight 1: the losses differ by the logged term, the decoder's gradients by the
    term's own gradient. Image steps (1-frame clips) have no video term; the I3D weights stay out of the task's
    state."""
    video = clips()
    losses, logs, grads = {}, {}, {}
    for weight in (1.0, 2.0):
        task = tiny_task(f"model.video_perceptual.weight={weight}", f"eval.i3d_weights={i3d}", "model.gan=null")
        task.zero_grad()
        losses[weight], logs[weight] = task.loss(batch(video), "main", 0)
        losses[weight].backward()
        parameters = dict(task.autoencoder.named_parameters())
        grads[weight] = {name: parameters[name].grad.clone() for name in DECODER}
    term = logs[1.0]["video_perceptual"]
    assert term > 0 and torch.equal(logs[2.0]["video_perceptual"], term)
    torch.testing.assert_close(losses[2.0] - losses[1.0], term, rtol=1e-4, atol=1e-7)

    task.zero_grad()  # the term alone, on the weight-2 task's (unchanged) weights
    recon = task.autoencode(video, batch(video)["rng"], 0)[0]
    task.video_perceptual(recon, video).mean().backward()
    parameters = dict(task.autoencoder.named_parameters())
    for name in DECODER:
        alone = parameters[name].grad
        assert alone.abs().sum() > 0, name  # the gradient of the I3D term reaches the decoder
        scale = alone.abs().max().item()  # float32 differences of two totals: compared at the gradient's own scale
        torch.testing.assert_close(grads[2.0][name] - grads[1.0][name], alone, rtol=1e-3, atol=1e-3 * scale)

    assert "video_perceptual" not in task.loss(batch(video[:, :, :1]), "main", 0)[1]  # an image step
    assert not [key for key in task.state_dict() if "video_perceptual" in key]


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_a_fixed_adversarial_weight_is_exactly_the_configured_0_1(mode):
    """The generator's total = reconstruction + L_VQ + w·(−E[D(x̂)]): w = gan.weight = 0.1 when fixed, taming's
    0.1·λ when adaptive (cvivit-debug: perceptual off, the adversarial term from step 0)."""
    task = tiny_task(f"model.gan.adversarial_weight={mode}")
    assert task.cfg.gan.weight == 0.1
    loss, logs = task.loss(batch(clips()), "generator", 0)
    adversarial = loss.detach() - logs["reconstruction"] - logs["regulariser"]
    assert logs["generator_adversarial"].abs() > 1e-3
    weight = 0.1 if mode == "fixed" else logs["adaptive_weight"]
    torch.testing.assert_close(adversarial, weight * logs["generator_adversarial"], rtol=1e-5, atol=1e-7)
    assert ("adaptive_weight" in logs) == (mode == "adaptive")
    if mode == "adaptive":
        assert not torch.isclose(logs["adaptive_weight"], torch.tensor(0.1))


def test_the_3d_discriminator_judges_whole_clips_and_trains():
    """gan.discriminator: patch_3d — logits over spatio-temporal patches of the whole clip (also a 1-frame image
    step's), both phases (R1 on clips at the even steps) stay finite for a few optimizer steps and move the weights."""
    task = tiny_task("model.gan.discriminator=patch_3d")
    assert isinstance(task.discriminator, SpatioTemporalPatchDiscriminator)
    video = clips()
    assert task.discriminator(video).shape == (4, 1, 2, 2, 2)  # [B, 1, ceil(5/4), 16/4 - 2, 16/4 - 2]
    assert task.discriminator(video[:, :, :1]).shape == (4, 1, 1, 2, 2)
    optimizers = {phase: torch.optim.AdamW(task.parameters_for(phase), lr=1e-3) for phase in task.phases}
    before = {name: p.detach().clone() for name, p in task.discriminator.named_parameters()}
    seen = set()
    for step in range(3):
        for index, phase in enumerate(task.phases):
            optimizers[phase].zero_grad()
            loss, logs = task.loss(batch(video, step, index), phase, step)
            assert torch.isfinite(loss), (step, phase, logs)
            seen |= {f"{phase}/{key}" for key in logs}
            loss.backward()
            optimizers[phase].step()
        task.end_step(step)
    assert {"generator/generator_adversarial", "discriminator/hinge", "discriminator/r1"} <= seen
    assert all(not torch.equal(p, before[name]) for name, p in task.discriminator.named_parameters())


def test_what_the_paper_s_terms_need_is_checked_with_the_config():
    with pytest.raises(ConfigError, match="model.video_perceptual.weight=1.0 needs eval.i3d_weights"):
        load_config("cvivit-debug", ["model.video_perceptual.weight=1.0"])
    with pytest.raises(ConfigError, match="patch_3d judges whole clips; model.family=vqgan is an image tokenizer"):
        load_config("vqgan-debug", ["model.gan.discriminator=patch_3d"])
    for override in ("model.gan.discriminator=patch_3d", "model.video_perceptual.weight=1.0"):
        with pytest.raises(ConfigError, match="does not take padded clips"):
            load_config("cvivit-debug", [override, "eval.i3d_weights=i3d.pt", "data.video.min_frames=3"])
    defaults = load_config("cvivit-debug").model  # other presets keep today's loss
    assert (defaults.video_perceptual.weight, defaults.gan.discriminator, defaults.gan.adversarial_weight) == \
        (0.0, "patch_2d", "adaptive")
    paper = load_config("cvivit-paper")
    assert (paper.model.reconstruction_loss, paper.model.perceptual.network, paper.model.perceptual.weight,
            paper.model.video_perceptual.weight, paper.model.gan.weight, paper.model.gan.adversarial_weight,
            paper.model.gan.discriminator) == ("mse", "vgg16", 0.1, 1.0, 0.1, "fixed", "patch_3d")
    assert paper.eval.i3d_weights == "/models/i3d_torchscript.pt"


def paper_shaped(run, vgg: str, *more: str) -> list[str]:
    """`genforge train cvivit-paper` at tiny sizes on moving shapes: its losses and their weights as the preset has
    them, one step."""
    sets = ["model.dim=32", "model.patch_size=4", "model.spatial_depth=1", "model.temporal_depth=1",
            "model.num_heads=2", "model.quantizer.codebook_size=64", "model.quantizer.codebook_dim=8",
            "model.quantizer.kmeans_init=false", f"model.perceptual.weights_path={vgg}", "model.gan.channels=8",
            "model.gan.num_layers=2", "model.gan.start_step=0", "data.source=moving_shapes", "data.path=null",
            "data.images=null", "data.image_size=16", "data.video.num_frames=5", "data.num_workers=0",
            "data.shapes.n=16", "train.batch_size=2", "train.precision=no", "train.compile=false", "train.steps=1", "train.log_every=1",
            "train.warmup_steps=0", "train.sample_every=0", "train.checkpoint_every=1", "eval.every=0",
            "log.progress=false", "log.tensorboard=false", *more]
    return ["train", "cvivit-paper", "--run-dir", str(run), *[arg for key in sets for arg in ("--set", key)]]


def test_one_step_of_the_paper_s_loss_logs_each_term_and_its_weighted_sum(tmp_path, i3d, capsys):
    """The generator's logged loss is L2 + 0.1·L_adv + 0.1·L_IP (VGG16) + 1.0·L_VP (I3D) + L_VQ of the logged terms."""
    vgg = vgg_file(tmp_path)
    out = runner.invoke(app, paper_shaped(tmp_path / "run", vgg, f"eval.i3d_weights={i3d}"))
    assert out.exit_code == 0, out.output
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    weights = {"reconstruction": 1.0, "generator_adversarial": 0.1, "perceptual": 0.1, "video_perceptual": 1.0,
               "regulariser": 1.0}
    total = sum(weight * record[f"generator/{term}"] for term, weight in weights.items())
    with capsys.disabled():
        print()
        for term, weight in weights.items():
            print(f"  {weight:>4} x generator/{term:<22} = {weight:>4} x {record[f'generator/{term}']:.6f}")
        print(f"  sum of weighted terms = {total:.6f}; logged generator/loss = {record['generator/loss']:.6f}")
    assert all(record[f"generator/{term}"] != 0 for term in weights) and "generator/adaptive_weight" not in record
    assert record["generator/loss"] == pytest.approx(total, rel=1e-5)


def test_the_paper_preset_without_its_i3d_file_stops_naming_eval_i3d_weights(tmp_path):
    vgg = vgg_file(tmp_path)
    missing = runner.invoke(app, paper_shaped(tmp_path / "a", vgg))  # the preset's /models/i3d_torchscript.pt
    assert missing.exit_code == 2 and "eval.i3d_weights: /models/i3d_torchscript.pt is not a file" in missing.stderr
    unset = runner.invoke(app, paper_shaped(tmp_path / "b", vgg, "eval.i3d_weights=null"))
    assert unset.exit_code == 2 and "model.video_perceptual.weight=1.0 needs eval.i3d_weights" in unset.stderr
    without = runner.invoke(app, paper_shaped(tmp_path / "c", vgg, "model.video_perceptual.weight=0"))
    assert without.exit_code == 0, without.output  # the documented way to train it without the I3D file
