"""`genforge export RUN --to diffusers OUT`: every export loads with diffusers' own classes (`from_pretrained`) and
computes what genforge computes on the same input, within the tolerances docs/interoperability.md states; a model
that does not map exits 2 naming why."""

import json
from pathlib import Path

import pytest
import torch
from diffusers import (AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel,
                       FlowMatchEulerDiscreteScheduler, UNet2DModel, VQModel)
from safetensors.torch import load_file
from typer.testing import CliRunner

from genforge.app.config import load_config
from genforge.app.export import EXPORT_RECORD, export_loaded
from genforge.app.runs import LoadedRun, build_task, load_run, make_trainer
from genforge.cli import app
from genforge.core.config import ConfigError
from genforge.core.export import ExportError
from genforge.core.random import mix_seed
from genforge.core.registry import FAMILIES
from genforge.diffusion import clip_x0
from genforge.sampling import generate
from genforge.core.config import SampleOptions

runner = CliRunner()
QUICK = ["train.sample_every=0", "eval.every=0", "data.num_workers=0"]
FSQ = ["model.quantizer.kind=fsq", "model.quantizer.levels=[4,4]", "model.quantizer.codebook_size=512",
       "model.quantizer.threshold_ema_dead_code=0"]
UNET_16PX = ["data.image_size=16", "model.backbone.dim_mults=[1,2]", "model.backbone.attention_levels=[1]"]


def _train(preset, run_dir, steps, *overrides):
    cfg = load_config(preset, [f"train.steps={steps}", f"train.checkpoint_every={steps}", *QUICK, *overrides])
    make_trainer(cfg, run_dir).fit()
    return run_dir


