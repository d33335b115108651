"""`genforge import`: a facebookresearch/DiT checkpoint (a `.pt` state dict in the official key layout) or a diffusers
DiTTransformer2DModel / DiTPipeline folder becomes a run directory that samples exactly what the same weights sample
in genforge, opens with load_run, and fine-tunes through train.init_from; pickled objects are refused (exit 2)."""

import argparse

import pytest
import torch
from diffusers import AutoencoderKL
from safetensors.torch import save_file
from typer.testing import CliRunner

from genforge.app.config import load_config
from genforge.app.runs import load_run, make_trainer
from genforge.cli import app
from genforge.eval.run import generate
from genforge.families.diffusion.dit import sincos_pos_embed_2d
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
    ours = _samples(trained["run"].task)
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
    assert torch.equal(_samples(runs[0].task), _samples(trained["run"].task))
    assert torch.equal(_samples(runs[1].task), _samples(trained["run"].task))


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
