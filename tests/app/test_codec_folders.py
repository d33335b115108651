"""Generators on a pretrained codec from a diffusers folder (`codec: diffusers`, `pretrained: DIR`): an AutoencoderKL
for DiT latents, a VQModel for MaskGIT tokens. The codec computes what diffusers' own class computes; the generator's
checkpoints refer to the folder (path + content hash) instead of copying its weights; a moved or changed folder
makes sampling and resuming exit 2 naming the field; `genforge encode` takes the folder too."""

import json
import re
import shutil

import pytest
import torch
from diffusers import AutoencoderKL, VQModel
from safetensors import safe_open
from typer.testing import CliRunner

from genforge.app.config import load_config
from genforge.app.runs import load_diffusers_codec, load_run, make_trainer
from genforge.cli import app
from genforge.core.config import ConfigError
from genforge.core.files import folder_sha256
from genforge.data.cache import read_manifest

runner = CliRunner()
QUICK = ["train.sample_every=0", "eval.every=0", "data.num_workers=0", "train.steps=2", "train.checkpoint_every=2"]
TINY = dict(block_out_channels=(16, 32), layers_per_block=1, norm_num_groups=8)


def _vae_folder(path, seed=0, scaling_factor=0.5):
    torch.manual_seed(seed)
    AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                  latent_channels=4, scaling_factor=scaling_factor, **TINY).save_pretrained(path)
    return path


def _vq_folder(path, seed=0, **extra):
    torch.manual_seed(seed)
    VQModel(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            latent_channels=8, num_vq_embeddings=64, vq_embed_dim=8, **TINY, **extra).save_pretrained(path)
    return path


def _weight_names(ckpt):
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        return list(f.keys())


@pytest.fixture(scope="module")
def vae_run(tmp_path_factory):
    """A latent DiT trained 2 steps on a diffusers AutoencoderKL folder."""
    root = tmp_path_factory.mktemp("vae")
    vae = _vae_folder(root / "vae")
    cfg = load_config("dit-latent-debug", [*QUICK, "model.latent.codec=diffusers", f"model.latent.pretrained={vae}"])
    make_trainer(cfg, root / "run").fit()
    return {"vae": vae, "run": root / "run", "cfg": cfg}


def test_an_autoencoder_kl_folder_encodes_and_decodes_as_diffusers_does(vae_run):
    codec, info = load_diffusers_codec(vae_run["vae"])
    vae = AutoencoderKL.from_pretrained(vae_run["vae"]).eval()
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        z = codec.encode(x)
        assert torch.allclose(z, vae.encode(x).latent_dist.mean * 0.5, atol=1e-6)  # the folder's scaling_factor
        assert torch.allclose(codec.decode(z), vae.decode(z / 0.5).sample, atol=1e-6)
    assert (info.kind, info.channels, info.downsample, info.source) == ("latent", 4, 2, "diffusers")
    assert info.encoder_hash == folder_sha256(vae_run["vae"])


def test_the_checkpoint_refers_to_the_folder_instead_of_copying_it(vae_run):
    ckpt = vae_run["run"] / "checkpoints" / "step-000002"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    ref = state["inputs"]["model.latent.pretrained"]
    assert ref == {"path": str(vae_run["vae"].resolve()), "sha256": folder_sha256(vae_run["vae"]),
                   "class": "AutoencoderKL"}
    names = _weight_names(ckpt)
    assert names and not any("latent_codec" in n or "vae" in n for n in names)  # the DiT's weights only
    run = load_run(vae_run["run"])
    images, _ = run.task.sample({"label": torch.tensor([0, 1])}, torch.Generator().manual_seed(0), 2,
                                run.task.resolve()), None
    assert images.shape == (2, 3, 16, 16) and torch.isfinite(images).all()


