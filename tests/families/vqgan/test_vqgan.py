"""vqgan beyond the family contract: the codec round trip, the quantizer kinds, the deferred EMA codebook
update, and config errors that name the field."""

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from genforge.app.config import ConfigError, config_from_dict, load_config, to_yaml
from genforge.app.migrations import migrate
from genforge.core.random import BatchRandom
from genforge.app.runs import build_task
from genforge.nn.discriminator import gradient_penalty, hinge_discriminator_loss, interpolates
from genforge.tokenizers.config import GANConfig
from genforge.families.vqgan.model import VQAutoencoder
from genforge.core.codec import TokenCodec

KINDS = {
    "vq-ema": ("model.quantizer={kind: vq, codebook_size: 64}", 64),
    "vq-cosine": ("model.quantizer={kind: vq, codebook_size: 32, codebook_dim: 4, use_cosine_sim: true}", 32),
    "vq-learnt": ("model.quantizer={kind: vq, codebook_size: 64, ema_update: false}", 64),
    "lfq": ("model.quantizer={kind: lfq, codebook_size: 128}", 128),
    "fsq": ("model.quantizer={kind: fsq, levels: [5, 4, 3]}", 60),
}


def autoencoder(*overrides: str) -> VQAutoencoder:
    torch.manual_seed(0)
    cfg = load_config("vqgan-debug", list(overrides))
    return VQAutoencoder(cfg.model, 3)


def images(n: int = 4, size: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_round_trip_is_the_eval_forward_and_ids_are_in_range(kind):
    override, size = KINDS[kind]
    ae = autoencoder(override).eval()
    assert isinstance(ae, TokenCodec) and ae.codebook_size == size and ae.downsample == 2
    x = images()
    with torch.no_grad():
        ids = ae.encode(x)
        assert ids.dtype == torch.long and ids.shape == (4, 8, 8)
        assert 0 <= ids.min() and ids.max() < size
        q = ae.quantize(ae.encode_latent(x))
        assert torch.equal(q.ids, ids)
        assert torch.allclose(ae.codes(ids), q.zq, atol=1e-6)  # the ids carry everything the decoder sees
        assert torch.allclose(ae.decode(ids), ae.decode_latent(q.zq), atol=1e-5)
        assert ae.decode(ids).shape == x.shape


@pytest.mark.parametrize("cosine", [False, True])
def test_deferred_ema_update_equals_the_librarys_own_update(cosine):
    """One training batch: the pending update, applied, gives the codebook VectorQuantize's in-forward EMA
    update gives (counts, sums, normalised codes)."""
    ae = autoencoder(f"model.quantizer={{kind: vq, codebook_size: 16, use_cosine_sim: {str(cosine).lower()}}}")
    reference = copy.deepcopy(ae.quantizer).train()
    z = torch.randn(2, 8, 4, 4)
    ae.train().quantize(z, step=0)
    before = ae.quantizer.codebook.clone()
    reference(z)  # the library updates its codebook during the forward
    assert not torch.allclose(reference.codebook, before)
    assert torch.equal(ae.quantizer.codebook, before) and int(ae.pending.step) == 0  # not yet applied
    ae.apply_pending()
    assert int(ae.pending.step) == -1 and ae.pending.counts.sum() == 0
    for name in ("embed", "cluster_size", "embed_avg"):
        assert torch.allclose(getattr(ae.quantizer._codebook, name), getattr(reference._codebook, name), atol=1e-5)


def test_every_micro_batch_of_a_step_sees_the_same_codebook_and_the_update_does_not_depend_on_the_split():
    whole, split = autoencoder(), autoencoder()  # the preset: threshold_ema_dead_code 1 (samples kept)
    whole.train(), split.train()
    z = torch.randn(8, 8, 4, 4)
    ids = whole.quantize(z, step=3, rng=BatchRandom(0, 3, 0, 8, 0, 8)).ids
    parts = [split.quantize(z[i:i + 4], step=3, rng=BatchRandom(0, 3, 0, 8, i, 4)).ids for i in (0, 4)]
    assert torch.equal(torch.cat(parts), ids)  # the second micro-batch quantized with the unchanged codebook
    a, b = whole.pending, split.pending
    assert torch.equal(a.counts, b.counts) and torch.allclose(a.sums, b.sums, atol=1e-5)
    assert torch.equal(a.keys, b.keys) and torch.equal(a.candidates, b.candidates)
    whole.quantize(z, step=4)  # the next step applies step 3's update first
    split.apply_pending()
    assert torch.allclose(whole.quantizer.codebook, split.quantizer.codebook, atol=1e-5)


def test_dead_codes_are_restarted_from_the_steps_encodings():
    ae = autoencoder("model.quantizer={kind: vq, codebook_size: 64, threshold_ema_dead_code: 1.0}").train()
    z = torch.randn(1, 8, 4, 4)  # 16 encodings for 64 codes: at most 16 codes used, the rest fall below 1
    used = ae.quantize(z, step=0, rng=BatchRandom(0, 0, 0, 1, 0, 1)).ids.unique()
    ae.apply_pending()
    book, size = ae.quantizer.codebook, ae.quantizer._codebook.cluster_size[0]
    encodings = z.permute(0, 2, 3, 1).reshape(16, 8)
    restarted = [k for k in range(64) if k not in used.tolist()][:16]
    for k in restarted:  # each restarted code is one of the step's encodings, with usage reset to the threshold
        assert (book[k] - encodings).abs().amax(1).min() < 1e-6 and size[k] == 1.0
    assert len({tuple(book[k].tolist()) for k in restarted}) == 16  # 16 different samples


def test_eval_passes_do_not_touch_the_codebook():
    cfg = load_config("vqgan-debug")
    torch.manual_seed(0)
    task = build_task(cfg)
    task.train()
    state = {k: v.clone() for k, v in task.autoencoder.state_dict().items()}
    batch = {"image": images(8), "rng": BatchRandom(0, 0, 1, 8, 0, 8)}
    task.loss(batch, "discriminator", 0)  # no cached fakes: the fallback pass in eval mode
    task.autoencoder.eval()
    task.autoencoder.encode(images(8))
    assert all(torch.equal(v, task.autoencoder.state_dict()[k]) for k, v in state.items())
    assert task.autoencoder.training is False and task.discriminator is not None


def test_gan_is_on_by_default_and_codebook_is_a_default_metric(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("model: {family: vqgan}\ndata: {image_size: 32}\n")
    cfg = load_config(str(path))
    assert isinstance(cfg.model.gan, GANConfig) and cfg.eval.metrics == ["psnr", "ssim", "codebook"]
    assert cfg.model.downsample() == 4 and cfg.model.quantizer.size() == 512


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_resolved_config_round_trips_and_builds_on_meta(kind, tmp_path):
    cfg = load_config("vqgan-debug", [KINDS[kind][0]])
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))  # what a run directory holds: every field, resolved
    assert load_config(str(tmp_path / "config.yaml")).model == cfg.model
    task = build_task(cfg, device="meta")  # what `genforge train --dry-run` does
    assert task.autoencoder.codebook_size == KINDS[kind][1]


