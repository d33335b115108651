"""C-ViViT: shapes, causality in time, ids inside the vocabulary, images as 1-frame videos, config checks, eval."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
import yaml
from short_clips import short_clip_folder, with_garbage
from typer.testing import CliRunner

from genforge.app.config import load_config
from genforge.app.runs import build_task
from genforge.cli import app
from genforge.core.random import BatchRandom
from genforge.data.cache import CacheDataset
from genforge.data.loader import build_dataset, data_info
from genforge.families.cvivit.config import CViViTConfig
from genforge.families.cvivit.model import CViViT
from genforge.nn.attention import PreNormBlock
from genforge.nn.quantizers import QuantizerConfig

runner = CliRunner()
OLD_RUNS = Path(__file__).parents[2] / "fixtures" / "runs-3f8e24e"


def tiny(kind: str = "vq", pixel_norm: bool = False, conv_channels: int = 0, **quantizer) -> CViViT:
    torch.manual_seed(0)
    q = QuantizerConfig(kind=kind, **quantizer)
    cfg = CViViTConfig(dim=32, patch_size=4, temporal_patch_size=2, spatial_depth=1, temporal_depth=2, num_heads=2,
                       quantizer=q, pixel_norm=pixel_norm, stem_channels=conv_channels, head_channels=conv_channels)
    return CViViT(cfg, 3).eval()


def test_shapes_of_codes_and_reconstructions():
    model = tiny(codebook_size=64)
    video = torch.rand(2, 3, 7, 16, 16) * 2 - 1
    ids = model.encode(video)
    assert ids.shape == (2, 4, 4, 4) and ids.dtype == torch.long  # t = 1 + 6/2
    assert model.decode(ids).shape == (2, 3, 7, 16, 16)
    image = video[:, :, 0]
    assert model.encode(image).shape == (2, 1, 4, 4)  # an image is a 1-frame video
    z = model.encode_latent(image)
    assert model.decode_latent(model.quantize(z).zq, image=True).shape == (2, 3, 16, 16)
    with pytest.raises(ValueError, match="1 \\+ k·2 frames"):
        model.encode(torch.zeros(1, 3, 6, 16, 16))


def test_the_encoding_keeps_the_brightness_of_flat_patches():
    dark, light = torch.full((1, 3, 5, 16, 16), -0.5), torch.full((1, 3, 5, 16, 16), 0.5)  # flat grey clips
    model = tiny()
    assert not torch.allclose(model.encode_latent(dark), model.encode_latent(light), atol=1e-3)
    # a LayerNorm over the raw pixels (pixel_norm) maps every flat patch to the same token: the level is lost
    normed = tiny(pixel_norm=True)
    torch.testing.assert_close(normed.encode_latent(dark), normed.encode_latent(light))
    assert [k for k in model.state_dict() if k.startswith("embed_first")] == \
        [k for k in normed.state_dict() if k.startswith("embed_first") and not k.startswith("embed_first.0")]


@pytest.mark.parametrize("conv_channels", [0, 8], ids=["linear ends", "conv stem and head"])
def test_tokens_of_a_frame_do_not_depend_on_later_frames(conv_channels):
    model = tiny(codebook_size=64, conv_channels=conv_channels)
    video = torch.rand(1, 3, 9, 16, 16) * 2 - 1  # token frames: 0 <- frame 0, 1 <- 1-2, 2 <- 3-4, 3 <- 5-6, 4 <- 7-8
    changed = video.clone()
    changed[:, :, 5:] = torch.rand(1, 3, 4, 16, 16) * 2 - 1
    z, z_changed = model.encode_latent(video), model.encode_latent(changed)
    assert torch.equal(z[:, :, :3], z_changed[:, :, :3])  # token frames fed by frames 0-4 only: unchanged
    assert not torch.allclose(z[:, :, 3:], z_changed[:, :, 3:])
    assert torch.equal(model.encode(video)[:, :3], model.encode(changed)[:, :3])
    recon, recon_changed = model.decode(model.encode(video)), model.decode(model.encode(changed))
    assert torch.equal(recon[:, :, :5], recon_changed[:, :, :5])  # the decoder is causal too


def test_the_conv_head_starts_as_the_paper_s_linear_output_and_the_stem_sees_across_patch_borders():
    """model.head_channels: the correction of the conv head starts at zero (its output is the linear map's first
    channels); model.stem_channels: a pixel beside a patch's border changes that patch's embedding."""
    model = tiny(codebook_size=64, conv_channels=8)
    zq = torch.randn(2, 32, 3, 4, 4)
    with_head = model.decode_latent(zq)
    head, model.head = model.head, None
    torch.testing.assert_close(with_head, model.decode_latent(zq)[:, :3])  # the linear map's pixel channels
    model.head = head
    video = torch.zeros(1, 3, 5, 16, 16)
    nudged = video.clone()
    nudged[:, :, 0, 0, 4] = 1.0  # the first pixel of patch (0, 1) of the first frame
    for m, sees in ((model, True), (tiny(codebook_size=64), False)):
        assert (not torch.allclose(m.embed(video)[:, 0, 0, 0], m.embed(nudged)[:, 0, 0, 0])) == sees  # patch (0, 0)


def test_causal_temporal_attention_equals_the_masked_one():
    """The temporal blocks attend causally through SDPA's is_causal; the same weights with the bool tril mask over
    the t token frames (how it was computed before) give the same latents and videos."""
    model = tiny(codebook_size=64)
    video = torch.rand(2, 3, 9, 16, 16) * 2 - 1  # t = 5 token frames
    z = model.encode_latent(video)
    recon = model.decode_latent(model.quantize(z).zq)
    tril = torch.ones(5, 5, dtype=torch.bool).tril()
    for block in [*model.encoder.temporal, *model.decoder.temporal]:
        assert block.attn.causal
        block.attn.causal = False
        block.forward = partial(PreNormBlock.forward, block, mask=tril)
    masked_z = model.encode_latent(video)
    torch.testing.assert_close(masked_z, z, rtol=0, atol=1e-6)
    torch.testing.assert_close(model.decode_latent(model.quantize(z).zq), recon, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind, quantizer", [("vq", {"codebook_size": 64}), ("lfq", {"codebook_size": 32}),
                                             ("fsq", {"levels": [5, 3, 3], "codebook_size": 512})])
def test_ids_always_lie_inside_the_vocabulary(kind, quantizer):
    if kind == "fsq":
        quantizer.pop("codebook_size")
    model = tiny(kind, **quantizer)
    size = model.codebook_size
    video = torch.randn(4, 3, 5, 16, 16) * 3  # far outside the data range
    ids = model.encode(video)
    assert ids.min() >= 0 and ids.max() < size
    assert model.decode(ids).shape == (4, 3, 5, 16, 16)


def test_num_frames_must_fit_the_tubelets():
    with pytest.raises(Exception, match="num_frames - 1 must be divisible by model.temporal_patch_size=2"):
        load_config("cvivit-debug", ["data.video.num_frames=6"])


def test_the_paper_s_losses_are_the_defaults_and_the_former_ones_keys():
    """L2 reconstruction and the perceptual loss at 0.1 (Phenaki) by default, also for a perceptual section that
    names no weight; L1 and 1.0 (the defaults before) by keys; presets keep what they set (cvivit-moving-shapes: L2
    without the perceptual term)."""
    cfg = CViViTConfig()
    assert cfg.reconstruction_loss == "mse" and cfg.perceptual.weight == 0.1
    assert CViViTConfig(perceptual={"network": "vgg16", "weights_path": "w.pth"}).perceptual.weight == 0.1
    former = CViViTConfig(reconstruction_loss="l1", perceptual={"weight": 1.0})
    assert former.reconstruction_loss == "l1" and former.perceptual.weight == 1.0
    shapes, paper = load_config("cvivit-moving-shapes").model, load_config("cvivit-paper").model
    assert (shapes.reconstruction_loss, shapes.perceptual.weight) == ("mse", 0.0)  # L2 measured better (cvivit.md)
    assert (paper.reconstruction_loss, paper.perceptual.weight) == ("mse", 0.1)


def test_a_run_written_before_the_paper_s_defaults_keeps_its_losses(tmp_path):
    """A run's config.yaml holds every field (resolved), so a run trained with the former defaults (L1, perceptual
    1.0) reads back with them and resumes from it unchanged; the same preset command, now L2, is refused (exit 2)
    rather than switching the loss of a run under way."""
    old = yaml.safe_load((OLD_RUNS / "cvivit" / "config.yaml").read_text())  # written by 3f8e24e
    assert old["model"]["reconstruction_loss"] == "l1" and "weight" in old["model"]["perceptual"]
    old["model"]["perceptual"]["weight"] = 1.0  # what a run that left it at its default then wrote
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    model = load_config(str(tmp_path / "old.yaml")).model
    assert (model.reconstruction_loss, model.perceptual.weight) == ("l1", 1.0)

    run = tmp_path / "run"  # trained with the former reconstruction loss
    trained = runner.invoke(app, ["train", "cvivit-debug", "--run-dir", str(run), "--set",
                                  "model.reconstruction_loss=l1", "--set", "train.steps=2", "--set",
                                  "train.checkpoint_every=2"])
    assert trained.exit_code == 0, trained.output
    resumed = runner.invoke(app, ["train", str(run / "config.yaml"), "--run-dir", str(run), "--set", "train.steps=3",
                                  "--set", "train.checkpoint_every=3"])
    assert resumed.exit_code == 0, resumed.output
    assert load_config(str(run / "config.yaml")).model.reconstruction_loss == "l1"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    changed = [r["message"] for r in records if r.get("event") == "config_change"]
    assert len(changed) == 1 and "train.steps: 2 -> 3" in changed[0] and "reconstruction_loss" not in changed[0]
    refused = runner.invoke(app, ["train", "cvivit-debug", "--run-dir", str(run), "--set", "train.steps=4"])
    assert refused.exit_code == 2 and "model.reconstruction_loss: 'l1' -> 'mse'" in refused.stderr


def test_train_evaluate_per_frame_then_phenaki_trains_on_a_video_token_cache(tmp_path):
    run = tmp_path / "run"
    out = runner.invoke(app, ["train", "cvivit-debug", "--run-dir", str(run)])
    assert out.exit_code == 0, out.output
    assert list((run / "samples").glob("*.gif"))  # video previews
    out = runner.invoke(app, ["eval", str(run), "--metrics", "psnr,ssim,codebook", "--n", "4"])
    assert out.exit_code == 0, out.output
    assert "psnr" in out.output and "codebook_usage" in out.output
    cache = tmp_path / "cache"
    out = runner.invoke(app, ["encode", str(run), "--out", str(cache), "--flip", "--set", "data.shapes.n=8"])
    assert out.exit_code == 0, out.output
    manifest = json.loads((cache / "cache.json").read_text())
    assert manifest["kind"] == "tokens" and manifest["shape"] == [3, 4, 4] and manifest["count"] == 8  # [t, h, w]
    phenaki = tmp_path / "phenaki"
    out = runner.invoke(app, ["train", "phenaki-debug", "--run-dir", str(phenaki), "--set", "model.tokens.codec=tokenizer",
                              "--set", f"model.tokens.tokenizer={run}", "--set", "data.source=cache",
                              "--set", f"data.path={cache}"])
    assert out.exit_code == 0, out.output
    assert (phenaki / "samples" / "step-000004.gif").is_file()


def test_a_run_whose_config_lost_its_layout_is_refused_with_exit_2(tmp_path):
    run = tmp_path / "run"
    trained = runner.invoke(app, ["train", "cvivit-debug", "--run-dir", str(run), "--set", "model.pixel_norm=true",
                                  "--set", "train.steps=2", "--set", "train.checkpoint_every=2"])
    assert trained.exit_code == 0, trained.output
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("pixel_norm: true", "pixel_norm: false"))
    out = runner.invoke(app, ["sample", str(run), "--n", "1", "--out", str(tmp_path / "x.gif")])
    assert out.exit_code == 2 and "does not match the model of" in out.stderr and "embed_first.0" in out.stderr
    config.write_text(config.read_text().replace("pixel_norm: false", "pixel_norm: true"))
    again = runner.invoke(app, ["sample", str(run), "--n", "1", "--out", str(tmp_path / "x.gif")])
    assert again.exit_code == 0, again.output


# clips of 5 frames: token frames 0 <- frame 0, 1 <- frames 1-2, 2 <- frames 3-4
FRAME_MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)


def padded_task():
    torch.manual_seed(0)
    cfg = load_config("cvivit-debug", ["data.video.min_frames=1"])  # with its patch GAN on a drawn frame of each clip
    return build_task(cfg, data_info(build_dataset(cfg.data), cfg.data)).train()


def losses_and_grads(task, video, frame_mask):
    """Each phase's loss at step 0 and the gradients it leaves."""
    results = []
    for index, phase in enumerate(task.phases):
        task.zero_grad()
        batch = {"video": video, "frame_mask": frame_mask, "rng": BatchRandom(0, 0, index, 4, 0, 4)}
        loss, _ = task.loss(batch, phase, 0)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in task.named_parameters() if p.grad is not None}))
    return results


