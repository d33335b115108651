"""`genforge import`: a facebookresearch/DiT checkpoint (a `.pt` state dict in the official key layout) or a diffusers
DiTTransformer2DModel / DiTPipeline folder becomes a run directory that samples exactly what the same weights sample
in genforge, opens with load_run, and fine-tunes through train.init_from; pickled objects are refused (exit 2). An
official checkpoint's run samples as DiT's sample.py does (guidance on 3 channels, β_t without learned Σ), checked
against that loop written out here; a diffusers folder's as DiTPipeline does (every channel guided)."""

import argparse
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import yaml
from diffusers import AutoencoderKL
from safetensors.torch import save_file
from typer.testing import CliRunner

from genforge.app.config import load_config
from genforge.app.runs import load_run, make_trainer
from genforge.cli import app
from genforge.core.random import mix_seed
from genforge.diffusion.build import build_diffusion
from genforge.diffusion.gaussian import VarType
from genforge.sampling import generate
from genforge.families.diffusion.dit import DiT, sincos_pos_embed_2d
from genforge.core.config import SampleOptions

runner = CliRunner()
QUICK = ["train.sample_every=0", "eval.every=0", "data.num_workers=0", "train.steps=2", "train.checkpoint_every=2"]
# dit-latent-debug's DiT (depth 2, width 64, 2 heads) on the tokenizer folder's 4-channel latents, with DiT's T = 1000
DIT = ["model.latent.codec=diffusers", "model.diffusion.num_timesteps=1000"]
# facebookresearch/DiT's models.py DiT(depth=1, num_classes > 0) state dict: its key names
OFFICIAL_KEYS = {
    "pos_embed", "x_embedder.proj.weight", "x_embedder.proj.bias", "t_embedder.mlp.0.weight", "t_embedder.mlp.0.bias",
    "t_embedder.mlp.2.weight", "t_embedder.mlp.2.bias", "y_embedder.embedding_table.weight",
    "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias",
    "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc1.bias", "blocks.0.mlp.fc2.weight", "blocks.0.mlp.fc2.bias",
    "blocks.0.adaLN_modulation.1.weight", "blocks.0.adaLN_modulation.1.bias", "final_layer.linear.weight",
    "final_layer.linear.bias", "final_layer.adaLN_modulation.1.weight", "final_layer.adaLN_modulation.1.bias"}


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A latent DiT trained 2 steps in genforge on a diffusers AutoencoderKL folder, its weights made random (two
    steps leave adaLN-Zero near 0), and the same weights as an official-layout `.pt` state dict."""
    root = tmp_path_factory.mktemp("import")
    torch.manual_seed(0)
    AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                  block_out_channels=(16, 32), layers_per_block=1, norm_num_groups=8, latent_channels=4,
                  scaling_factor=0.5).save_pretrained(root / "vae")
    cfg = load_config("dit-latent-debug", [*QUICK, *DIT, f"model.latent.pretrained={root / 'vae'}"])
    make_trainer(cfg, root / "run").fit()
    run = load_run(root / "run")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in run.task.model.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    dit = run.task.model
    official = {"pos_embed": sincos_pos_embed_2d(64, dit.grid, dit.grid)[None], **dit.state_dict()}
    torch.save(official, root / "DiT-tiny.pt")
    return {"root": root, "run": run, "vae": root / "vae", "pt": root / "DiT-tiny.pt"}


def _samples(task, seed=3):
    images, _ = generate(task, 4, seed, "cpu", options=SampleOptions(sampler="ddim", steps=5, cfg_scale=2.0))
    return images


@contextmanager
def _sampling_as(task, **diffusion):
    """`task` sampling with these model.diffusion keys for the duration (e.g. the import's guidance_channels)."""
    before = task.cfg.diffusion
    task.cfg.diffusion = before.model_copy(update=diffusion)
    try:
        yield task
    finally:
        task.cfg.diffusion = before


def test_the_official_layout_is_genforges_plus_pos_embed(trained):
    one_block = {k for k in torch.load(trained["pt"], weights_only=True) if not k.startswith("blocks.1.")}
    assert one_block == OFFICIAL_KEYS


def test_an_official_checkpoint_samples_what_the_same_weights_sample_in_genforge(trained, tmp_path):
    result = _invoke("import", trained["pt"], "--out", tmp_path / "dit", "--vae", trained["vae"], "--num-heads", 2)
    assert result.exit_code == 0, result.output
    assert "imported dit-checkpoint" in result.output and "16px, 16 classes" in result.output
    imported = load_run(tmp_path / "dit")
    cfg = imported.config.model
    dit = cfg.backbone
    assert (dit.depth, dit.hidden_size, dit.num_heads, dit.patch_size, cfg.num_classes) == (2, 64, 2, 2, 16)
    assert cfg.latent.codec == "diffusers" and imported.config.data.image_size == 16
    assert imported.task.cfg.diffusion.guidance_channels == 3  # DiT's sample.py (test_..._samples_as_dits_sample_py)
    with _sampling_as(trained["run"].task, guidance_channels=3) as run_task:
        ours = _samples(run_task)
    assert ours.std() > 0.05 and torch.equal(_samples(imported.task), ours)
    assert imported.task.input_references["model.latent.pretrained"]["class"] == "AutoencoderKL"
    # the CLI samples it, and a fine-tune starts from it
    assert _invoke("sample", tmp_path / "dit", "--n", 2, "--steps", 2, "--out", tmp_path / "a.png").exit_code == 0
    ft = load_config(str(tmp_path / "dit" / "config.yaml"),
                     [*QUICK, "data.source=shapes", "data.shapes.n=64", f"train.init_from={tmp_path / 'dit'}"])
    make_trainer(ft, tmp_path / "ft").fit()
    assert (tmp_path / "ft" / "checkpoints" / "step-000002").is_dir()


def test_a_diffusers_export_imports_back_exactly(trained, tmp_path):
    assert _invoke("export", trained["root"] / "run", tmp_path / "pipe", "--to", "diffusers").exit_code == 0
    result = _invoke("import", tmp_path / "pipe", "--out", tmp_path / "back")  # a DiTPipeline brings its vae/
    assert result.exit_code == 0, result.output
    back = load_run(tmp_path / "back")
    assert back.config.model.num_classes == 1000  # diffusers' DiT label table: 1000 classes + the null one
    assert back.task.cfg.diffusion.guidance_channels is None  # DiTPipeline guides every latent channel
    run = load_run(trained["root"] / "run")  # the trained weights, as exported
    assert torch.equal(_samples(back.task), _samples(run.task))  # genforge's timestep shift both ways: exact
    result = _invoke("import", tmp_path / "pipe" / "transformer", "--out", tmp_path / "t")
    assert result.exit_code == 2 and "--vae" in result.output  # a latent model needs its codec
    result = _invoke("import", tmp_path / "pipe" / "transformer", "--out", tmp_path / "t", "--vae",
                     tmp_path / "pipe" / "vae")
    assert result.exit_code == 0, result.output  # a bare DiTTransformer2DModel folder with its VAE
    assert torch.equal(_samples(load_run(tmp_path / "t").task), _samples(run.task))


def test_safetensors_and_ema_only_checkpoints_import_as_the_pt_does(trained, tmp_path):
    state = torch.load(trained["pt"], weights_only=True)
    save_file(state, str(tmp_path / "DiT.safetensors"))
    torch.save({"ema": state}, tmp_path / "ema-only.pt")  # a dict of tensors under "ema", nothing pickled besides
    runs = []
    for name in ("DiT.safetensors", "ema-only.pt"):
        result = _invoke("import", tmp_path / name, "--out", tmp_path / name.split(".")[0], "--vae", trained["vae"],
                         "--num-heads", 2)
        assert result.exit_code == 0, result.output
        runs.append(load_run(tmp_path / name.split(".")[0]))
    with _sampling_as(trained["run"].task, guidance_channels=3) as run_task:  # the import's guidance
        ours = _samples(run_task)
    assert torch.equal(_samples(runs[0].task), ours) and torch.equal(_samples(runs[1].task), ours)


def test_pickled_objects_and_misfits_are_refused_with_exit_2(trained, tmp_path):
    state = torch.load(trained["pt"], weights_only=True)
    torch.save({"model": state, "ema": state, "args": argparse.Namespace(model="DiT-XL/2")}, tmp_path / "train.pt")
    result = _invoke("import", tmp_path / "train.pt", "--out", tmp_path / "a", "--vae", trained["vae"])
    assert result.exit_code == 2 and "weights_only" in result.output and "never unpickles" in result.output
    assert not (tmp_path / "a").exists()
    result = _invoke("import", trained["pt"], "--out", tmp_path / "b", "--vae", trained["vae"])
    assert result.exit_code == 2 and "--num-heads" in result.output  # width 64, depth 2: no size of the zoo
    bad = dict(state, pos_embed=torch.randn_like(state["pos_embed"]))
    torch.save(bad, tmp_path / "bad.pt")
    result = _invoke("import", tmp_path / "bad.pt", "--out", tmp_path / "c", "--vae", trained["vae"],
                     "--num-heads", 2)
    assert result.exit_code == 2 and "sin-cos" in result.output
    result = _invoke("import", tmp_path / "missing.pt", "--out", tmp_path / "d")
    assert result.exit_code == 2 and "does not exist" in result.output


def _official_dit(learn_sigma: bool) -> DiT:
    """A DiT of models.py's layout (depth 2, width 64, 2 heads, 16 classes) on 8×8×4 latents, random weights."""
    torch.manual_seed(2)
    dit = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=2, num_heads=2, num_classes=16,
              learn_sigma=learn_sigma).eval()
    with torch.no_grad():  # adaLN-Zero starts at zero: give every output weight a value
        for p in dit.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    return dit