def test_a_moved_or_changed_folder_exits_2_naming_the_field(vae_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(vae_run["run"], run)
    moved = tmp_path / "vae-moved"
    shutil.move(vae_run["vae"], moved)
    try:
        result = runner.invoke(app, ["sample", str(run), "--n", "2", "--out", str(tmp_path / "a.png")])
        assert result.exit_code == 2, result.output
        assert "model.latent.pretrained" in result.output and "keep it in place" in result.output
    finally:
        shutil.move(moved, vae_run["vae"])
    changed = _vae_folder(tmp_path / "vae-changed", seed=1)  # same config, other weights
    config = run / "config.yaml"
    config.write_text(config.read_text().replace(str(vae_run["vae"]), str(changed)))
    result = runner.invoke(app, ["sample", str(run), "--n", "2", "--out", str(tmp_path / "b.png")])
    assert result.exit_code == 2, result.output
    assert "model.latent.pretrained" in result.output and "changed or replaced" in result.output
    # resuming the run with the changed folder is refused as well, before a step is taken
    cfg = load_config(str(config), ["train.steps=4"])
    with pytest.raises(ConfigError, match="model.latent.pretrained.*changed or replaced"):
        make_trainer(cfg, run).fit()
    # an exact copy of the original is accepted wherever it lies
    copy = shutil.copytree(vae_run["vae"], tmp_path / "vae-copy")
    config.write_text(config.read_text().replace(str(changed), str(copy)))
    result = runner.invoke(app, ["sample", str(run), "--n", "2", "--out", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output


def test_encode_takes_the_folder_and_a_generator_trains_on_its_cache(vae_run, tmp_path):
    cache = tmp_path / "cache"
    result = runner.invoke(app, ["encode", str(vae_run["vae"]), "--out", str(cache), "--data", "dit-latent-debug",
                                 "--set", "data.shapes.n=16"])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(cache)
    assert manifest.kind == "latent" and manifest.encoder_hash == folder_sha256(vae_run["vae"])
    on_cache = ["data.source=cache", f"data.path={cache}", "model.latent.codec=diffusers"]
    cfg = load_config("dit-latent-debug", [*QUICK, *on_cache, f"model.latent.pretrained={vae_run['vae']}"])
    make_trainer(cfg, tmp_path / "run").fit()
    other = _vae_folder(tmp_path / "other", seed=1)
    cfg = load_config("dit-latent-debug", [*QUICK, *on_cache, f"model.latent.pretrained={other}"])
    with pytest.raises(ValueError, match="encoded by another tokenizer"):
        make_trainer(cfg, tmp_path / "run2").fit()
    result = runner.invoke(app, ["encode", str(vae_run["vae"]), "--out", str(tmp_path / "c2")])
    assert result.exit_code == 2 and "--data" in result.output


@pytest.mark.parametrize("lookup", [False, True])
def test_a_vq_model_folder_decodes_its_ids_as_vq_model_does(lookup, tmp_path):
    """Both ways a VQModel decodes ids: the codebook looked up by the codec, or by decode() itself
    (`lookup_from_codebook`, aMUSEd's VQ model)."""
    folder = _vq_folder(tmp_path / "vq", lookup_from_codebook=lookup)
    codec, _ = load_diffusers_codec(folder)
    vq = VQModel.from_pretrained(folder).eval()
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        assert torch.allclose(codec.decode(codec.encode(x)), vq(x).sample, atol=1e-5)


def test_a_vq_model_folder_gives_maskgit_its_tokens(tmp_path):
    folder = _vq_folder(tmp_path / "vq")
    codec, info = load_diffusers_codec(folder)
    vq = VQModel.from_pretrained(folder).eval()
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        ids = codec.encode(x)
        assert ids.shape == (2, 8, 8) and ids.dtype == torch.long and int(ids.max()) < 64
        assert torch.allclose(codec.decode(ids), vq(x).sample, atol=1e-5)  # VQModel quantizes in decode
    assert (info.kind, info.codebook_size, info.downsample) == ("tokens", 64, 2)
    cfg = load_config("maskgit-debug", [*QUICK, "model.tokens.codec=diffusers", f"model.tokens.pretrained={folder}"])
    make_trainer(cfg, tmp_path / "run").fit()
    assert "model.tokens.pretrained" in json.loads(
        (tmp_path / "run" / "checkpoints" / "step-000002" / "trainer_state.json").read_text())["inputs"]
    task = load_run(tmp_path / "run").task
    images = task.sample({"text": ["a red square"] * 2}, torch.Generator(), 2, task.resolve())
    assert images.shape == (2, 3, 16, 16)


@pytest.mark.parametrize("overrides, message", [
    (["model.latent.codec=diffusers"], "model.latent.pretrained (a diffusers model folder) is required"),
    (["model.latent.codec=space_to_depth", "model.latent.pretrained=x"], "model.latent.pretrained applies to"),
    (["model.latent.codec=diffusers", "model.latent.pretrained=/nonexistent"], "not a diffusers model folder"),
])
def test_config_errors_name_the_field(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        cfg = load_config("dit-latent-debug", [*QUICK, *overrides])
        make_trainer(cfg, tmp_path / "run")


def test_a_folder_of_another_kind_is_refused(tmp_path):
    folder = _vq_folder(tmp_path / "vq")
    cfg = load_config("dit-latent-debug", [*QUICK, "model.latent.codec=diffusers", f"model.latent.pretrained={folder}"])
    with pytest.raises(ValueError, match="model.latent.pretrained=.*discrete tokens.*AutoencoderKL folder"):
        make_trainer(cfg, tmp_path / "run")
