"""The shared masked-token task's decoding options as phenaki-pytorch has them (genforge/masked/task.py): the
annealed temperature and the guided token critic reach `decode`, and a critic trained in its own phase drops the
condition at model.critic.cond_dropout_prob, so that it can be guided."""

import pytest
import torch

from genforge.app.config import ConfigError, load_config
from genforge.app.runs import build_task
from genforge.core.random import BatchRandom
from genforge.data.loader import build_dataset, collate, data_info
from genforge.masked import task as task_module
from genforge.masked.config import MaskedSampleOptions

CRITIC = ("model.critic.depth=1", "model.critic.cond_dropout_prob=0.25")  # a critic that may be guided


def _task(*overrides: str):
    torch.manual_seed(0)
    cfg = load_config("maskgit-debug", list(overrides))
    dataset = build_dataset(cfg.data)
    return build_task(cfg, data_info(dataset, cfg.data)), dataset


def _decoded_with(task, monkeypatch, **options) -> dict:
    """The keywords `decode` receives when the task samples two images with `options`."""
    seen = {}
    real_decode = task_module.decode

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(task_module, "decode", spy)
    gen = torch.Generator().manual_seed(0)
    resolved = task.resolve(MaskedSampleOptions(prompt="a large red circle", **options))
    seen["cond"] = task.sample_conditions(2, gen, resolved)
    task.sample(seen["cond"], gen, 2, resolved)
    seen["settings"] = task.sampler_settings(resolved)
    return seen


def test_the_temperature_anneal_comes_from_the_options_or_the_config(monkeypatch):
    task = _task()[0].eval()
    assert _decoded_with(task, monkeypatch)["temperature_anneal"] == "constant"  # genforge's default
    seen = _decoded_with(task, monkeypatch, temperature_anneal="linear", temperature=0.9)  # phenaki-pytorch's
    assert (seen["temperature_anneal"], seen["temperature"]) == ("linear", 0.9)
    assert seen["settings"]["temperature_anneal"] == "linear"  # recorded with the samples
    task = _task("model.temperature_anneal=linear")[0].eval()
    assert _decoded_with(task, monkeypatch)["temperature_anneal"] == "linear"


@pytest.mark.parametrize("negative", [None, "a green square"])
def test_a_guided_critic_combines_its_conditional_and_unconditional_scores_as_guidance_does(monkeypatch, negative):
    """critic_guidance: the critic's logits guided at the generator's scale, u + s·(c − u), u under the null context
    or the negative prompt (phenaki-pytorch's critic.forward_with_cond_scale); decode re-masks the lowest of minus
    that (high = looks real). Without it, the conditional logits alone."""
    task = _task(*CRITIC)[0].eval()
    extra = {"negative_prompt": negative} if negative else {}
    seen = _decoded_with(task, monkeypatch, cfg_scale=3.0, critic_guidance=True, **extra)
    cond, keep = seen["cond"], torch.zeros(2, dtype=torch.bool)
    ids = torch.randint(0, task.codebook_size, (2, task.model.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        c = task.critic_scores(ids, task.critic_context(cond, keep))
        unconditional = task.critic_context(cond, keep, text_key="negative_text") if negative else \
            task.critic_context(cond, ~keep)
        u = task.critic_scores(ids, unconditional)
        assert not torch.allclose(c, u)  # the two branches differ, so the combination shows
        torch.testing.assert_close(seen["critic"](ids), -(u + 3.0 * (c - u)))
        assert seen["settings"]["critic_guidance"] is True
        plain = _decoded_with(task, monkeypatch, cfg_scale=3.0, **extra)  # model.critic.guidance: false
        torch.testing.assert_close(plain["critic"](ids), -c)
        assert plain["settings"]["critic_guidance"] is False


def test_critic_guidance_needs_a_critic_that_trained_without_the_condition():
    with pytest.raises(ValueError, match="--critic-guidance: this run has no token critic"):
        _task()[0].resolve(MaskedSampleOptions(critic_guidance=True))
    with pytest.raises(ValueError, match="unconditional scores are untrained"):
        _task("model.critic.depth=1")[0].resolve(MaskedSampleOptions(critic_guidance=True))
    assert _task(*CRITIC)[0].resolve(MaskedSampleOptions(critic_guidance=True)).critic_guidance
    assert _task("model.critic.kind=self", "model.critic.training=joint")[0].resolve(
        MaskedSampleOptions(critic_guidance=True)).critic_guidance  # joint: the generator's dropped rows
    for overrides, field in [(["model.critic.depth=1", "model.critic.guidance=true"], "model.critic.guidance"),
                             (["model.critic.kind=self", "model.critic.training=joint",
                               "model.critic.cond_dropout_prob=0.1"], "model.critic.cond_dropout_prob")]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_config("maskgit-debug", overrides)
    assert load_config("maskgit-debug", [*CRITIC, "model.critic.guidance=true"]).model.critic.guidance


def test_a_critic_phase_drops_the_condition_at_its_share_drawn_after_the_masks(monkeypatch):
    task, dataset = _task("model.critic.depth=1")
    batch = collate([dataset[i] for i in range(32)])
    batch.pop("skipped")
    calls = []
    real_bce = task.critic_bce

    def spy(filled, mask, cond, drop, real, generator_context=None):
        calls.append((filled, mask, drop))
        return real_bce(filled, mask, cond, drop, real, generator_context)

    monkeypatch.setattr(task, "critic_bce", spy)
    for prob in (0.0, 0.5):
        task.cfg.critic.cond_dropout_prob = prob
        task.critic_loss({**batch, "rng": BatchRandom(0, 7, 1, 32, 0, 32)})
    (filled_0, mask_0, drop_0), (filled_half, mask_half, drop_half) = calls
    assert not drop_0.any() and 0.25 < drop_half.float().mean() < 0.75
    assert torch.equal(mask_0, mask_half) and torch.equal(filled_0, filled_half)  # the same masks and fills