def test_padded_frames_never_enter_the_losses_or_the_gradients():
    task = padded_task()
    video = torch.rand(4, 3, 5, 16, 16) * 2 - 1
    first, second = (losses_and_grads(task, with_garbage(video, FRAME_MASK, seed), FRAME_MASK) for seed in (1, 2))
    for (loss_a, grads_a), (loss_b, grads_b) in zip(first, second):  # generator, discriminator
        torch.testing.assert_close(loss_a, loss_b, rtol=1e-6, atol=1e-7)
        assert grads_a.keys() == grads_b.keys() and grads_a
        for name in grads_a:
            torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7, msg=name)
    # the same garbage seen as real frames does change the loss: the test can tell
    everything = torch.ones_like(FRAME_MASK)
    unmasked = [losses_and_grads(task, with_garbage(video, FRAME_MASK, seed), everything)[0][0] for seed in (1, 2)]
    assert not torch.allclose(*unmasked)
    # a tubelet mixing real and padded frames is padding: clip 1 (real 0-2) keeps frames 0-2, clip 2 (0-1) frame 0
    assert task.loss_frames(FRAME_MASK).sum(1).tolist() == [5, 3, 1, 1]


def test_the_padded_reconstruction_loss_is_normalised_over_the_global_batch():
    task = padded_task()
    video = torch.rand(4, 3, 5, 16, 16) * 2 - 1
    recon = video + 0.1 * torch.randn_like(video)
    keep = task.loss_frames(FRAME_MASK)
    whole, _ = task.reconstruction_loss(recon, video, {"rng": BatchRandom(0, 0, 0, 4, 0, 4), "frame_mask": FRAME_MASK},
                                        keep)
    halves = [task.reconstruction_loss(recon[o : o + 2], video[o : o + 2],
                                       {"rng": BatchRandom(0, 0, 0, 4, o, 2), "frame_mask": FRAME_MASK[o : o + 2],
                                        "global_batch": {"frame_mask": FRAME_MASK}}, keep[o : o + 2])[0]
              for o in (0, 2)]
    torch.testing.assert_close((halves[0] + halves[1]) / 2, whole)  # the trainer averages micro-batches
    kept = recon.transpose(1, 2)[keep] - video.transpose(1, 2)[keep]
    torch.testing.assert_close(whole, kept.abs().mean() if task.cfg.reconstruction_loss == "l1" else kept.pow(2).mean())
    with pytest.raises(ValueError, match="global_batch"):
        task.reconstruction_loss(recon[:2], video[:2], {"rng": BatchRandom(0, 0, 0, 4, 0, 2),
                                                        "frame_mask": FRAME_MASK[:2]}, keep[:2])


