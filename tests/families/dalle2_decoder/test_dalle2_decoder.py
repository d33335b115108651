"""dalle2_decoder: the family contract, the cascade trained in part, guidance, the low-resolution conditioning path,
learned variance under bf16 and the config checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from family_contract import FamilyContract
from tiny_clip import pretrained_clip_folder
from PIL import Image
from safetensors.torch import load_file
from typer.testing import CliRunner

from genforge.app.config import load_config
from genforge.app.runs import build_task, make_trainer
from genforge.cli import app
from genforge.core.random import BatchRandom
from genforge.engine.validation import validation_loss
from genforge.families.dalle2_decoder.model import gaussian_blur
from genforge.families.dalle2_decoder.task import AUGMENTATION_STEPS
from genforge.families.dalle2_decoder.config import Dalle2SampleOptions

PRESET = "dalle2-decoder-debug"


class TestContract(FamilyContract):
    preset = PRESET


class TestContractOneStage(FamilyContract):
    """Only the second stage trains (the first stays as built)."""

    preset = PRESET
    overrides = ("model.train_unets=[2]",)


def _task(*overrides: str):
    torch.manual_seed(0)
    cfg = load_config(PRESET, list(overrides))
    return cfg, build_task(cfg)


def _checkpoint(run: Path, step: int) -> tuple[dict, dict]:
    folder = run / "checkpoints" / f"step-{step:06d}"
    return load_file(str(folder / "model.safetensors")), load_file(str(folder / "ema.safetensors"))


def test_training_stage_2_leaves_stage_1_unchanged(tmp_path):
    """Train both stages, then resume the run training only unet2: unet1's weights, EMA and optimizer state are
    bit-for-bit those of before; unet2's moved."""
    base = ["train.checkpoint_every=2", "train.sample_every=0", "train.log_every=1"]
    make_trainer(load_config(PRESET, [*base, "train.steps=2"]), tmp_path).fit()
    make_trainer(load_config(PRESET, [*base, "train.steps=4", "model.train_unets=[2]"]), tmp_path).fit()
    (model_2, ema_2), (model_4, ema_4) = _checkpoint(tmp_path, 2), _checkpoint(tmp_path, 4)
    stage_1 = [k for k in model_2 if k.startswith("cascade.unets.0.")]
    stage_2 = [k for k in model_2 if k.startswith("cascade.unets.1.")]
    assert stage_1 and stage_2
    assert all(torch.equal(model_2[k], model_4[k]) for k in stage_1)
    assert all(torch.equal(ema_2[k], ema_4[k]) for k in stage_1 if k in ema_2)
    assert any(k in ema_2 for k in stage_1)  # stage 1's EMA is kept, not dropped
    assert not all(torch.equal(model_2[k], model_4[k]) for k in stage_2)
    assert not all(torch.equal(ema_2[k], ema_4[k]) for k in stage_2)
    optim_2, optim_4 = (tmp_path / "checkpoints" / f"step-00000{s}" / "optim" for s in (2, 4))
    assert (optim_2 / "unet1.safetensors").read_bytes() == (optim_4 / "unet1.safetensors").read_bytes()


def test_phases_get_their_own_optimizer_settings(tmp_path):
    """train.phases.unet2 (lr 2e-3, clip 0.5 in the preset) reaches unet2's optimizer only (the train section's clip
    set to 1.0 here: the family's default is 0.5 too)."""
    trainer = make_trainer(load_config(PRESET, ["train.steps=1", "train.grad_clip=1.0"]), tmp_path)
    assert {g["lr"] for g in trainer.state.optimizers["unet1"].param_groups} == {1e-3}
    assert {g["lr"] for g in trainer.state.optimizers["unet2"].param_groups} == {2e-3}
    assert trainer.phase_train["unet2"].grad_clip == 0.5 and trainer.phase_train["unet1"].grad_clip == 1.0


def test_unknown_phase_in_train_phases_exits_2(tmp_path):
    out = CliRunner().invoke(app, ["train", PRESET, "--set", "train.phases.unet3.lr=0.1", "--run-dir",
                                   str(tmp_path / "run")])
    assert out.exit_code == 2 and "train.phases.unet3" in out.stderr


