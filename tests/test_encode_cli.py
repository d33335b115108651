"""`genforge encode` end to end: tokenizer run -> cache -> DiT on the cache -> samples decoded to pixels."""

import json
import shutil

import pytest
from fake_tokenizer import fake_tokenizer  # noqa: F401 (fixture)
from PIL import Image
from typer.testing import CliRunner

from genforge.cli import app


runner = CliRunner()


def _dit_on_cache(tokenizer, cache, *more):
    sets = ["data.source=cache", f"data.path={cache}", "model.latent.codec=tokenizer",
            f"model.latent.tokenizer={tokenizer}", *more]
    return [arg for s in sets for arg in ("--set", s)]


def test_encode_train_sample(tmp_path, fake_tokenizer):
    tok, cache, dit = fake_tokenizer(tmp_path / "tok"), tmp_path / "cache", tmp_path / "dit"
    out = runner.invoke(app, ["encode", str(tok), "--out", str(cache), "--set", "data.shapes.n=24",
                              "--shard-size", "10"])
    assert out.exit_code == 0, out.output
    assert "wrote 24 latent 12x8x8 float16 (+ flipped) in 3 shard(s)" in out.stdout
    assert f"manifest: {cache / 'cache.json'}" in out.stdout
    manifest = json.loads((cache / "cache.json").read_text())
    assert manifest["count"] == 24 and len(manifest["shards"]) == 3

    out = runner.invoke(app, ["train", "dit-latent-debug", "--run-dir", str(dit), *_dit_on_cache(tok, cache)])
    assert out.exit_code == 0, out.output
    shutil.rmtree(cache)  # sampling needs the tokenizer, not the cache
    grid = tmp_path / "grid.png"
    out = runner.invoke(app, ["sample", str(dit), "--n", "4", "--steps", "2", "--out", str(grid)])
    assert out.exit_code == 0, out.output
    assert Image.open(grid).size == (2 + 2 * (16 + 2),) * 2  # 8x8 latents decoded to 16 px images

    out = runner.invoke(app, ["encode", str(dit), "--out", str(tmp_path / "c2")])
    assert out.exit_code == 2 and "not a tokenizer" in out.stderr


def test_a_cache_of_another_tokenizer_is_refused_with_exit_2(tmp_path, fake_tokenizer):
    tok, other, cache = fake_tokenizer(tmp_path / "tok"), fake_tokenizer(tmp_path / "other", 0.25), tmp_path / "c"
    assert runner.invoke(app, ["encode", str(tok), "--out", str(cache), "--no-flip"]).exit_code == 0
    out = runner.invoke(app, ["train", "dit-latent-debug", "--dry-run", *_dit_on_cache(tok, cache, "data.flip=false")])
    assert out.exit_code == 0, out.output
    for extra in (["--dry-run"], ["--run-dir", str(tmp_path / "dit")]):
        out = runner.invoke(app, ["train", "dit-latent-debug", *extra, *_dit_on_cache(other, cache, "data.flip=false")])
        assert out.exit_code == 2 and "encoded by another tokenizer checkpoint" in out.stderr
        assert str(tok / "checkpoints" / "step-000001") in out.stderr and str(other / "checkpoints") in out.stderr
    out = runner.invoke(app, ["train", "dit-latent-debug", "--dry-run", *_dit_on_cache(tok, cache)])
    assert out.exit_code == 2 and "no flipped variant" in out.stderr


@pytest.mark.parametrize("args, message", [
    (["--set", "train.lr=1"], "only data.* keys"),
    (["--set", "data.image_size=-1"], "data.image_size"),
    (["--data", "no-such-preset"], "unknown preset"),
])
def test_encode_bad_input_exits_2(tmp_path, fake_tokenizer, args, message):
    tok = fake_tokenizer(tmp_path / "tok")
    out = runner.invoke(app, ["encode", str(tok), "--out", str(tmp_path / "c"), *args])
    assert out.exit_code == 2 and message in out.stderr, out.output
    assert not (tmp_path / "c").exists()


def test_encode_refuses_a_folder_that_is_not_a_run(tmp_path):
    out = runner.invoke(app, ["encode", str(tmp_path), "--out", str(tmp_path / "c")])
    assert out.exit_code == 2 and "not a run directory" in out.stderr


def test_klvae_encode_dit_sample(tmp_path):
    """The real pipeline: KL-VAE on shapes -> encode -> DiT on the cached latents -> decoded samples. The KL-VAE
    trains with train.sharding=fsdp (on one process: a sharded checkpoint, read back whole by encode and the DiT)."""
    vae, cache, dit = tmp_path / "vae", tmp_path / "cache", tmp_path / "dit"
    out = runner.invoke(app, ["train", "klvae-debug", "--run-dir", str(vae), "--set", "train.sharding=fsdp"])
    assert out.exit_code == 0 and (vae / "checkpoints" / "step-000006" / "shards").is_dir(), out.output
    out = runner.invoke(app, ["encode", str(vae), "--out", str(cache), "--set", "data.shapes.n=32"])
    assert out.exit_code == 0, out.output
    size = json.loads((cache / "cache.json").read_text())["preprocessing"]["image_size"]
    out = runner.invoke(app, ["train", "dit-latent-debug", "--run-dir", str(dit), *_dit_on_cache(
        vae, cache, f"data.image_size={size}", "model.backbone.patch_size=1")])
    assert out.exit_code == 0, out.output
    out = runner.invoke(app, ["sample", str(dit), "--n", "4", "--steps", "2", "--out", str(tmp_path / "g.png")])
    assert out.exit_code == 0, out.output
    assert Image.open(tmp_path / "g.png").size == (2 + 2 * (size + 2),) * 2
