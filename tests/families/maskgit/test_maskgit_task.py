"""The maskgit family: the shared contract, the masked-token loss, CFG, config cross-checks, token caches."""

import pytest
import torch
import torch.nn.functional as F
from family_contract import FamilyContract
from fake_tokenizer import fake_tokenizer  # noqa: F401 (fixture)
from typer.testing import CliRunner

from genforge.app.runs import build_task
from genforge.cli import app
from genforge.app.config import ConfigError, load_config
from genforge.data.loader import build_dataset, collate, data_info
from genforge.core.random import BatchRandom
from genforge.masked import task as task_module
from genforge.masked.masking import guided_logits
from genforge.masked.config import MaskedSampleOptions

runner = CliRunner()


class TestMaskGITText(FamilyContract):
    preset = "maskgit-debug"


class TestMaskGITClass(FamilyContract):
    preset = "maskgit-debug"
    overrides = ("model.conditioning=class",)


class TestMaskGITUnconditional(FamilyContract):
    preset = "maskgit-debug"
    overrides = ("model.conditioning=none",)


def _task_and_batch(*overrides, n=8):
    torch.manual_seed(0)
    cfg = load_config("maskgit-debug", list(overrides))
    dataset = build_dataset(cfg.data)
    task = build_task(cfg, data_info(dataset, cfg.data))
    batch = collate([dataset[i] for i in range(n)])
    batch.pop("skipped")
    return cfg, task, batch


def test_loss_is_cross_entropy_on_the_masked_positions_only():
    cfg, task, batch = _task_and_batch("model.cond_dropout_prob=0.0")
    captured = {}

    def keep(module, inputs, out):
        captured["hidden"] = out

    task.model.norm.register_forward_hook(keep)
    batch["rng"] = BatchRandom(0, 3, 0, 8, 0, 8)
    loss, logs = task.loss(batch, "main", 3)
    hidden = captured["hidden"]
    hidden.retain_grad()
    loss.backward()
    # the draws the loss made, repeated: which positions were hidden
    rng = BatchRandom(0, 3, 0, 8, 0, 8)
    ids = task.to_tokens(batch)
    r = rng.rand_global()
    from genforge.masked.masking import training_mask

    mask = training_mask(rng.rows(r), rng.rand(ids.shape[1]), "cosine")
    assert 0 < mask.sum() < mask.numel()
    grad_norm = hidden.grad.norm(dim=-1)  # [B, N]
    assert (grad_norm[~mask] == 0).all() and (grad_norm[mask] > 0).all()
    # the value: mean cross-entropy over the masked tokens of the (global = this) batch
    logits = task.model.head(hidden.detach())
    expected = F.cross_entropy(logits[mask], ids[mask])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert logs["masked"].item() == pytest.approx(mask.float().mean().item())


def test_a_self_critic_trains_jointly_and_decodes():
    """maskgit with a self critic (model.critic.kind=self, training=joint): one phase whose loss is the generator's
    cross-entropy + the critic's BCE, and decoding that re-masks by the critic's head."""
    cfg, task, batch = _task_and_batch("model.critic.kind=self", "model.critic.training=joint")
    batch["rng"] = BatchRandom(0, 1, 0, 8, 0, 8)
    loss, logs = task.loss(batch, "main", 1)
    assert task.phases == ("main",) and torch.isfinite(loss) and 0 <= logs["critic_accuracy"] <= 1
    loss.backward()
    assert task.model.critic_head.weight.grad.abs().sum() > 0
    task.eval()
    gen = torch.Generator().manual_seed(0)
    options = task.resolve(MaskedSampleOptions(prompt="a red circle"))
    images = task.sample(task.sample_conditions(2, gen, options), gen, 2, options)
    assert images.shape[0] == 2 and torch.isfinite(images).all()


def test_loss_gradient_does_not_depend_on_how_the_global_batch_is_split():
    _, task, batch = _task_and_batch("model.cond_dropout_prob=0.5", n=8)

    def grads(parts):
        task.zero_grad(set_to_none=True)
        for offset, size in parts:
            micro = {k: v[offset:offset + size] for k, v in batch.items()}
            micro["rng"] = BatchRandom(0, 1, 0, 8, offset, size)
            (task.loss(micro, "main", 1)[0] / len(parts)).backward()
        return [p.grad.clone() for p in task.parameters() if p.grad is not None]

    whole, halves = grads([(0, 8)]), grads([(0, 4), (4, 4)])
    assert len(whole) == len(halves)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(whole, halves))