@pytest.mark.parametrize("override, field", [
    ("model.stages.1.image_size=8", "image sizes"),
    ("model.train_unets=[3]", "model.train_unets"),
    ("data.image_size=32", "data.image_size"),
    ("model.embedder.source=clip_run", "model.embedder.path"),
    ("model.stages.0.conditioned=false", "model.stages[0].conditioned"),
    ("model.text_phase=3", "model.text_phase"),
])
def test_bad_config_exits_2_naming_the_field(tmp_path, override, field):
    out = CliRunner().invoke(app, ["train", PRESET, "--dry-run", "--set", override, "--run-dir", str(tmp_path)])
    assert out.exit_code == 2 and field in out.stderr, out.stderr


def _perturb(task) -> None:
    """Random weights everywhere (a fresh U-Net outputs exactly zero: its last convolutions start at zero)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in task.cascade.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))


def _forwards(unet) -> list[dict]:
    """Record the batch size and conditioning kwargs of every forward of `unet`."""
    calls = []
    unet.register_forward_pre_hook(lambda m, args, kwargs: calls.append({"batch": len(args[0]), **kwargs}),
                                   with_kwargs=True)
    return calls


def test_guidance_applies_to_the_conditioned_stages_and_not_to_the_unconditional_upsampler():
    """The base stage is guided (a scale changes its samples); the paper's upsampler (the default: unconditional) is
    sampled with one forward of the batch per step, no null branch, whatever the scale, and reports scale 1."""
    cfg, task = _task()
    _perturb(task)
    task.eval()
    cond = task.sample_conditions(3, torch.Generator().manual_seed(0), task.resolve())
    outs = {scale: task.sample(cond, torch.Generator().manual_seed(0), 3,
                               task.resolve(Dalle2SampleOptions(cfg_scale=scale))) for scale in (1.0, 4.0)}
    assert not torch.equal(outs[1.0], outs[4.0])
    assert task.sampler_settings(task.resolve(Dalle2SampleOptions(cfg_scale=4.0)))["cfg_scale"] == [4.0, 1.0]
    calls = _forwards(task.cascade[1])
    up = {scale: task.sample(cond, torch.Generator().manual_seed(0), 3,
                             task.resolve(Dalle2SampleOptions(cfg_scale=scale, start_stage=2)))
          for scale in (1.0, 4.0)}
    assert torch.equal(up[1.0], up[4.0])
    steps = cfg.model.stages[1].diffusion.sample_steps
    assert len(calls) == 2 * steps and all(c["batch"] == 3 for c in calls)  # one forward of the batch per step
    assert all(set(c) == {"batch", "lowres", "lowres_noise_level"} for c in calls)
    base = task.sample(cond, torch.Generator().manual_seed(0), 3, task.resolve(Dalle2SampleOptions(stop_stage=1)))
    assert base.shape[-1] == cfg.model.stages[0].image_size


def test_a_conditioned_upsampler_remains_a_choice_and_is_guided():
    """model.stages[1].conditioned=true (the behaviour before the paper's defaults): the upsampler takes the
    embedding and is guided, from a real low-resolution image too."""
    cfg, task = _task("model.stages.1.conditioned=true")
    _perturb(task)
    task.eval()
    assert task.cascade[1].image_embed_dim == cfg.model.embedder.grid ** 2 * 3
    cond = task.sample_conditions(3, torch.Generator().manual_seed(0), task.resolve())
    assert task.sampler_settings(task.resolve(Dalle2SampleOptions(cfg_scale=4.0)))["cfg_scale"] == [4.0, 4.0]
    calls = _forwards(task.cascade[1])
    up = {scale: task.sample(cond, torch.Generator().manual_seed(0), 3,
                             task.resolve(Dalle2SampleOptions(cfg_scale=scale, start_stage=2)))
          for scale in (1.0, 4.0)}
    assert not torch.equal(up[1.0], up[4.0])
    assert {c["batch"] for c in calls} == {3, 6}  # unguided at scale 1, both branches in one batch at 4


def test_gaussian_blur_keeps_the_mean_and_shrinks_white_noise_by_the_kernel_energy():
    noise = torch.randn(3, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.0, 0.5, 1.0])
    blurred = gaussian_blur(noise + 0.3, sigma, kernel=5)
    assert torch.allclose(blurred[0], noise[0] + 0.3)  # σ = 0: unchanged
    for b, s in enumerate(sigma.tolist()[1:], start=1):
        w = torch.exp(-torch.arange(-2.0, 3.0) ** 2 / (2 * s * s))
        w = w / w.sum()
        expected = float((w**2).sum()) ** 2  # separable: the 2-D kernel's energy is the 1-D one's squared
        inner = blurred[b, :, 4:-4, 4:-4]
        assert abs(inner.mean().item() - 0.3) < 0.01
        assert inner.var().item() == pytest.approx(expected, rel=0.05)


def test_lowres_input_is_the_blurred_image_noised_to_the_given_level():
    """With CDM's noise augmentation on: x_aug = √ᾱ_t·blur(resize(x)) + √(1 − ᾱ_t)·ε at the level t the U-Net is
    told."""
    cfg, task = _task("model.stages.1.lowres_noise_max=0.2")
    image = torch.rand(64, 3, 16, 16) * 2 - 1
    noise = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    level = torch.full((64,), 400)
    out = task.lowres_input(image, 1, noise, level, sigma=torch.zeros(64))
    ac = task.augmentation.coefs["alphas_cumprod"][400].item()
    clean = torch.nn.functional.interpolate(image, size=(8, 8), mode="bilinear", antialias=True)
    residual = (out["lowres"] - math.sqrt(ac) * clean) / math.sqrt(1 - ac)
    assert torch.allclose(residual, noise, atol=1e-5)
    assert torch.equal(out["lowres_noise_level"], level.float())
    # in training the level is drawn in [0, lowres_noise_max · 1000)
    batch = {"image": image[:8], "rng": BatchRandom(0, 0, 1, 8, 0, 8)}
    batch["label"] = torch.zeros(8, dtype=torch.long)
    loss, _ = task.loss(batch, "unet2", 0)
    assert torch.isfinite(loss)
    assert cfg.model.stages[1].lowres_noise_max * AUGMENTATION_STEPS <= AUGMENTATION_STEPS


def test_learned_variance_loss_is_finite_under_bf16_autocast():
    """Stage 1 learns its variance (IDDPM hybrid loss): under bf16 autocast every timestep, t = 0 (the discretised
    decoder likelihood) and t = T − 1 included, gives a finite loss and finite gradients."""
    cfg, task = _task()
    _perturb(task)
    stage = cfg.model.stages[0]
    assert stage.diffusion.learn_sigma
    objective = task.objectives[0]
    x0 = torch.rand(8, 3, 8, 8) * 2 - 1
    t = torch.tensor([0, 1, 2, 10, 50, 97, 98, 99])
    noise = torch.randn_like(x0)
    kwargs = {"image_embed": torch.nn.functional.normalize(torch.randn(8, 12), dim=-1),
              "image_keep": torch.ones(8, dtype=torch.bool)}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        terms = objective.training_losses(task.cascade[0], x0, t, noise, model_kwargs=kwargs)
    assert torch.isfinite(terms["loss"]).all() and torch.isfinite(terms["vb"]).all()
    terms["loss"].mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in task.cascade[0].parameters() if p.grad is not None)


def test_validation_loss_is_logged_and_keeps_the_best_checkpoint(tmp_path):
    """eval.val_loss_batches: the held-out loss of each phase at every evaluation, written with the eval results
    and usable as train.keep_best (lower is better)."""
    overrides = ["train.steps=4", "train.checkpoint_every=2", "train.sample_every=0", "eval.every=2",
                 "eval.metrics=[]", "eval.val_loss_batches=2", "train.keep_best=val_loss", "train.keep_best_mode=min"]
    trainer = make_trainer(load_config(PRESET, overrides), tmp_path)
    trainer.fit()
    results = [json.loads((tmp_path / "eval" / f"{s}.json").read_text()) for s in (2, 4)]
    for r in results:
        assert {"val/unet1/loss", "val/unet2/loss", "val_loss"} <= set(r)
        assert r["val_loss"] == pytest.approx(r["val/unet1/loss"] + r["val/unet2/loss"])
    best = json.loads((tmp_path / "checkpoints" / "best").read_text())
    assert best["value"] == pytest.approx(min(r["val_loss"] for r in results))
    cfg = load_config(PRESET, overrides)
    again = [validation_loss(trainer.task, cfg.data, cfg.train, 2, trainer.state.step, trainer.accelerator)
             for _ in range(2)]
    assert again[0] == again[1]  # fixed noise and data: the same weights give the same value
    bad = CliRunner().invoke(app, ["train", PRESET, "--dry-run", "--set", "train.keep_best=val_loss", "--set",
                                   "eval.every=2", "--set", "train.keep_best_mode=min"])
    assert bad.exit_code == 2 and "val_loss: with eval.val_loss_batches" in bad.stderr


def test_a_pretrained_clip_checkpoint_drives_the_decoder(tmp_path):
    """model.embedder.source=clip_pretrained: a local CLIPModel's unit-norm image embeddings condition the cascade,
    its text tower serves --prompt, and its weights stay out of the decoder's checkpoint."""
    clip_dir = pretrained_clip_folder(tmp_path / "clip")
    overrides = ["model.embedder.source=clip_pretrained", f"model.embedder.path={clip_dir}", "train.steps=2",
                 "train.checkpoint_every=2", "train.sample_every=0"]
    make_trainer(load_config(PRESET, overrides), tmp_path / "run").fit()
    model, _ = _checkpoint(tmp_path / "run", 2)
    assert not any(k.startswith("embedder.") for k in model)
    cfg, task = _task(*overrides)
    embeds = task.embed_images(torch.rand(3, 3, 16, 16) * 2 - 1)
    assert embeds.shape == (3, 24) and torch.allclose(embeds.norm(dim=-1), torch.ones(3), atol=1e-5)
    task.eval()
    cond = task.sample_conditions(2, torch.Generator().manual_seed(0),
                                  task.resolve(Dalle2SampleOptions(prompt="a red circle")))
    assert cond["image_embed"].shape == (2, 24)
    assert task.sample(cond, torch.Generator().manual_seed(0), 2, task.resolve()).shape == (2, 3, 16, 16)


def test_sample_cli_makes_variations_of_an_image_and_runs_part_of_the_cascade(tmp_path):
    run = tmp_path / "run"
    make_trainer(load_config(PRESET, ["train.steps=2", "train.checkpoint_every=2", "train.sample_every=0"]),
                 run).fit()
    photo = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(0).random((40, 30, 3)) * 255).astype(np.uint8)).save(photo)
    runner = CliRunner()
    out = runner.invoke(app, ["sample", str(run), "--image", str(photo), "--n", "4", "--out", str(tmp_path / "v.png"),
                              "--cfg-scale", "3"])
    assert out.exit_code == 0, out.output
    assert Image.open(tmp_path / "v.png").size[0] > 0 and '"cfg_scale": [3.0, 1.0]' in out.stdout
    out = runner.invoke(app, ["sample", str(run), "--image", str(photo), "--n", "2", "--start-stage", "2",
                              "--out", str(tmp_path / "up.png")])
    assert out.exit_code == 0 and '"start_stage": 2' in out.stdout
    out = runner.invoke(app, ["sample", str(run), "--n", "2", "--stop-stage", "3"])
    assert out.exit_code == 2 and "--stop-stage 3" in out.stderr
    out = runner.invoke(app, ["sample", str(run), "--n", "2", "--prompt", "a red circle"])
    assert out.exit_code == 2 and "--prompt needs --prior" in out.stderr  # the pooled stand-in has no text tower
    out = runner.invoke(app, ["sample", str(run), "--image", str(tmp_path / "missing.png")])
    assert out.exit_code == 2 and "--image" in out.stderr