FIXTURES = Path(__file__).parents[2] / "fixtures"


def test_the_presets_penalty_is_muses_gradient_penalty_on_real_images():
    gan = load_config("vqgan-shapes").model.gan
    assert (gan.penalty, gan.penalty_weight, gan.penalty_every, gan.penalty_inputs) == ("wgan_gp", 10.0, 4, "real")
    assert GANConfig().penalty == "none"  # the other tokenizers' default


def test_the_vqgan_familys_default_penalty_is_muses():
    """A vqgan config that says nothing of the penalty (no gan section, or one without `penalty`) trains with MUSE's;
    old runs keep theirs: their config.yaml holds every field."""
    cfg = load_config("vqgan-debug", ["model.gan.penalty=none", "data.image_size=32"]).model_dump(mode="json")
    del cfg["model"]["gan"]
    assert config_from_dict(cfg).model.gan.penalty == "wgan_gp"
    cfg["model"]["gan"] = {"weight": 0.2, "num_layers": 2}
    gan = config_from_dict(cfg).model.gan
    assert (gan.penalty, gan.penalty_weight, gan.penalty_every, gan.penalty_inputs) == ("wgan_gp", 10.0, 4, "real")
    old = load_config(str(FIXTURES / "runs-3f8e24e" / "vqgan" / "config.yaml")).model.gan
    assert old.penalty == "r1"