def dit_sample_py(dit, vae, y, generator, steps, cfg_scale, guided=3, variance="large"):
    """facebookresearch/DiT's sample.py written out with numpy and the weights (models.py's names, key for key):
    create_diffusion(str(steps)) (linear β 1e-4 .. 0.02, T = 1000, space_timesteps' evenly spaced steps, ε; learned
    range, or with sigma_small=False β_t: FIXED_LARGE, β̃_1 at t = 0), z and y doubled with the null class,
    forward_with_cfg guiding eps[:, :guided] (3 in models.py), p_sample_loop with clip_denoised=False, the null half
    dropped, vae.decode(z / scaling_factor). z and each step's noise are drawn from `generator` as genforge draws them
    (one [n, C, h, w] draw per step but the last); forward_with_cfg reads only the first half, so the second half's
    noise does not matter and is the same draw."""
    betas_full = np.linspace(1e-4, 0.02, 1000, dtype=np.float64)
    alphas_cumprod_full = np.cumprod(1.0 - betas_full)
    stride = (1000 - 1) / (steps - 1)
    kept = [round(i * stride) for i in range(steps)]  # IDDPM space_timesteps for one section
    betas, last = [], 1.0
    for k in kept:
        betas.append(1.0 - alphas_cumprod_full[k] / last)
        last = alphas_cumprod_full[k]
    betas = np.array(betas)
    ac = np.cumprod(1.0 - betas)
    ac_prev = np.append(1.0, ac[:-1])
    posterior_variance = betas * (1.0 - ac_prev) / (1.0 - ac)
    posterior_log_clipped = np.log(np.append(posterior_variance[1], posterior_variance[1:]))
    large_log = np.log(np.append(posterior_variance[1], betas[1:]))
    coef1, coef2 = betas * np.sqrt(ac_prev) / (1.0 - ac), (1.0 - ac_prev) * np.sqrt(1.0 - betas) / (1.0 - ac)

    def f(table: np.ndarray, i: int) -> float:  # _extract_into_tensor: the float64 table's entry as float32
        return float(np.float32(table[i]))


    n, c = len(y), dit.in_channels
    z = torch.randn(n, c, dit.input_size, dit.input_size, generator=generator)
    x = torch.cat([z, z])
    y2 = torch.cat([y, torch.full_like(y, dit.num_classes)])  # y_null: the class after the last
    for i in reversed(range(steps)):
        t = torch.full((2 * n,), kept[i], dtype=torch.long)  # the model sees the original timestep
        with torch.no_grad():  # forward_with_cfg
            half = x[:n]
            out = dit(torch.cat([half, half]), t, y2)
        eps, rest = out[:, :guided], out[:, guided:]
        cond_eps, uncond_eps = eps.chunk(2)
        half_eps = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
        out = torch.cat([torch.cat([half_eps, half_eps]), rest], dim=1)
        eps = out[:, :c]
        if dit.learn_sigma:  # LEARNED_RANGE (IDDPM eq. 15)
            frac = (out[:, c:] + 1) / 2
            log_var = frac * f(np.log(betas), i) + (1 - frac) * f(posterior_log_clipped, i)
        else:
            log_var = torch.full_like(x, f(large_log if variance == "large" else posterior_log_clipped, i))
        x0 = f(np.sqrt(1.0 / ac), i) * x - f(np.sqrt(1.0 / ac - 1), i) * eps
        mean = f(coef1, i) * x0 + f(coef2, i) * x
        if i == 0:
            x = mean
        else:
            e = torch.randn(n, c, dit.input_size, dit.input_size, generator=generator)
            x = mean + torch.exp(0.5 * log_var) * torch.cat([e, e])
    samples = x.chunk(2)[0]
    with torch.no_grad():
        return vae.decode(samples / vae.config.scaling_factor).sample.clamp(-1, 1)


