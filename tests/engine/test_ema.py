import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.engine.ema import EMA


def test_update_matches_formula_and_warmup():
    lin = nn.Linear(2, 2)
    ema = EMA(lin, decay=0.9, warmup=False)
    before = ema.shadow["weight"].clone()
    with torch.no_grad():
        lin.weight.add_(1.0)
    ema.update()
    assert torch.allclose(ema.shadow["weight"], 0.9 * before + 0.1 * lin.weight)
    warm = EMA(lin, decay=0.9999, warmup=True)
    assert warm.decay_at(0) == 0.1 and warm.decay_at(10**7) == 0.9999
    late = EMA(lin, decay=0.9, warmup=False, start=5)
    assert late.decay_at(4) == 0.0 and late.decay_at(5) == 0.9


def test_swapped_in_restores_live_weights():
    lin = nn.Linear(2, 2)
    ema = EMA(lin, decay=0.5)
    live = lin.weight.detach().clone()
    ema.shadow["weight"].fill_(7.0)
    with ema.swapped_in() as m:
        assert torch.all(m.weight == 7.0)
    assert torch.equal(lin.weight, live)


def test_each_phase_counts_its_own_updates_for_the_warm_up():
    """Phases average their own parameters at their own decay, each ramping with its own update count; a phase
    loaded with a count (a resumed run) continues from it, and counts of phases it does not average are kept."""
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    ema = EMA(net, decay=0.99, phases={"a": (0.99, ["0.weight", "0.bias"]), "b": (0.5, ["1.weight", "1.bias"])})
    ema.load_updates({"a": 30, "other": 7})
    before = {k: v.clone() for k, v in ema.shadow.items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    ema.update()
    weights = dict(net.named_parameters())
    for name, decay in [("0.weight", min(0.99, 31 / 40)), ("1.weight", min(0.5, 1 / 10))]:
        expected = torch.lerp(before[name], weights[name].detach(), 1 - decay)
        assert torch.allclose(ema.shadow[name], expected, atol=1e-7, rtol=0)
    assert ema.updates == {"a": 31, "b": 1, "other": 7}
    only_a = EMA(net, decay=0.9, phases={"a": (0.9, ["0.weight", "0.bias"])})
    kept = only_a.shadow["1.weight"].clone()
    only_a.update()
    assert torch.equal(only_a.shadow["1.weight"], kept)  # no phase of this EMA trains it
    late = EMA(net, decay=0.9, warmup=False, start=5)
    assert late.decay_at(4) == 0.0 and late.decay_at(5) == 0.9  # start counts a phase's own updates



def _late_phase_run(tmp_path, preset, first, second, prefix, old_checkpoint=False):
    """Train `preset` with the overrides `first` for 2 steps, then resume it with `second` (a phase first trained
    now) to step 5, recording the weights named `prefix...` before every EMA update. Returns the trainer, the EMA of
    those weights in the step-2 checkpoint, and the recorded weights."""
    base = ["train.checkpoint_every=2", "train.sample_every=0", "train.log_every=1", "eval.every=0",
            "train.ema_decay=0.99", "train.ema_warmup=true"]
    make_trainer(load_config(preset, [*base, "train.steps=2", *first]), tmp_path).fit()
    checkpoint = tmp_path / "checkpoints" / "step-000002"
    if old_checkpoint:  # as written before the per-phase counts (format 1): its upgrade counts the global step
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        del state["ema_updates"], state["format_version"]
        (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    start = {k: v for k, v in load_file(str(checkpoint / "ema.safetensors")).items() if k.startswith(prefix)}
    assert start
    trainer = make_trainer(load_config(preset, [*base, "train.steps=5", *second]), tmp_path)
    recorded, update = [], trainer.state.ema.update

    def spy():
        recorded.append({n: p.detach().float().clone() for n, p in trainer.task.ema_module().named_parameters()
                         if n.startswith(prefix)})
        update()

    trainer.state.ema.update = spy
    trainer.fit()
    return trainer, start, recorded


def _ema_from(start, recorded, first_update=0, decay=0.99):
    """The EMA computed from `start` over the weights of each update, the first one counted as update number
    `first_update` of the warm-up (a fresh run: 0)."""
    shadow = {k: v.clone() for k, v in start.items()}
    ramp = EMA(nn.Linear(1, 1), decay)
    for n, weights in enumerate(recorded, start=first_update):
        names = list(shadow)
        torch._foreach_lerp_([shadow[k] for k in names], [weights[k] for k in names], 1.0 - ramp.decay_at(n))
    return shadow


@pytest.mark.parametrize("old_checkpoint", [False, True])
def test_a_phase_first_trained_in_a_resumed_run_warms_its_ema_up_as_a_fresh_run(tmp_path, old_checkpoint):
    """A cascade trained unet1 for 2 steps, then resumed training unet2 (model.train_unets [1] -> [2]): unet2's EMA
    after its 3 updates is, bit for bit, what a fresh run's EMA computes from unet2's initial weights over the same
    weights (warm-up decays (1+n)/(10+n) from n = 0, not from the global step 2); unet1's count stays. The counts
    are in trainer_state.json; a checkpoint written before them counts the global step for the phases it trained
    (unet1) and 0 for the others. (A fresh run of unet2 alone sees other batches and noise, since both depend on the
    step, so its weights differ: this is the closest exact comparison.)"""
    trainer, start, recorded = _late_phase_run(tmp_path, "dalle2-decoder-debug", ["model.train_unets=[1]"],
                                               ["model.train_unets=[2]"], "cascade.unets.1.", old_checkpoint)
    assert len(recorded) == 3 and trainer.state.ema.updates == {"unet1": 2, "unet2": 3}
    expected = _ema_from(start, recorded)
    assert all(torch.equal(trainer.state.ema.shadow[k], expected[k]) for k in expected)
    by_global_step = _ema_from(start, recorded, first_update=2)  # what counting global steps gave
    assert not all(torch.allclose(trainer.state.ema.shadow[k], by_global_step[k]) for k in expected)
    saved = json.loads((tmp_path / "checkpoints" / "step-000005" / "trainer_state.json").read_text())
    assert saved["ema_updates"] == {"unet1": 2, "unet2": 3}


def test_a_token_critic_trained_after_its_generator_warms_up_from_its_own_first_update(tmp_path):
    """maskgit: model.train_phases [main] -> [critic] on resume: the critic's EMA warms up from its own first update,
    through the engine alone (no change in the family)."""
    critic = "model.critic.depth=1"
    trainer, start, recorded = _late_phase_run(tmp_path, "maskgit-debug", [critic, "model.train_phases=[main]"],
                                               [critic, "model.train_phases=[critic]"], "critic.")
    assert len(recorded) == 3 and trainer.state.ema.updates == {"main": 2, "critic": 3}
    expected = _ema_from(start, recorded)
    assert all(torch.equal(trainer.state.ema.shadow[k], expected[k]) for k in expected)