@pytest.mark.parametrize("fixture", ["runs-42ccac9", "runs-3f8e24e"])
def test_old_runs_r1_keys_mean_the_r1_penalty(fixture, tmp_path):
    cfg = load_config(str(FIXTURES / fixture / "vqgan" / "config.yaml"))
    gan = cfg.model.gan
    assert (gan.penalty, gan.penalty_weight, gan.penalty_every) == ("r1", 1.0, 2)
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))  # re-resolved with the new keys, the same penalty
    assert "r1_weight" not in to_yaml(cfg) and load_config(str(tmp_path / "config.yaml")).model == cfg.model
    assert migrate({"model": {"gan": {"r1_weight": 0.0, "r1_every": 4}}})["model"]["gan"]["penalty"] == "none"
    assert migrate({"model": {"gan": {"r1_every": 8}}})["model"]["gan"]["penalty"] == "none"  # r1_weight's default was 0


def test_wgan_gp_on_real_images_is_hinge_plus_lambda_times_the_penalty():
    torch.manual_seed(0)
    task = build_task(load_config("vqgan-debug"))  # wgan_gp, λ 10, every 4 steps, on real images
    task.train()
    batch = {"image": images(8), "rng": BatchRandom(0, 4, 0, 8, 0, 8)}
    task.loss(batch, "generator", 4)  # leaves this step's reconstructions for the discriminator
    fake = task._fakes[(4, 0)]
    loss, logs = task.loss({**batch, "rng": BatchRandom(0, 4, 1, 8, 0, 8)}, "discriminator", 4)
    real = batch["image"].detach().requires_grad_(True)
    real_logits = task.discriminator(real)
    penalty = gradient_penalty(real_logits, real)
    hinge = hinge_discriminator_loss(real_logits, task.discriminator(fake))
    torch.testing.assert_close(logs["wgan_gp"], penalty.detach())
    torch.testing.assert_close(loss, hinge + 10.0 * penalty)


def test_wgan_gp_on_interpolates_draws_epsilon_from_the_batch_stream():
    torch.manual_seed(0)
    task = build_task(load_config("vqgan-debug", ["model.gan.penalty_inputs=interpolates",
                                                   "model.gan.penalty_every=2"]))
    task.train()
    x = images(8)
    task.loss({"image": x, "rng": BatchRandom(0, 4, 0, 8, 0, 8)}, "generator", 4)
    fake = task._fakes[(4, 0)]
    rng = BatchRandom(0, 4, 1, 8, 0, 8)
    loss, logs = task.loss({"image": x, "rng": rng}, "discriminator", 4)
    eps = BatchRandom(0, 4, 1, 8, 0, 8).rand()  # the first draw of the discriminator phase (images: no frame draw)
    points = interpolates(x, fake, eps).requires_grad_(True)
    penalty = gradient_penalty(task.discriminator(points), points)
    torch.testing.assert_close(logs["wgan_gp"], penalty.detach())
    hinge = hinge_discriminator_loss(task.discriminator(x), task.discriminator(fake))
    torch.testing.assert_close(loss, hinge + 10.0 * penalty)
    again, _ = task.loss({"image": x, "rng": BatchRandom(0, 4, 1, 8, 0, 8)}, "discriminator", 4)
    assert torch.equal(loss, again)  # nothing from the global RNG
    _, off = task.loss({"image": x, "rng": BatchRandom(0, 5, 1, 8, 0, 8)}, "discriminator", 5)
    assert "wgan_gp" not in off  # every 2nd step only


