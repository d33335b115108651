"""dalle2_decoder as Ramesh et al. 2022 define it: unconditional attention-free upsamplers, the low-res blur on half
of the rows (DALLE2-pytorch's σ) without CDM's noise augmentation, dynamic thresholding in the presets, the laion
preset's upsampler sampled and averaged as App. C's table, the text encoder owned by one phase, one normalisation of
every image embedding, and runs written before these defaults keeping what they trained with."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from torch import Tensor
from webdataset import TarWriter

from genforge.app.config import config_from_dict, load_config
from genforge.app.runs import build_task, make_trainer
from genforge.core.random import BatchRandom
from genforge.nn.unet import AttentionBlock
from genforge.families.dalle2_decoder.config import Dalle2SampleOptions
from genforge.families.dalle2_decoder.model import gaussian_blur, resize

PRESET = "dalle2-decoder-debug"
FIXTURE = Path(__file__).parents[2] / "fixtures" / "runs-3f8e24e" / "dalle2_decoder"
EMBEDDING_LAYERS = ("null_image_embed", "image_to_emb", "image_to_tokens", "null_text", "text_to_context",
                    "context_norm")


def _task(*overrides: str):
    torch.manual_seed(0)
    cfg = load_config(PRESET, list(overrides))
    return cfg, build_task(cfg)


def _layers(unet) -> set[str]:
    return {name.split(".")[0] for name, _ in unet.named_parameters()}


# ------------------------------------------------------------------------------------- 1. the upsamplers


def test_an_upsampler_with_conditioning_off_has_no_embedding_inputs():
    """The paper's upsampler (model.stages[1].conditioned defaults to false): no image-embedding or text layers at
    all, no attention (the preset's mid_attention: false), its forward refuses an embedding, and its training loss
    calls it with the low-res image alone; the base stage keeps all of them."""
    cfg, task = _task("model.text.kind=tiny", "model.text.dim=16", "model.text.heads=2", "model.text.depth=1")
    assert [s.conditioned for s in cfg.model.stages] == [True, False]  # None resolved: first stage only
    base, up = task.cascade[0], task.cascade[1]
    assert set(EMBEDDING_LAYERS) <= _layers(base)
    assert not set(EMBEDDING_LAYERS) & _layers(up) and up.image_embed_dim == 0 and up.text_dim == 0
    assert not any(isinstance(m, AttentionBlock) for m in up.modules())
    x, t, low = torch.randn(2, 3, 16, 16), torch.tensor([3, 7]), torch.randn(2, 3, 8, 8)
    with pytest.raises(ValueError, match="without the conditioning \\['image_embed'\\]"):
        up(x, t, lowres=low, image_embed=torch.randn(2, 12))
    calls = []
    up.register_forward_pre_hook(lambda m, args, kwargs: calls.append(set(kwargs)), with_kwargs=True)
    batch = {"image": torch.rand(4, 3, 16, 16) * 2 - 1, "text": ["a"] * 4, "rng": BatchRandom(0, 0, 1, 4, 0, 4)}
    loss, _ = task.loss(batch, "unet2", 0)
    assert torch.isfinite(loss) and calls == [{"lowres", "lowres_noise_level"}]


def test_the_first_stage_must_be_conditioned():
    with pytest.raises(Exception, match="model.stages\\[0\\].conditioned=false"):
        load_config(PRESET, ["model.stages.0.conditioned=false"])


# -------------------------------------------------------------------------------------------- 2. blur_prob


def _blurred_rows(blur_prob: float, n: int = 512, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Rows of a batch of n whose low-res input the blur changed, and the rows drawn to be blurred."""
    _, task = _task(f"model.stages.1.blur_prob={blur_prob}")
    image = torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
    torch.manual_seed(seed)  # global RNG: must not matter
    low = task.draw_lowres(BatchRandom(7, 3, 1, n, 0, n), 1)
    blurred = task.lowres_input(image, 1, low["noise"], low["level"], low["sigma"], low["blur"])["lowres"]
    clean = task.lowres_input(image, 1, low["noise"], low["level"], sigma=None)["lowres"]
    return (blurred != clean).flatten(1).any(1), low["blur"]


def test_blur_is_applied_to_about_half_of_the_rows_drawn_from_the_batch_stream():
    """blur_prob 0.5 (the default): of 512 rows the blur changes a Binomial(512, 0.5) number (within 4 standard
    deviations of 256), exactly the rows drawn; the others are the clean low-res image, as at sampling. The draw is
    the batch's random stream's (the same whatever the global RNG); 1 blurs every row (the former behaviour), 0
    none."""
    changed, drawn = _blurred_rows(0.5)
    assert torch.equal(changed, drawn)
    assert abs(int(changed.sum()) - 256) <= 4 * math.sqrt(512 * 0.25)
    again, _ = _blurred_rows(0.5, seed=123)
    assert torch.equal(again, changed)
    assert bool(_blurred_rows(1.0)[0].all()) and not bool(_blurred_rows(0.0)[0].any())


def test_blur_prob_one_draws_as_before_so_the_former_training_is_kept():
    """blur_prob is drawn after every draw the upsampler made before it existed: with blur_prob 1, a conditioned
    upsampler and the former noise augmentation the loss is the former one, computed here by hand as the former code
    did."""
    cfg, task = _task("model.stages.1.conditioned=true", "model.stages.1.blur_prob=1.0",
                      "model.stages.1.lowres_noise_max=0.2")
    image = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(2)) * 2 - 1
    loss, _ = task.loss({"image": image, "rng": BatchRandom(0, 4, 1, 8, 0, 8)}, "unet2", 4)
    rng, stage = BatchRandom(0, 4, 1, 8, 0, 8), cfg.model.stages[1]
    x0 = image
    time, noise = task.objectives[1].draw(rng, x0)
    image_keep, text_keep = rng.rand() >= cfg.model.image_embed_dropout, rng.rand() >= cfg.model.text_dropout
    kwargs = task.conditioning({"image": image}, task.image_embeds({"image": image}), image_keep, text_keep)
    lo, hi = stage.blur_sigma
    sigma = lo + (hi - lo) * rng.rand()
    level = (rng.rand() * stage.lowres_noise_max * 1000).long()
    kwargs.update(task.lowres_input(image, 1, rng.randn(3, 8, 8), level, sigma))  # every row blurred
    former = task.objectives[1].training_losses(task.cascade[1], x0, time, noise, model_kwargs=kwargs)["loss"].mean()
    assert torch.equal(loss, former)


