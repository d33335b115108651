import math

import pytest
import torch
import torch.nn.functional as F

from pathlib import Path

from genforge.app.runs import build_task
from genforge.app.config import ConfigError, config_from_dict, load_config, to_yaml
from genforge.app.migrations import migrate
from genforge.families.dvae.config import DVAEConfig
from genforge.data.loader import DataInfo, scan_data_info
from genforge.core.random import BatchRandom
from genforge.families.dvae.task import gumbel_softmax, kl_to_uniform
from genforge.core.codec import TokenCodec

FIXTURES = Path(__file__).parents[2] / "fixtures"


def build(overrides=(), data=None):
    torch.manual_seed(0)
    cfg = load_config("dvae-debug", list(overrides))
    return cfg, build_task(cfg, data or scan_data_info(cfg.data))


def images(n=4, size=16, channels=3):
    return torch.rand(n, channels, size, size, generator=torch.Generator().manual_seed(1)) * 2 - 1


# ------------------------------------------------------------------------------------------- codec
def test_encode_decode_shapes_and_id_range():
    cfg, task = build()
    codec = task.codec()
    assert isinstance(codec, TokenCodec) and codec.downsample == 4 and codec.codebook_size == 32
    with torch.no_grad():
        ids = codec.encode(images())
        assert ids.shape == (4, 4, 4) and ids.dtype == torch.long
        assert ids.min() >= 0 and ids.max() < 32
        out = codec.decode(ids)
        assert out.shape == (4, 3, 16, 16)
        one_hot = F.one_hot(ids, 32).permute(0, 3, 1, 2).float()
        torch.testing.assert_close(codec.decode_soft(one_hot), out)  # decode = decode_soft of the one-hots


def test_rgba_needs_four_channel_data():
    with pytest.raises(ValueError, match=r"model\.channels=4"):
        build(["model.channels=4"])
    _, task = build(["model.channels=4"], data=DataInfo(num_classes=0, channels=4, image_size=16))
    with torch.no_grad():
        assert task.codec().decode(task.codec().encode(images(channels=4))).shape == (4, 4, 16, 16)


# -------------------------------------------------------------------------------------- schedules
def test_default_temperature_schedule_is_dalles_cosine_from_1_to_1_16_over_150k_steps():
    cfg = DVAEConfig()
    assert (cfg.temperature_schedule, cfg.temperature_start, cfg.temperature_min, cfg.temperature_anneal_steps) == \
        ("cosine", 1.0, 1 / 16, 150_000)
    expected = {0: 1.0, 1_000: 0.99989720, 10_000: 0.98975669, 100_000: 0.296875}
    for step, tau in expected.items():
        formula = 1 / 16 + (1 - 1 / 16) * 0.5 * (1 + math.cos(math.pi * step / 150_000))
        assert cfg.temperature(step) == pytest.approx(formula, rel=1e-12) == pytest.approx(tau, abs=1e-8)
    assert cfg.temperature(150_000) == cfg.temperature(10 ** 7) == 1 / 16


def test_exponential_temperature_schedule_is_geometric_between_start_and_min():
    cfg = DVAEConfig(temperature_schedule="exponential", temperature_start=2.0, temperature_min=0.125,
                     temperature_anneal_steps=400)
    assert cfg.temperature(0) == 2.0
    assert cfg.temperature(100) == pytest.approx(1.0) and cfg.temperature(200) == pytest.approx(0.5)  # ×½ per 100
    assert cfg.temperature(400) == pytest.approx(0.125) and cfg.temperature(4000) == pytest.approx(0.125)


def test_old_run_configs_keep_the_legacy_formula():
    """A config.yaml written before temperature_schedule existed sets anneal_rate (every field is resolved) and no
    schedule: it trains on with τ = max(min, start · exp(−rate · step)), and its resolved config says so."""
    for fixture in ("runs-42ccac9", "runs-3f8e24e"):
        cfg = load_config(str(FIXTURES / fixture / "dvae" / "config.yaml"))
        assert cfg.model.temperature_schedule == "legacy_exp"
        assert [cfg.model.temperature(s) for s in (0, 3, 8)] == [1.0, math.exp(-0.3), 0.5]
        assert "temperature_schedule: legacy_exp" in to_yaml(cfg)
    resolved = {"family": "dvae", "anneal_rate": 1e-6, "temperature_start": 1.0, "temperature_min": 0.5,
                "num_tokens": 32, "codebook_dim": 8, "hidden_dim": 8, "num_layers": 2}
    assert migrate({"model": resolved})["model"]["temperature_schedule"] == "legacy_exp"
    assert "temperature_schedule" not in migrate({"model": {"family": "dvae", "temperature_min": 0.5}})["model"]
    assert DVAEConfig.model_validate({"anneal_rate": 0.1, "temperature_schedule": "legacy_exp"}).temperature(1) == \
        math.exp(-0.1)


