"""How DALL·E 2's upsamplers train (Ramesh et al. 2022, App. C): on random crops with the low-res input cropped
alike, sampled at full size; attention-free unless asked; blur for the first upsampler and BSR degradation for later
ones; and runs written before these defaults keeping theirs."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import genforge

from genforge.app.config import config_from_dict, load_config, to_yaml
from genforge.app.migrations import migrate
from genforge.app.runs import build_task, make_trainer
from genforge.cli import app
from genforge.core.random import BatchRandom
from genforge.nn.unet import AttentionBlock

PRESET = "dalle2-decoder-debug"
CROP = "model.stages.1.crop_fraction=0.5"  # 16 px stage: 8 px crops of 4 px low-res regions
runner = CliRunner()


def _task(*overrides: str):
    torch.manual_seed(0)
    cfg = load_config(PRESET, list(overrides))
    return cfg, build_task(cfg)


def _training_inputs(task, image: torch.Tensor, seed: int = 0) -> dict:
    """What the upsampler's objective gets in one training step: x0 and the U-Net's kwargs."""
    seen = {}
    original = task.objectives[1].training_losses

    def spy(model, x0, time, noise, model_kwargs):
        seen.update(x0=x0, **model_kwargs)
        return original(model, x0, time, noise, model_kwargs=model_kwargs)

    task.objectives[1].training_losses = spy
    n = len(image)
    loss, _ = task.loss({"image": image, "rng": BatchRandom(seed, 0, 1, n, 0, n)}, "unet2", 0)
    assert torch.isfinite(loss)
    return seen


# ------------------------------------------------------------------------------------------------ crops
def test_crops_take_the_same_region_of_the_target_and_of_its_low_res_input():
    """crop_fraction 0.5 of a 16 px stage over 8 px: x0 is an 8 px crop, the low-res input its 4 px region. On an
    image whose channels are its pixel coordinates, each crop's mean coordinate is the same at both sizes; the
    crops differ from row to row and lie inside the image."""
    cfg, task = _task(CROP, "model.stages.1.blur_prob=0", "model.stages.1.lowres_noise_max=0")
    n = 64
    ys, xs = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    image = torch.stack([ys, xs, torch.zeros(16, 16)])[None].repeat(n, 1, 1, 1) / 16  # coordinates / 16
    seen = _training_inputs(task, image)
    x0, low = seen["x0"], seen["lowres"]
    assert x0.shape == (n, 3, 8, 8) and low.shape == (n, 3, 4, 4)
    # (level 0 of the augmentation leaves noise of std √(1 − ᾱ₀) = 0.01 on the low-res input)
    assert torch.allclose(x0[:, :2].mean((2, 3)), low[:, :2].mean((2, 3)), atol=0.03)
    tops = (x0[:, 0, 0, 0] * 16).round()
    assert tops.min() >= 0 and tops.max() <= 8 and len(set(tops.tolist())) > 3
    assert torch.equal(x0[:, 0], x0[:, 0, :, :1].expand(-1, -1, 8))  # whole rows of the image, not resampled


def test_a_crop_trained_upsampler_samples_at_full_size(tmp_path):
    """Trained on 8 px crops (attention-free: an upsampler's default), the 16 px upsampler samples the full 16 px,
    finite, from the CLI."""
    cfg = load_config(PRESET, [CROP, "train.steps=2", "train.checkpoint_every=2", "train.sample_every=0",
                               "eval.every=0"])
    make_trainer(cfg, tmp_path / "run").fit()
    out = tmp_path / "out.png"
    result = runner.invoke(app, ["sample", str(tmp_path / "run"), "--n", "2", "--steps", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    samples = genforge.load_run(tmp_path / "run", device="cpu").sample(n=2, steps=2)
    assert samples.shape == (2, 3, 16, 16) and torch.isfinite(samples).all()


@pytest.mark.parametrize("overrides, says", [
    (["model.stages.0.crop_fraction=0.5"], "model.stages[0].crop_fraction"),  # the base sees whole images
    (["model.stages.1.crop_fraction=0.3"], "model.stages[1].crop_fraction=0.3"),  # 16 · 0.3 is no whole side
    (["model.stages.1.crop_fraction=0.375", "model.stages.1.unet.dim_mults=[1,2,2]"], "divisible by 4"),  # 6 px
])
def test_crops_that_cannot_be_cut_exit_2_naming_the_field(tmp_path, overrides, says):
    sets = [arg for override in overrides for arg in ("--set", override)]
    result = runner.invoke(app, ["train", PRESET, *sets, "--dry-run", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2 and says in result.output, result.output


# -------------------------------------------------------------------------------------------- attention
def _has_attention(unet) -> bool:
    return any(isinstance(m, AttentionBlock) for m in unet.modules())


def test_upsamplers_have_no_attention_unless_their_unet_asks():
    """An upsampler whose `unet` does not set attention_levels / mid_attention is built with convolutions only
    (App. C), and its resolved config says so; set explicitly it attends; the base stage is not touched."""
    raw = load_config(PRESET).model_dump(mode="json")
    upsampler = raw["model"]["stages"][1]
    upsampler["unet"] = {k: v for k, v in upsampler["unet"].items() if k not in ("attention_levels", "mid_attention")}
    cfg = config_from_dict(raw, [])
    unet = cfg.model.stages[1].unet
    assert unet.attention_levels == () and unet.mid_attention is False
    task = build_task(cfg)
    assert _has_attention(task.cascade[0]) and not _has_attention(task.cascade[1])
    assert "attention_levels: []" in to_yaml(cfg)  # resolved: what was built
    raw["model"]["stages"][1]["unet"]["attention_levels"] = [1]
    attends = config_from_dict(raw, [])
    assert attends.model.stages[1].unet.attention_levels == (1,) and attends.model.stages[1].unet.mid_attention is False
    assert _has_attention(build_task(attends).cascade[1])


# ------------------------------------------------------------------------------------------ degradation
def _three_stages(*overrides: str):
    raw = load_config(PRESET).model_dump(mode="json")
    third = {**raw["model"]["stages"][1], "image_size": 32}
    third.pop("degradation")
    raw["model"]["stages"].append(third)
    raw["data"]["image_size"] = 32
    return config_from_dict(raw, list(overrides))


def test_the_second_upsampler_is_bsr_degraded_by_default():
    """degradation unset: blur for the first upsampler, BSR for the second (App. C), drawn from the batch stream
    (the same loss twice from the same step)."""
    cfg = _three_stages()
    assert [s.degradation for s in cfg.model.stages] == [None, "blur", "bsr"]
    task = build_task(cfg)
    image = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    losses = [task.loss({"image": image, "rng": BatchRandom(0, 5, 2, 4, 0, 4)}, "unet3", 5)[0] for _ in range(2)]
    assert torch.isfinite(losses[0]) and torch.equal(losses[0], losses[1])
    assert _three_stages("model.stages.2.degradation=blur").model.stages[2].degradation == "blur"


def test_bsr_with_crops_cuts_the_degraded_low_res_image():
    cfg, task = _task(CROP, "model.stages.1.degradation=bsr")
    seen = _training_inputs(task, torch.rand(4, 3, 16, 16) * 2 - 1)
    assert seen["x0"].shape == (4, 3, 8, 8) and seen["lowres"].shape == (4, 3, 4, 4)


def test_a_run_written_before_the_bsr_default_keeps_blurring_every_upsampler():
    """A resolved config.yaml written before `degradation` (every stage's keys of then, none with degradation)
    loads with blur on every upsampler and its attention as it was: as written, or (a `unet` written before
    mid_attention existed) the U-Net's defaults of then; a hand-written config without those keys gets today's."""
    resolved = _three_stages().model_dump(mode="json")
    resolved.pop("schema_version", None)
    for stage in resolved["model"]["stages"]:
        stage.pop("degradation")
        stage.pop("crop_fraction")
    resolved["model"]["stages"][2]["unet"]["attention_levels"] = [1]
    for key in ("attention_levels", "mid_attention"):  # written before mid_attention existed: the U-Net's then
        resolved["model"]["stages"][1]["unet"].pop(key)
    resolved["model"]["stages"][1]["unet"]["dim_mults"] = [1, 2, 2]
    old = config_from_dict(resolved, [])  # no schema_version: every migration step
    assert [s.degradation for s in old.model.stages] == [None, "blur", "blur"]
    assert old.model.stages[2].unet.attention_levels == (1,)
    assert old.model.stages[1].unet.attention_levels == (1, 2) and old.model.stages[1].unet.mid_attention
    hand_written = migrate({"model": {"family": "dalle2_decoder", "stages": [{"image_size": 8}, {"image_size": 16},
                                                                             {"image_size": 32}]}})
    assert all("degradation" not in s for s in hand_written["model"]["stages"])