@pytest.mark.parametrize("negative", [None, "a green square"])
def test_sampling_guides_the_logits_with_the_unconditional_or_negative_branch(monkeypatch, negative):
    _, task, _ = _task_and_batch()
    task.eval()
    captured = {}
    real_decode = task_module.decode

    def spy(logits_fn, *args, **kwargs):
        captured["fn"] = logits_fn
        return real_decode(logits_fn, *args, **kwargs)

    monkeypatch.setattr(task_module, "decode", spy)
    gen = torch.Generator().manual_seed(0)
    opts = {"prompt": "a large red circle", "cfg_scale": 3.0}
    if negative:
        opts["negative_prompt"] = negative
    options = task.resolve(MaskedSampleOptions(**opts))
    cond = task.sample_conditions(2, gen, options)
    task.sample(cond, gen, 2, options)
    ids = torch.randint(0, 65, (2, 64))
    keep = torch.zeros(2, dtype=torch.bool)
    with torch.no_grad():
        c = task.model(ids, *task.context(cond, keep))
        u = task.model(ids, *(task.context(cond, keep, "negative_text") if negative else task.context(cond, ~keep)))
        torch.testing.assert_close(captured["fn"](ids), guided_logits(c, u, 3.0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(guided_logits(c, u, 1.0), c)


def test_decoding_temperatures_come_from_the_options_or_the_config(monkeypatch):
    _, task, _ = _task_and_batch()
    task.eval()
    seen = []
    real_decode = task_module.decode

    def spy(*args, **kwargs):
        seen.append((kwargs["temperature"], kwargs["choice_temperature"]))
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(task_module, "decode", spy)
    gen = torch.Generator().manual_seed(0)
    cond = task.sample_conditions(2, gen, task.resolve(MaskedSampleOptions(prompt="a large red circle")))
    task.sample(cond, gen, 2, task.resolve())  # the config's: model.temperature 1.0, model.choice_temperature 4.5
    given = task.resolve(MaskedSampleOptions(temperature=0.5, choice_temperature=0.0))  # --temperature 0.5 ...
    task.sample(cond, gen, 2, given)
    assert seen == [(task.cfg.temperature, task.cfg.choice_temperature), (0.5, 0.0)]
    assert task.sampler_settings(given)["choice_temperature"] == 0.0  # recorded


def test_heldout_prompts_carry_their_labels_for_the_judge():
    _, task, _ = _task_and_batch()
    cond = task.sample_conditions(6, torch.Generator().manual_seed(0), task.resolve())
    from genforge.data.shapes import class_name

    assert len(cond["text"]) == 6 and cond["label"].shape == (6,)
    for text, label in zip(cond["text"], cond["label"].tolist()):
        assert text.startswith(f"a large {class_name(label)}")


@pytest.mark.parametrize("override, field", [
    ("model.codebook_size=100", "model.codebook_size=100"),
    ("model.seq_len=63", "model.seq_len=63"),
    ("model.tokens.factor=3", "model.tokens.factor=3"),
    ("model.width=65", "model.width=65"),
])
def test_config_cross_checks_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config("maskgit-debug", [override])
    out = runner.invoke(app, ["train", "maskgit-debug", "--dry-run", "--set", override])
    assert out.exit_code == 2 and field in out.stderr


def test_vocabulary_and_grid_are_checked_against_a_tokenizer_run(tmp_path, fake_tokenizer):
    tok = fake_tokenizer(tmp_path / "tok", kind="tokens")  # 64 ids, 2x downsampling: 8x8 at 16 px
    base = ["model.tokens.codec=tokenizer", f"model.tokens.tokenizer={tok}"]
    ok = runner.invoke(app, ["train", "maskgit-debug", "--dry-run", *sum((["--set", s] for s in base), [])])
    assert ok.exit_code == 0, ok.output
    for override, message in [("model.codebook_size=512", "model.codebook_size=512 differs from the codebook size"),
                              ("model.seq_len=256", "model.seq_len=256 differs from the token grid")]:
        out = runner.invoke(app, ["train", "maskgit-debug", "--dry-run",
                                  *sum((["--set", s] for s in [*base, override]), [])])
        assert out.exit_code == 2 and message in out.stderr and str(tok) in out.stderr
    latent = fake_tokenizer(tmp_path / "latent", kind="latent")
    out = runner.invoke(app, ["train", "maskgit-debug", "--dry-run", "--set", "model.tokens.codec=tokenizer",
                              "--set", f"model.tokens.tokenizer={latent}"])
    assert out.exit_code == 2 and "continuous latents" in out.stderr


def test_trains_on_a_token_cache_and_samples_from_a_prompt(tmp_path, fake_tokenizer):
    tok, cache, run = fake_tokenizer(tmp_path / "tok", kind="tokens"), tmp_path / "cache", tmp_path / "run"
    out = runner.invoke(app, ["encode", str(tok), "--out", str(cache), "--set", "data.shapes.n=24"])
    assert out.exit_code == 0, out.output
    sets = ["data.source=cache", f"data.path={cache}", "model.tokens.codec=tokenizer",
            f"model.tokens.tokenizer={tok}"]
    out = runner.invoke(app, ["train", "maskgit-debug", "--run-dir", str(run), *sum((["--set", s] for s in sets), [])])
    assert out.exit_code == 0, out.output
    grid = tmp_path / "grid.png"
    out = runner.invoke(app, ["sample", str(run), "--prompt", "a large red circle", "--negative-prompt", "a cross",
                              "--n", "4", "--steps", "3", "--out", str(grid)])
    assert out.exit_code == 0, out.output
    assert grid.is_file() and "a large red circle" in grid.with_suffix(".txt").read_text()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a large blue square\n\na small green cross\n")
    out = runner.invoke(app, ["sample", str(run), "--prompts", str(prompts), "--out", str(grid)])
    assert out.exit_code == 0, out.output
    assert grid.with_suffix(".txt").read_text().splitlines() == ["a large blue square", "a small green cross"]
    out = runner.invoke(app, ["eval", str(run), "--metrics", "judge", "-n", "4", "--steps", "2"])
    assert out.exit_code == 0, out.output
    assert "judge_accuracy" in out.stdout