def test_a_short_clip_trains_padded_and_its_token_cache_keeps_the_frame_mask(tmp_path):
    data, run, cache = short_clip_folder(tmp_path / "clips"), tmp_path / "run", tmp_path / "cache"
    clips = ["--set", "data.source=video_folder", "--set", f"data.path={data}", "--set", "data.video.min_frames=2"]
    out = runner.invoke(app, ["train", "cvivit-debug", "--run-dir", str(run), *clips, "--set", "train.steps=2",
                              "--set", "train.checkpoint_every=2", "--set", "train.sample_every=2"])
    assert out.exit_code == 0, out.output
    assert not (run / "skipped.jsonl").exists()  # the 3-frame clip is trained on, not skipped
    out = runner.invoke(app, ["encode", str(run), "--out", str(cache)])
    assert out.exit_code == 0, out.output
    masks = CacheDataset(cache).frame_masks
    assert masks.shape == (5, 5) and sorted(masks.sum(1).tolist()) == [3, 5, 5, 5, 5]
    phenaki = tmp_path / "phenaki"
    out = runner.invoke(app, ["train", "phenaki-debug", "--run-dir", str(phenaki), "--set", "model.tokens.codec=tokenizer",
                              "--set", f"model.tokens.tokenizer={run}", "--set", "data.source=cache",
                              "--set", f"data.path={cache}", "--set", "train.steps=2", "--set", "train.sample_every=2",
                              "--set", "train.checkpoint_every=2"])
    assert out.exit_code == 0, out.output