# ------------------------------------------------------------------------------ 3. dynamic thresholding


@pytest.mark.parametrize("preset", ["dalle2-decoder-debug", "dalle2-decoder-shapes", "dalle2-decoder-laion"])
def test_presets_threshold_the_guided_base_stage_and_keep_paper_upsamplers(preset):
    """Every preset: a guided base stage with dynamic thresholding, upsamplers blurred in half of the rows; the
    paper's unconditional attention-free upsamplers except on 32 px shapes, where a 16 px base image does not hold
    the shape's kind and the upsampler is conditioned and guided (docs/dalle2_prior.md)."""
    cfg = load_config(preset)
    base, *ups = cfg.model.stages
    assert base.conditioned and base.diffusion.dynamic_threshold == 0.95 and base.diffusion.cfg_scale > 1
    for up in ups:
        assert up.blur_prob == 0.5
        if preset == "dalle2-decoder-shapes":
            assert up.conditioned and up.diffusion.cfg_scale == 1.5 and up.unet.attention_levels == (2,)
        else:
            assert not up.conditioned and up.unet.attention_levels == () and not up.unet.mid_attention


def test_the_base_stage_samples_with_dynamic_thresholding():
    """A saturated base model: the debug preset's sampling (dynamic_threshold 0.95) differs from the static clip."""
    cfg, task = _task()
    with torch.no_grad():
        for p in task.cascade[0].parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    task.eval()
    cond = task.sample_conditions(2, torch.Generator().manual_seed(0), task.resolve())
    dynamic = task.sample(cond, torch.Generator().manual_seed(0), 2, task.resolve(Dalle2SampleOptions(stop_stage=1)))
    _, static_task = _task("model.stages.0.diffusion.dynamic_threshold=null")
    static_task.load_state_dict(task.state_dict())
    static_task.eval()
    static = static_task.sample(cond, torch.Generator().manual_seed(0), 2,
                                static_task.resolve(Dalle2SampleOptions(stop_stage=1)))
    assert not torch.equal(dynamic, static)