def test_a_new_config_setting_anneal_rate_alone_is_refused_naming_both_schedules():
    """anneal_rate is the rate of legacy_exp and of the seed's compounding schedule, which differ by far (τ 0.99 and
    0.61 after 10 000 steps at 1e-6): a hand-written config must say which."""
    with pytest.raises(ConfigError) as refused:
        config_from_dict({"model": {"family": "dvae", "anneal_rate": 1e-6}})
    message = str(refused.value)
    assert "model.anneal_rate" in message and "compounding" in message and "legacy_exp" in message
    assert config_from_dict({"model": {"family": "dvae", "anneal_rate": 1e-6, "temperature_schedule":
                                       "compounding"}}).model.temperature_schedule == "compounding"


def test_compounding_is_the_seeds_loop_and_far_from_the_closed_form():
    """DALLE-pytorch train_vae.py: after the step of global step g with g % 100 == 0, τ = max(τ·exp(−r·g), τ_min)
    (epochs of a multiple of 100 steps); the formula equals that loop, and beside DALL·E's cosine and the closed
    form it gives τ(0, 1k, 10k, 100k) = 1, 0.9955, 0.6096, 1/16 at the seed's r = 1e-6 and τ_min = 1/16."""
    r, floor = 1e-6, 1 / 16
    seed = DVAEConfig(temperature_schedule="compounding", anneal_rate=r, temperature_min=floor)
    temp, used = 1.0, []
    for g in range(12_001):  # the seed's loop: the temperature each step trains with, then its anneal
        used.append(temp)
        if g % 100 == 0:
            temp = max(temp * math.exp(-r * g), floor)
    assert all(seed.temperature(g) == pytest.approx(t, rel=1e-12) for g, t in enumerate(used))
    closed = DVAEConfig(temperature_schedule="legacy_exp", anneal_rate=r, temperature_min=floor)
    table = {s: (seed.temperature(s), closed.temperature(s), DVAEConfig().temperature(s))
             for s in (0, 1_000, 10_000, 100_000)}
    assert table[0] == (1.0, 1.0, 1.0)
    assert table[1_000] == pytest.approx((math.exp(-r * 100 * 45), math.exp(-r * 1_000), 0.99990), abs=1e-5)
    assert table[10_000] == pytest.approx((0.60957, 0.99005, 0.98976), abs=1e-5)
    assert table[100_000] == pytest.approx((floor, 0.90484, 0.29688), abs=1e-5)


@pytest.mark.parametrize("epoch", [1, 50, 130, 250, 625])
def test_compounding_counts_its_100_batches_within_each_epoch_as_the_seed(epoch):
    """DALLE-pytorch train_vae.py anneals after each batch whose index i within its epoch has i % 100 == 0, by
    exp(−r·g) at the global step g: `anneal_epoch_steps` = its batches per epoch gives that loop step by step."""
    r, floor = 1e-5, 1 / 16
    seed = DVAEConfig(temperature_schedule="compounding", anneal_rate=r, temperature_min=floor,
                      anneal_epoch_steps=epoch)
    temp, g = 1.0, 0
    while g < 3_000:
        for i in range(epoch):  # the seed's loop: the temperature each step trains with, then its anneal
            assert seed.temperature(g) == pytest.approx(temp, rel=1e-12), (g, i)
            if i % 100 == 0:
                temp = max(temp * math.exp(-r * g), floor)
            g += 1


def test_compounding_epochs_of_a_multiple_of_100_steps_are_the_endless_count_and_625_the_documented_one():
    def tau(**epoch):
        return DVAEConfig(temperature_schedule="compounding", anneal_rate=1e-6, temperature_min=1 / 16, **epoch)

    assert all(tau(anneal_epoch_steps=300).temperature(s) == tau().temperature(s) for s in range(0, 30_000, 7))
    shapes = tau(anneal_epoch_steps=625)  # docs/dvae.md: 20 000 images at batch 32
    assert (shapes.temperature(1_000), shapes.temperature(10_000)) == pytest.approx((0.99481, 0.57201), abs=1e-5)
    assert shapes.temperature(22_275) > 1 / 16 == shapes.temperature(22_276)
    assert tau().temperature(23_500) > 1 / 16 == tau().temperature(23_501)