BAD = [
    (["model.gan={r1_weight: 1.0, penalty: wgan_gp}"], ["model.gan", "r1_weight", "penalty"]),
    (["model.gan.penalty_inputs=interpolates", "model.gan.penalty=r1"], ["model.gan.penalty_inputs"]),
    (["model.gan.penalty=gp"], ["model.gan.penalty"]),
    (["model.gan.penalty_every=0"], ["model.gan.penalty_every"]),
    (["model.gan={r1_weight: lots}"], ["model.gan.r1_weight"]),
    (["model.quantizer={kind: lfq, codebook_size: 500}"], ["model.quantizer", "codebook_size=500", "power of 2"]),
    (["model.quantizer={kind: fsq}"], ["model.quantizer", "levels"]),
    (["model.quantizer={kind: fsq, levels: [1, 4]}"], ["model.quantizer.levels", ">= 2"]),
    (["model.quantizer={kind: fsq, levels: [4, 4], codebook_size: 16}"], ["model.quantizer", "codebook_size"]),
    (["model.quantizer={kind: lfq, ema_update: false}"], ["model.quantizer", "ema_update"]),
    (["model.quantizer={use_cosine_sim: true, ema_update: false}"], ["model.quantizer", "use_cosine_sim"]),
    (["model.quantizer.kind=pq"], ["model.quantizer.kind"]),
    (["model.quantizer.decay=1.0"], ["model.quantizer.decay"]),
    (["model.quantizer.codebook_size=1"], ["model.quantizer.codebook_size"]),
    (["model.norm_num_groups=12"], ["model.norm_num_groups"]),
    (["model.block_out_channels=[16, 16, 16, 16, 16, 16]"], ["data.image_size", "32"]),  # f = 32
    (["model.gan.num_layers=3"], ["model.gan.num_layers"]),
    (["eval.metrics=[judge]"], ["eval.metrics"]),
    (["model.z_channels=0"], ["model.z_channels"]),
]


@pytest.mark.parametrize("overrides,needles", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_config_errors_name_the_field(overrides, needles):
    with pytest.raises(ConfigError) as err:
        load_config("vqgan-debug", overrides)
    assert all(needle in str(err.value) for needle in needles), str(err.value)


@pytest.mark.dist  # several processes: make test-dist
def test_two_processes_match_one(tmp_path):
    """torchrun with 2 CPU processes (gloo): the codebook statistics and dead-code samples are gathered over
    ranks, so the codebook and weights equal a 1-process run on the same global batch (without the GAN,
    whose adaptive weight is measured on each rank's own gradients)."""
    sets = [a for o in ("model.gan=null", "train.steps=3", "train.checkpoint_every=3", "train.sample_every=0",
                        "train.log_every=1") for a in ("--set", o)]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    train = ["-m", "genforge", "train", "vqgan-debug", *sets, "--run-dir"]
    subprocess.run([sys.executable, *train, str(tmp_path / "one")], env=env, check=True, timeout=600)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                    *train, str(tmp_path / "two")], env=env, check=True, timeout=600)
    one, two = (load_file(str(tmp_path / run / "checkpoints" / "step-000003" / "model.safetensors"))
                for run in ("one", "two"))
    assert one.keys() == two.keys() and any("pending" in k for k in one)
    # Adam divides by sqrt(v): where a gradient is near 0, reduction-order noise moves a weight by a
    # fraction of lr (1e-3); 1e-4 is 10% of one step
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-4, msg=k)


def test_training_previews_show_the_ema_and_the_online_reconstructions(tmp_path, monkeypatch):
    """Rows: originals, reconstructions by the EMA weights, by the online weights (muse-maskgit-pytorch's trainer
    saves both); `genforge sample` (no online weights handed in) keeps originals and EMA reconstructions."""
    import genforge.engine.trainer as trainer_module
    from genforge.app.runs import make_trainer

    seen = {}
    write = trainer_module.write_samples
    monkeypatch.setattr(trainer_module, "write_samples",
                        lambda task, cond, images, path: seen.update(cond=dict(cond), images=images) or
                        write(task, cond, images, path))
    cfg = load_config("vqgan-debug", ["train.steps=2", "train.sample_every=2", "train.checkpoint_every=2",
                                      "train.num_samples=4", "eval.every=0"])
    trainer = make_trainer(cfg, tmp_path)
    trainer.fit()
    task, cond = trainer.task.eval(), seen["cond"]
    with torch.no_grad():
        online = task.reconstruct(cond["image"]).clamp(-1, 1)
        with trainer.state.ema.swapped_in():
            ema = task.reconstruct(cond["image"]).clamp(-1, 1)
    assert torch.equal(cond["online"], online) and torch.equal(seen["images"], ema)
    assert not torch.equal(online, ema)  # two steps with a warmed-up EMA decay: different weights
    grid, nrow = task.preview(cond, seen["images"])
    assert nrow == 4 and torch.equal(grid, torch.cat([cond["image"], ema, online]))
    assert (tmp_path / "samples" / "step-000002.png").is_file()
    plain, _ = task.preview({"image": cond["image"]}, ema)
    assert torch.equal(plain, torch.cat([cond["image"], ema]))