# -------------------------------------------------------------------------------- 4. the text encoder's phase


TEXT = ["model.text.kind=tiny", "model.text.dim=16", "model.text.heads=2", "model.text.depth=1",
        "model.stages.1.conditioned=true"]


def test_only_the_text_phases_optimizer_gets_the_text_encoder():
    _, task = _task(*TEXT)
    text = {id(p) for p in task.text_encoder.parameters()}
    assert text <= {id(p) for p in task.parameters_for("unet1")}
    assert not text & {id(p) for p in task.parameters_for("unet2")}
    _, task = _task(*TEXT, "model.text_phase=2")
    assert text.isdisjoint({id(p) for p in task.parameters_for("unet1")})
    assert {id(p) for p in task.text_encoder.parameters()} <= {id(p) for p in task.parameters_for("unet2")}
    with pytest.raises(Exception, match="model.text_phase=2: model.stages\\[1\\] is not conditioned"):
        load_config(PRESET, [*TEXT[:4], "model.text_phase=2"])


def _checkpoint(run: Path, step: int) -> tuple[dict, dict]:
    folder = run / "checkpoints" / f"step-{step:06d}"
    return load_file(str(folder / "model.safetensors")), load_file(str(folder / "ema.safetensors"))


def test_the_text_encoder_of_a_run_that_does_not_train_its_phase_does_not_change(tmp_path):
    """model.text_phase=1 (the default): a run trained with model.train_unets=[1] trains the encoder; resumed with
    [2], where unet2 reads its encodings, the encoder's weights and EMA stay exactly as loaded."""
    # 3 steps: the zero-initialised output layers of the U-Net pass no gradient to the encoder before its third
    base = [*TEXT, "train.checkpoint_every=3", "train.sample_every=0", "eval.every=0"]
    trainer = make_trainer(load_config(PRESET, [*base, "train.steps=3", "model.train_unets=[1]"]), tmp_path)
    initial = {k: v.clone() for k, v in trainer.task.text_encoder.state_dict().items()}
    trainer.fit()
    make_trainer(load_config(PRESET, [*base, "train.steps=6", "model.train_unets=[2]"]), tmp_path).fit()
    (model_3, ema_3), (model_6, ema_6) = _checkpoint(tmp_path, 3), _checkpoint(tmp_path, 6)
    text = [k for k in model_3 if k.startswith("text_encoder.")]
    assert text and all(torch.equal(model_3[k], model_6[k]) for k in text)
    assert any(k in ema_3 for k in text) and all(torch.equal(ema_3[k], ema_6[k]) for k in text if k in ema_3)
    assert not all(torch.equal(model_3[k], initial[k.removeprefix("text_encoder.")]) for k in text)  # unet1 trained it
    unet2 = [k for k in model_3 if k.startswith("cascade.unets.1.")]
    assert not all(torch.equal(model_3[k], model_6[k]) for k in unet2)


# ----------------------------------------------------------- 5. the upsamplers' low-res input, and their sampling


def _unet_inputs(task, stage: int) -> list[dict]:
    """The keyword inputs of every forward of the cascade's U-Net `stage`, recorded as the task calls it."""
    calls: list[dict] = []
    task.cascade[stage].register_forward_pre_hook(lambda m, args, kw: calls.append(kw), with_kwargs=True)
    return calls