def _built(preset, *overrides, seed=0):
    """A run of `preset` built, not trained, with random weights everywhere (a fresh DiT's adaLN-Zero outputs 0)."""
    cfg = load_config(preset, [*QUICK, *overrides])
    task = build_task(cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in task.ema_module().parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    return LoadedRun(cfg, task.eval(), 0, Path("built, not trained"), None)


def _export(run_dir, out, *args):
    return runner.invoke(app, ["export", str(run_dir), str(out), "--to", "diffusers", *args])


def _max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def _shift_like_genforge(transformer):
    """The one numerical difference of diffusers' DiT: its timestep embedding's frequency shift (1, genforge 0)."""
    for block in transformer.transformer_blocks:
        block.norm1.emb.time_proj.downscale_freq_shift = 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny trained runs: a klvae, a vqgan, and a latent DiT on the klvae."""
    root = tmp_path_factory.mktemp("runs")
    kl = _train("klvae-debug", root / "kl", 2)
    vq = _train("vqgan-debug", root / "vq", 2)
    dit = _train("dit-latent-debug", root / "dit", 2, "model.latent.codec=tokenizer", f"model.latent.tokenizer={kl}")
    return {"kl": kl, "vq": vq, "dit": dit}


def test_klvae_exports_an_autoencoder_kl_with_the_runs_scale(runs, tmp_path):
    out = tmp_path / "vae"
    result = _export(runs["kl"], out)
    assert result.exit_code == 0, result.output
    assert (out / "diffusion_pytorch_model.safetensors").is_file() and not list(out.glob("*.bin"))
    vae = AutoencoderKL.from_pretrained(out).eval()
    codec = load_run(runs["kl"]).task.codec()
    scale = codec.scale_factor()  # estimated 1/std, not diffusers' default 0.18215
    assert vae.config.scaling_factor == pytest.approx(scale) and scale != pytest.approx(0.18215)
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert record["weights"] == "ema" and record["folders"] == {".": "AutoencoderKL"}
    ema = load_file(load_run(runs["kl"]).checkpoint / "ema.safetensors")
    assert torch.equal(vae.encoder.conv_in.weight, ema["vae.encoder.conv_in.weight"])  # the EMA weights by default

    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        z = codec.encode(x)
        assert _max_diff(vae.encode(x).latent_dist.mean * vae.config.scaling_factor, z) < 1e-5
        assert _max_diff(vae.decode(z / vae.config.scaling_factor).sample, codec.decode(z)) < 1e-5


def test_vqgan_exports_a_vq_model_with_the_same_codes(runs, tmp_path):
    out = tmp_path / "vq"
    result = _export(runs["vq"], out)
    assert result.exit_code == 0, result.output
    vq = VQModel.from_pretrained(out).eval()
    codec = load_run(runs["vq"]).task.codec()
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        latents = vq.encode(x).latents
        assert _max_diff(latents, codec.encode_latent(x)) < 1e-5
        ids = codec.encode(x)  # [2, 8, 8]
        assert torch.equal(vq.quantize(latents)[2][2].view_as(ids), ids)
        assert _max_diff(vq.decode(latents).sample, codec.decode(ids)) < 1e-5


def test_dit_exports_a_transformer_equal_to_genforges_but_for_the_timestep_shift(tmp_path):
    run = _built("dit-debug")
    exported = export_loaded(run, tmp_path / "dit", "diffusers")
    assert exported.folders == {"transformer": "DiTTransformer2DModel", "scheduler": "DDIMScheduler"}
    assert any("no DiTPipeline" in note and "pixels" in note for note in exported.notes)
    transformer = DiTTransformer2DModel.from_pretrained(tmp_path / "dit" / "transformer").eval()
    scheduler = DDIMScheduler.from_pretrained(tmp_path / "dit" / "scheduler")
    assert scheduler.config.num_train_timesteps == 100 and scheduler.config.beta_end == pytest.approx(0.2)
    assert scheduler.config.clip_sample  # pixels: x0 clipped to [-1, 1], as genforge does
    assert not scheduler.config.thresholding

    dit, k = run.task.model, run.task.num_classes
    g = torch.Generator().manual_seed(1)
    x, t = torch.randn(3, 3, 16, 16, generator=g), torch.tensor([3, 40, 97])
    with torch.no_grad():
        ours = dit(x, t, torch.tensor([2, 5, k]))  # the last one: genforge's null class
        theirs = transformer(x, timestep=t, class_labels=torch.tensor([2, 5, 1000])).sample
        shifted = _max_diff(theirs, ours)
        _shift_like_genforge(transformer)
        same = transformer(x, timestep=t, class_labels=torch.tensor([2, 5, k])).sample
    assert 1e-4 < shifted < 0.05  # diffusers' downscale_freq_shift=1: measured 4.5e-3 at output std 0.43
    assert _max_diff(same, ours) < 1e-5


def test_latent_dit_exports_a_dit_pipeline_that_samples_what_genforge_samples(runs, tmp_path):
    run = load_run(runs["dit"])
    torch.manual_seed(0)
    with torch.no_grad():  # two training steps leave adaLN-Zero near 0: random weights make the check bite
        for p in run.task.model.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    exported = export_loaded(run, tmp_path / "pipe", "diffusers")
    assert exported.folders["."] == "DiTPipeline" and exported.details["null_class"] == 1000
    pipe = DiTPipeline.from_pretrained(tmp_path / "pipe")
    assert pipe.vae.config.scaling_factor == pytest.approx(run.task.latent_codec.scale_factor())

    steps, scale, seed = 5, 2.0, 3
    options = SampleOptions(sampler="ddim", steps=steps, cfg_scale=scale)
    images, cond = generate(run.task, 4, seed, "cpu", options=options)  # genforge sample
    _shift_like_genforge(pipe.transformer)
    ours = (images + 1) / 2
    theirs = pipe(class_labels=cond["label"].tolist(), guidance_scale=scale, num_inference_steps=steps,
                  generator=torch.Generator().manual_seed(mix_seed(seed, 0)), output_type="pt").images
    assert ours.std() > 0.01 and _max_diff(theirs, ours) < 1e-5  # measured 4e-7 (as loaded, without the shift: 6e-4)


@pytest.mark.parametrize("mid_attention", ["true", "false"])
def test_unet_exports_a_unet2d_model(tmp_path, mid_attention):
    """Also without the middle block's attention (model.backbone.mid_attention=false: UNet2DModel's add_attention)."""
    run = _built("unet-shapes", *UNET_16PX, f"model.backbone.mid_attention={mid_attention}")
    exported = export_loaded(run, tmp_path / "unet", "diffusers")
    assert exported.folders == {"unet": "UNet2DModel", "scheduler": "FlowMatchEulerDiscreteScheduler"}
    unet = UNet2DModel.from_pretrained(tmp_path / "unet" / "unet").eval()
    x, t, y = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.tensor([5.0, 800.0]), \
        torch.tensor([1, run.task.num_classes])
    with torch.no_grad():
        assert _max_diff(unet(x, t, class_labels=y).sample, run.task.model(x, t, y=y)) < 1e-5


def test_dynamic_thresholding_reaches_the_ddim_scheduler(tmp_path):
    """model.diffusion.dynamic_threshold: diffusers' own thresholding at that quantile, s not bounded above; the
    scheduler's x̂₀ is genforge's."""
    run = _built("dit-debug", "model.diffusion.dynamic_threshold=0.9")
    export_loaded(run, tmp_path / "dit", "diffusers")
    scheduler = DDIMScheduler.from_pretrained(tmp_path / "dit" / "scheduler")
    assert scheduler.config.thresholding and scheduler.config.dynamic_thresholding_ratio == 0.9
    x0 = 3 * torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    assert _max_diff(scheduler._threshold_sample(x0), clip_x0(x0, 0.9)) < 1e-5


@pytest.mark.parametrize("objective", ["flow", "edm"])
def test_other_objectives_get_the_scheduler_diffusers_has_or_a_note(objective, tmp_path):
    shift = ["model.diffusion.flow_shift=3.0"] if objective == "flow" else []
    run = _built("dit-debug", f"model.diffusion.objective={objective}", "model.diffusion.learn_sigma=false",
                 "model.diffusion.sampler=euler", *shift)
    exported = export_loaded(run, tmp_path / "dit", "diffusers")
    if objective == "flow":
        scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(tmp_path / "dit" / "scheduler")
        assert scheduler.config.shift == 3.0
    else:
        assert "scheduler" not in exported.folders and any("edm" in note for note in exported.notes)
    record = json.loads((tmp_path / "dit" / EXPORT_RECORD).read_text())
    assert record["notes"] == exported.notes
    assert DiTTransformer2DModel.from_pretrained(tmp_path / "dit" / "transformer").config.out_channels == 3


def test_what_does_not_map_is_refused_naming_why(tmp_path):
    with pytest.raises(ExportError, match="GroupNorm group counts differ"):
        export_loaded(_built("unet-shapes", *UNET_16PX, "model.backbone.dim=16"), tmp_path / "a", "diffusers")
    with pytest.raises(ExportError, match="mlp_ratio=2"):
        export_loaded(_built("dit-debug", "model.backbone.mlp_ratio=2.0"), tmp_path / "b", "diffusers")
    with pytest.raises(ExportError, match="kind=fsq"):
        export_loaded(_built("vqgan-debug", *FSQ), tmp_path / "c", "diffusers")
    with pytest.raises(ExportError, match="magnitude_preserving: EDM2's magnitude-preserving U-Net"):
        export_loaded(_built("unet-shapes", *UNET_16PX, "model.backbone.magnitude_preserving=true"), tmp_path / "d",
                      "diffusers")
    with pytest.raises(ConfigError, match="do not export to 'diffusers'.*diffusion, klvae, vqgan"):
        FAMILIES.get("maskgit").exporter("diffusers")
    assert not any((tmp_path / name).exists() for name in "abcd")  # nothing written


def test_cli_refusals_exit_2(runs, tmp_path):
    unet = _train("unet-shapes", tmp_path / "unet", 1, *UNET_16PX, "model.backbone.dim=16")
    result = _export(unet, tmp_path / "out")
    assert result.exit_code == 2 and "GroupNorm" in result.stderr and not (tmp_path / "out").exists()
    result = runner.invoke(app, ["export", str(runs["kl"]), str(tmp_path / "out"), "--to", "onnx"])
    assert result.exit_code == 2 and "--to 'onnx': allowed diffusers" in result.stderr
    assert _export(tmp_path / "nothing", tmp_path / "out").exit_code == 2
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    result = _export(runs["kl"], tmp_path / "full")
    assert result.exit_code == 2 and "not an empty folder" in result.stderr
    result = _export(runs["kl"], tmp_path / "live", "--no-ema")  # the live weights, on request
    assert result.exit_code == 0 and json.loads((tmp_path / "live" / EXPORT_RECORD).read_text())["weights"] == "live"