def test_a_new_runs_resolved_config_keeps_its_schedule(tmp_path):
    cfg = load_config("dvae-debug", ["model.temperature_schedule=exponential"])
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))  # holds anneal_rate (its default) and the schedule
    assert load_config(str(tmp_path / "config.yaml")).model == cfg.model


def test_temperature_schedule_legacy_start_decay_floor():
    cfg = load_config("dvae-debug", ["model.temperature_schedule=legacy_exp", "model.temperature_start=2.0",
                                     "model.temperature_min=0.25", "model.temperature_anneal_steps=150000",
                                     "model.anneal_rate=0.01"]).model
    assert cfg.temperature(0) == 2.0
    assert cfg.temperature(50) == pytest.approx(2.0 * math.exp(-0.5))
    assert cfg.temperature(100) < cfg.temperature(50) < cfg.temperature(0)
    floor_step = math.ceil(math.log(2.0 / 0.25) / 0.01)
    assert cfg.temperature(floor_step) == 0.25 and cfg.temperature(10 ** 6) == 0.25
    assert cfg.temperature(floor_step - 2) > 0.25


def test_kl_weight_warmup_is_linear_then_constant():
    cfg = load_config("dvae-debug", ["model.kl_weight=0.5", "model.kl_warmup_steps=10"]).model
    assert [cfg.kl_weight_at(s) for s in (0, 5, 10, 11, 1000)] == [0.0, 0.25, 0.5, 0.5, 0.5]
    assert load_config("dvae-debug", ["model.kl_warmup_steps=0"]).model.kl_weight_at(0) == 0.01


def test_regulariser_is_the_warmed_up_weight_times_the_kl():
    _, task = build(["model.kl_weight=0.5", "model.kl_warmup_steps=4"])
    for step, weight in ((0, 0.0), (2, 0.25), (9, 0.5)):
        _, regulariser, logs = task.autoencode(images(), BatchRandom(0, step, 0, 4, 0, 4), step)
        assert logs["kl_weight"].item() == weight
        torch.testing.assert_close(regulariser, weight * logs["kl"])


def test_checkpoint_state_is_the_schedule_at_the_next_step_and_round_trips(status):
    cfg, task = build()
    assert task.state_for_checkpoint() == {"step": 0, "temperature": 1.0, "kl_weight": 0.0}
    task.train()
    task.loss({"image": images(8), "rng": BatchRandom(0, 7, 0, 8, 0, 8)}, "main", 7)
    state = task.state_for_checkpoint()
    assert state == {"step": 8, "temperature": cfg.model.temperature(8), "kl_weight": cfg.model.kl_weight_at(8)}
    assert state["temperature"] == 0.5  # the preset's cosine reaches temperature_min at step 4
    task.eval()  # evaluation and previews do not move the schedule
    with torch.no_grad():
        task.loss({"image": images(8), "rng": BatchRandom(0, 20, 0, 8, 0, 8)}, "main", 20)
    assert task.state_for_checkpoint() == state

    _, resumed = build()
    resumed.load_state_from_checkpoint(state)
    assert resumed.state_for_checkpoint() == state and resumed.temperature() == state["temperature"]
    assert status.text == ""
    _, changed = build(["model.temperature_min=0.1"])  # a changed schedule is reported, and the new one used
    changed.load_state_from_checkpoint(state)
    assert "temperature at step 8" in status.text
    assert changed.temperature() == 0.1


# ----------------------------------------------------------------------------- Gumbel-softmax, KL
def test_straight_through_samples_are_one_hot_and_pass_gradients():
    logits = torch.randn(3, 10, 2, 2, requires_grad=True)
    uniform = torch.rand(3, 10, 2, 2, generator=torch.Generator().manual_seed(0))
    hard = gumbel_softmax(logits, uniform, 0.7, hard=True)
    assert set(hard.detach().unique().tolist()) == {0.0, 1.0} and torch.equal(hard.sum(1), torch.ones(3, 2, 2))
    soft = gumbel_softmax(logits, uniform, 0.7, hard=False)
    assert torch.equal(hard.argmax(1), soft.argmax(1))  # the hard sample is the soft one's argmax
    gumbel = -torch.log(-torch.log(uniform))
    assert torch.equal(hard.argmax(1), (logits + gumbel).argmax(1))  # a Gumbel-max sample
    (hard * torch.randn(3, 10, 2, 2)).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_soft_samples_are_distributions_that_harden_as_the_temperature_falls():
    logits = torch.randn(2, 8, 3, 3)
    uniform = torch.rand(2, 8, 3, 3, generator=torch.Generator().manual_seed(0))
    warm, cold = gumbel_softmax(logits, uniform, 5.0, False), gumbel_softmax(logits, uniform, 0.01, False)
    torch.testing.assert_close(warm.sum(1), torch.ones(2, 3, 3))
    assert warm.max(1).values.max() < 0.9 and cold.max(1).values.min() > 0.99
    assert torch.isfinite(gumbel_softmax(logits, torch.zeros_like(uniform), 1.0, False)).all()  # u = 0 is clamped