def test_image_option_does_not_apply_to_other_families(tmp_path):
    make_trainer(load_config("dit-debug", ["train.steps=1", "train.sample_every=0"]), tmp_path / "dit").fit()
    out = CliRunner().invoke(app, ["sample", str(tmp_path / "dit"), "--image", "x.png"])
    assert out.exit_code == 2 and "--image does not apply to a 'diffusion' model" in out.stderr


def test_clip_run_encode_then_decoder_on_the_cache(tmp_path):
    """The offline DALL·E 2 path: a clip run -> `genforge encode` (image + embedding per record) -> the decoder on
    the cache, checked against the clip run's weights; a cache of another clip checkpoint is refused."""
    make_trainer(load_config("clip-debug", ["train.steps=2", "train.checkpoint_every=2"]), tmp_path / "clip").fit()
    runner = CliRunner()
    out = runner.invoke(app, ["encode", str(tmp_path / "clip"), "--out", str(tmp_path / "cache"), "--flip"])
    assert out.exit_code == 0, out.output
    decoder = ["model.embedder.source=clip_run", f"model.embedder.path={tmp_path / 'clip'}", "data.source=cache",
               f"data.path={tmp_path / 'cache'}", "train.steps=2", "train.checkpoint_every=2", "train.sample_every=2"]
    make_trainer(load_config(PRESET, decoder), tmp_path / "decoder").fit()
    assert (tmp_path / "decoder" / "samples" / "step-000002.png").is_file()
    make_trainer(load_config("clip-debug", ["train.steps=4", "train.checkpoint_every=2"]), tmp_path / "clip").fit()
    out = runner.invoke(app, ["train", PRESET, "--dry-run", *sum((["--set", o] for o in decoder), [])])
    assert out.exit_code == 2 and "another tokenizer checkpoint" in out.stderr