@pytest.mark.parametrize("learn_sigma", [True, False])
def test_an_official_checkpoint_samples_as_dits_sample_py(trained, tmp_path, learn_sigma):
    """The imported run's built config guides 3 channels and, without learned Σ, samples with DiT's β_t; 5 DDPM
    steps at guidance 4 sample what DiT's sample.py loop samples on the same weights and noise, and the loop with
    every channel guided (or the small variance) does not."""
    dit = _official_dit(learn_sigma)
    torch.save({"pos_embed": sincos_pos_embed_2d(64, dit.grid, dit.grid)[None], **dit.state_dict()},
               tmp_path / "DiT.pt")
    result = _invoke("import", tmp_path / "DiT.pt", "--out", tmp_path / "run", "--vae", trained["vae"],
                     "--num-heads", 2)
    assert result.exit_code == 0, result.output
    imported = load_run(tmp_path / "run")
    built = imported.task.cfg.diffusion
    assert built.guidance_channels == 3 and built.learn_sigma is learn_sigma
    assert imported.config.model.diffusion == built
    expected = VarType.LEARNED_RANGE if learn_sigma else VarType.FIXED_LARGE
    assert build_diffusion(built, sample_steps=5).var_type == expected
    if not learn_sigma:
        assert built.fixed_variance == "large"

    ours, cond = generate(imported.task, 4, 3, "cpu", options=SampleOptions(sampler="ddpm", steps=5, cfg_scale=4.0))
    vae = AutoencoderKL.from_pretrained(trained["vae"]).eval()

    def reference(**variant):  # x_T and step noise from generate's generator of the first chunk
        generator = torch.Generator().manual_seed(mix_seed(3, 0))
        return dit_sample_py(dit, vae, cond["label"], generator, steps=5, cfg_scale=4.0, **variant)

    theirs = reference()
    assert ours.std() > 0.05
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    assert (reference(guided=4) - ours).abs().max() > 1e-3  # DiTPipeline's all-channel guidance is another sample
    if not learn_sigma:
        assert (reference(variance="small") - ours).abs().max() > 1e-3


def test_a_run_imported_before_dits_sampling_keeps_its_config(trained, tmp_path):
    """A run imported before the import wrote DiT's sample.py settings (every channel guided; small variance) loads
    with what it was imported with: the config.yaml is the run's record, no migration rewrites it."""
    dit = _official_dit(learn_sigma=False)
    torch.save({"pos_embed": sincos_pos_embed_2d(64, dit.grid, dit.grid)[None], **dit.state_dict()},
               tmp_path / "DiT.pt")
    assert _invoke("import", tmp_path / "DiT.pt", "--out", tmp_path / "run", "--vae", trained["vae"],
                   "--num-heads", 2).exit_code == 0
    path = tmp_path / "run" / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["model"]["diffusion"].update(guidance_channels=None, fixed_variance="small")  # as the import wrote it then
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    old = load_run(tmp_path / "run").task.cfg.diffusion
    assert (old.guidance_channels, old.fixed_variance) == (None, "small")
    assert build_diffusion(old, sample_steps=5).var_type == VarType.FIXED_SMALL