def test_kl_to_uniform_is_zero_at_uniform_and_log_k_when_peaked():
    assert kl_to_uniform(torch.zeros(2, 16, 3, 3)).abs().max() < 1e-6
    peaked = torch.full((2, 16, 3, 3), -1e4)
    peaked[:, 5] = 1e4
    torch.testing.assert_close(kl_to_uniform(peaked), torch.full((2, 3, 3), math.log(16)))
    logits = torch.randn(4, 16, 2, 2)  # and it is KL(q || u) = Σ q log q + log K in between
    q = logits.softmax(1)
    torch.testing.assert_close(kl_to_uniform(logits), (q * q.log()).sum(1) + math.log(16))


def test_noise_comes_from_the_batch_rng_per_row():
    """A micro-batch of rows 2..3 sees the same Gumbel noise as rows 2..3 of the whole batch."""
    _, task = build()
    x = images(4)
    with torch.no_grad():
        full = task.autoencode(x, BatchRandom(0, 3, 0, 4, 0, 4), 3)[0]
        part = task.autoencode(x[2:], BatchRandom(0, 3, 0, 4, 2, 2), 3)[0]
        other = task.autoencode(x, BatchRandom(0, 4, 0, 4, 0, 4), 3)[0]
    torch.testing.assert_close(part, full[2:])
    assert not torch.allclose(full, other)


def test_logs_and_preview_rows():
    _, task = build()
    _, logs = task.loss({"image": images(8), "rng": BatchRandom(0, 0, 0, 8, 0, 8)}, "main", 0)
    assert {"temperature", "kl", "kl_weight", "codebook_usage", "codebook_perplexity", "reconstruction"} <= set(logs)
    assert 0 < logs["codebook_usage"] <= 1 and 1 <= logs["codebook_perplexity"] <= 32
    task.eval()
    gen = torch.Generator().manual_seed(0)
    cond = task.sample_conditions(4, gen, task.resolve())
    grid, nrow = task.preview(cond, task.sample(cond, gen, 4, task.resolve()))
    assert nrow == 4 and grid.shape == (12, 3, 16, 16)  # originals, hard, soft
    assert torch.equal(grid[4:8], task.reconstruct(cond["image"]).clamp(-1, 1))
    online = -task.reconstruct(cond["image"]).clamp(-1, 1)  # what the trainer hands in: the online weights' samples
    with_online, _ = task.preview({**cond, "online": online}, task.sample(cond, gen, 4, task.resolve()))
    assert with_online.shape == (16, 3, 16, 16) and torch.equal(with_online[:12], grid)
    assert torch.equal(with_online[12:], online)


# ------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("overrides, field", [
    (["model.anneal_rate=0.01"], "model.anneal_rate"),  # the preset's schedule is cosine
    (["model.temperature_schedule=legacy_exp"], "model.temperature_anneal_steps"),
    (["model.anneal_epoch_steps=100"], "model.anneal_epoch_steps"),  # compounding's only
    (["model.temperature_schedule=linear"], "model.temperature_schedule"),
    (["model.temperature_anneal_steps=0"], "model.temperature_anneal_steps"),
    (["model.temperature_min=2.0"], "model.temperature_min"),
    (["model.temperature_min=2.0"], "model.temperature_start"),
    (["model.reconstruction_loss=l1"], "model.reconstruction_loss"),
    (["model.num_layers=6"], "model.num_layers"),
    (["model.channels=2"], "model.channels"),
    (["data.image_size=18"], "data.image_size"),
])
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config("dvae-debug", overrides)


def test_defaults():
    cfg = load_config("dvae-debug")
    assert cfg.eval.metrics == ["psnr", "ssim", "codebook"]
    assert cfg.model.downsample() == 4 and cfg.model.reconstruction_loss == "mse"
    from genforge.families.dvae.config import DVAEConfig

    assert DVAEConfig().perceptual.weight == 0.0 and DVAEConfig().downsample() == 8