def test_the_built_upsampler_is_blurred_as_dalle2_pytorch_and_not_noise_augmented():
    """The defaults of the built family (the debug preset sets none of these keys): CDM's noise augmentation off
    (DALL·E 2 App. C; DALLE2-pytorch's use_noise_for_lowres_cond=False), blur σ 0.6 with a 3-tap kernel
    (DALLE2-pytorch's; the paper gives none). In training every row of the U-Net's low-res input is the resized
    image, clean or blurred by σ 0.6, with no noise, and the U-Net is told level 0; in sampling it is the previous
    stage's image as it is."""
    cfg, task = _task()
    up = task.cfg.stages[1]
    assert up.lowres_noise_max is None and up.lowres_noise_sample is None
    assert up.blur_sigma == (0.6, 0.6) and up.blur_kernel == 3 and up.degradation == "blur"
    calls = _unet_inputs(task, 1)
    image = torch.rand(64, 3, 16, 16, generator=torch.Generator().manual_seed(4)) * 2 - 1
    task.loss({"image": image, "rng": BatchRandom(0, 0, 1, 64, 0, 64)}, "unet2", 0)
    low = resize(image, 8)
    blurred = gaussian_blur(low, torch.full((64,), 0.6), 3)
    seen = calls[0]["lowres"]
    clean_rows = (seen == low).flatten(1).all(1)
    blurred_rows = torch.isclose(seen, blurred, atol=1e-6).flatten(1).all(1)
    assert bool((clean_rows | blurred_rows).all()) and clean_rows.any() and blurred_rows.any()
    assert torch.equal(calls[0]["lowres_noise_level"], torch.zeros(64))
    task.eval()
    given = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(5)) * 2 - 1
    task.sample({"image": given}, torch.Generator().manual_seed(0), 2,
                task.resolve(Dalle2SampleOptions(start_stage=2)))
    assert len(calls) > 1 and all(torch.equal(c["lowres"], given) for c in calls[1:])
    assert all(torch.equal(c["lowres_noise_level"], torch.zeros(2)) for c in calls[1:])


def test_cdm_noise_augmentation_is_an_option():
    """lowres_noise_max set: the training input is noised (neither clean nor blurred) at levels below it, and
    sampling uses lowres_noise_sample, 0.05 when unset (written resolved); a sampling level without the augmentation
    is refused naming both keys."""
    cfg, task = _task("model.stages.1.lowres_noise_max=0.2")
    assert cfg.model.stages[1].lowres_noise_sample == 0.05
    assert cfg.model_dump(mode="json")["model"]["stages"][1]["lowres_noise_sample"] == 0.05
    calls = _unet_inputs(task, 1)
    image = torch.rand(64, 3, 16, 16, generator=torch.Generator().manual_seed(4)) * 2 - 1
    task.loss({"image": image, "rng": BatchRandom(0, 0, 1, 64, 0, 64)}, "unet2", 0)
    level = calls[0]["lowres_noise_level"]
    assert level.max() < 200 and level.max() > 0
    assert not (calls[0]["lowres"] == resize(image, 8)).flatten(1).all(1).any()
    with pytest.raises(Exception, match="lowres_noise_sample=0.1 .*lowres_noise_max unset"):
        load_config(PRESET, ["model.stages.1.lowres_noise_sample=0.1"])


def test_the_laion_preset_samples_and_averages_its_upsampler_as_the_papers_table():
    """dalle2-decoder-laion, as built: the 64 -> 256 upsampler samples with DDIM in 27 steps and its phase averages
    its weights with EMA decay 0.9999 (DALL·E 2 App. C's table), is not noise-augmented and blurs with σ 0.6; the
    base stage keeps DALLE2-pytorch's example (250 steps, EMA 0.99)."""
    cfg = load_config("dalle2-decoder-laion")
    base, up = cfg.model.stages
    assert (up.diffusion.sampler, up.diffusion.sample_steps) == ("ddim", 27)
    assert cfg.train.for_phase("unet2").ema_decay == 0.9999 and cfg.train.for_phase("unet1").ema_decay == 0.99
    assert up.lowres_noise_max is None and up.blur_sigma == (0.6, 0.6) and up.blur_kernel == 3
    assert base.diffusion.sample_steps == 250


# -------------------------------------------------------------------------------- 6. embedding normalisation


def _png(value: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (value % 256, 40, 200 - value % 200)).save(out, format="PNG")
    return out.getvalue()


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _embedding_shards(root: Path, n: int = 16, dim: int = 6) -> str:
    """One shard of n records: png + an unnormalised .npy embedding (norms 3..10) + a caption."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with TarWriter(str(root / "part-000.tar")) as sink:
        for i in range(n):
            embed = rng.normal(size=dim).astype(np.float32)
            embed *= (3 + 7 * rng.random()) / np.linalg.norm(embed)
            sink.write({"__key__": f"r{i:04d}", "png": _png(i), "npy": _npy(embed), "txt": f"record {i}"})
    return str(root / "part-000.tar")


@pytest.mark.parametrize("normalize", [True, False])
def test_data_embeddings_are_normalised_like_the_embedders(tmp_path, normalize):
    """model.embedder.source=data: the .npy embeddings as stored (norms 3..10) reach the U-Net L2-normalised, in
    training and in sampling, as the embedders' and prompts' do; model.embedder.normalize=false: as stored."""
    shards = _embedding_shards(tmp_path / "shards")
    cfg = load_config(PRESET, ["model.embedder.source=data", "model.embedder.dim=6", "data.source=shards",
                               f"data.path={shards}", f"model.embedder.normalize={normalize}"])
    trainer = make_trainer(cfg, tmp_path / "run")
    task, seen = trainer.task, []
    task.cascade[0].register_forward_pre_hook(lambda m, args, kw: seen.append(kw["image_embed"]), with_kwargs=True)
    batch = next(trainer.batches())
    stored = batch["image_embed"].float()
    assert (stored.norm(dim=-1) > 2.5).all()
    batch["rng"] = BatchRandom(0, 0, 0, len(stored), 0, len(stored))
    task.loss(batch, "unet1", 0)
    task.eval()
    task.sample({"image_embed": stored[:2]}, torch.Generator().manual_seed(0), 2,
                task.resolve(Dalle2SampleOptions(stop_stage=1)))
    expected = torch.nn.functional.normalize(stored, dim=-1) if normalize else stored
    assert torch.allclose(seen[0], expected, atol=1e-6)
    # every sampling step (guided: the batch twice, the second half with the null embedding selected by image_keep)
    assert len(seen) > 1 and all(torch.allclose(s, expected[:2].repeat(len(s) // 2, 1), atol=1e-6) for s in seen[1:])


# ------------------------------------------------------------------------------------------ former runs


def test_a_run_written_before_the_paper_defaults_keeps_its_cascade():
    """A resolved config.yaml without the new keys (a run of commit 3f8e24e): both stages conditioned, every row
    blurred, embeddings as their source gives them; a config written today resolves the new keys and reads back
    as it is."""
    old = load_config(str(FIXTURE / "config.yaml"))
    assert [s.conditioned for s in old.model.stages] == [True, True]
    assert [s.blur_prob for s in old.model.stages] == [1.0, 1.0] and not old.model.embedder.normalize
    assert old.model.stages[1].diffusion.dynamic_threshold is None
    # and the upsampler's input as it trained: CDM's noise augmentation on (0.2, sampled at 0.05), σ in [0.4, 0.6]
    assert [(s.lowres_noise_max, s.lowres_noise_sample, s.blur_sigma) for s in old.model.stages] == \
        [(0.2, 0.05, (0.4, 0.6))] * 2
    new = load_config(PRESET)
    dumped = new.model_dump(mode="json")
    assert [s["conditioned"] for s in dumped["model"]["stages"]] == [True, False]
    assert config_from_dict(dumped) == new
