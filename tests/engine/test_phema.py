"""Post-hoc EMA (EDM2, Karras et al. 2024 §3, App. C.1-C.2): the σ_rel <-> γ relation, the power-function EMA's
weights, the closed-form inner products, the least-squares synthesis against directly tracked EMAs, and snapshots
that survive a resume exactly."""

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from torch import nn

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.core.config import ConfigError
from genforge.engine.ema import EMA
from genforge.engine.phema import (SnapshotDir, gamma_to_sigma_rel, p_dot_p, sigma_rel_to_gamma,
                                   solve_posthoc_coefficients, synthesize)


def test_sigma_rel_and_gamma_are_edm2s_relation():
    """σ_rel = sqrt((γ+1) / ((γ+2)^2 (γ+3))); EDM2's two tracked widths: σ_rel 0.10 is γ 6.94, 0.05 is γ 16.97."""
    assert sigma_rel_to_gamma(0.10) == pytest.approx(6.94, abs=0.005)
    assert sigma_rel_to_gamma(0.05) == pytest.approx(16.97, abs=0.005)
    for sigma_rel in np.linspace(0.01, 0.28, 28):
        gamma = sigma_rel_to_gamma(sigma_rel)
        assert gamma > 0 and gamma_to_sigma_rel(gamma) == pytest.approx(sigma_rel, rel=1e-10)
    for gamma in (0.5, 3.0, 6.94, 40.0):
        assert sigma_rel_to_gamma(gamma_to_sigma_rel(gamma)) == pytest.approx(gamma, rel=1e-9)
    for bad in (0.0, -0.1, 0.29):
        with pytest.raises(ValueError, match="sigma_rel"):
            sigma_rel_to_gamma(bad)


def test_the_relative_width_is_the_profiles_std_over_t():
    """σ_rel is the standard deviation of the profile p(τ) = (γ+1) τ^γ / t^(γ+1) on [0, t], over t (EDM2 eq. 3)."""
    tau = np.linspace(0, 1, 2_000_001)
    for gamma in (2.0, 6.94, 16.97):
        p = (gamma + 1) * tau ** gamma
        mean = np.trapezoid(tau * p, tau)
        std = np.sqrt(np.trapezoid((tau - mean) ** 2 * p, tau))
        assert std == pytest.approx(gamma_to_sigma_rel(gamma), rel=1e-6)


def test_a_power_ema_weighs_update_k_by_the_profile_over_its_step():
    """After T updates with β_t = (1 − 1/t)^(γ+1), update k weighs (k^(γ+1) − (k−1)^(γ+1)) / T^(γ+1): the profile's
    integral over (k−1, k]. `start` counts updates that copy first; `averaged` says the t the averages hold."""
    gamma, steps = 6.94, 12
    param = nn.Linear(1, 1, bias=False)
    ema = EMA(param, decay=0.9, start=2, gammas=(gamma, 16.97))
    history = []
    for k in range(steps):
        with torch.no_grad():
            param.weight.fill_(float(k * k - 3 * k))
        history.append(param.weight.item())
        ema.update()
    t = steps - 2  # the first two updates copy; the averaged ones are the last 10
    for g, got in ((gamma, ema.shadow["weight"]), (16.97, ema.power_shadows[0]["weight"])):
        k = np.arange(1, t + 1, dtype=np.float64)
        weights = (k ** (g + 1) - (k - 1) ** (g + 1)) / t ** (g + 1)
        assert got.item() == pytest.approx(float(weights @ np.array(history[2:])), rel=1e-5)
    assert ema.averaged() == {"main": t} and set(ema.averages()) == {"0/weight", "1/weight"}


def test_p_dot_p_is_the_integral_of_two_power_profiles():
    tau = np.linspace(0, 1, 400_001)
    for (ta, ga), (tb, gb) in [((0.6, 3.0), (1.0, 7.0)), ((1.0, 16.97), (0.4, 6.94)), ((0.8, 5.0), (0.8, 5.0))]:
        pa = np.where(tau <= ta, (ga + 1) * tau ** ga / ta ** (ga + 1), 0)
        pb = np.where(tau <= tb, (gb + 1) * tau ** gb / tb ** (gb + 1), 0)
        assert p_dot_p(np.float64(ta), ga, np.float64(tb), gb) == pytest.approx(np.trapezoid(pa * pb, tau), rel=1e-3)


def test_coefficients_reproduce_a_snapshot_exactly():
    """A target that is one of the snapshots is that snapshot (least squares recovers it)."""
    t = [100, 200, 300, 100, 200, 300]
    g = [6.94] * 3 + [16.97] * 3
    x = solve_posthoc_coefficients(t, g, 300, 16.97)
    assert np.allclose(x, [0, 0, 0, 0, 0, 1], atol=1e-6)


def _random_walk_snapshots(tmp_path, steps=400, every=20, widths=(0.05, 0.10), target=0.075):
    """A 64-dim parameter following a random walk with drift, its power EMAs of `widths` snapshotted every `every`
    steps, and the EMA of `target` tracked directly beside them."""
    torch.manual_seed(0)
    param = nn.Linear(64, 1, bias=False)
    tracked = EMA(param, decay=0.9, gammas=tuple(map(sigma_rel_to_gamma, widths)))
    direct = EMA(param, decay=0.9, gammas=(sigma_rel_to_gamma(target),))
    snapshots = SnapshotDir(tmp_path / "ema_snapshots")
    drift = torch.randn(1, 64) * 0.02
    for step in range(1, steps + 1):
        with torch.no_grad():
            param.weight.add_(drift + torch.randn(1, 64) * 0.1)
        tracked.update()
        direct.update()
        if step % every == 0:
            snapshots.write(step, tracked.averages(), widths, tracked.gammas, {"main": (step, ["weight"])})
    return snapshots.snapshots(), direct.shadow["weight"], param.weight.detach()


def test_synthesis_matches_the_directly_tracked_ema(tmp_path):
    """The EMA of σ_rel 0.075 synthesised from 20 snapshots of σ_rel 0.05 and 0.10 (every 20 of 400 steps of a random
    walk) is the one tracked directly to within 2% of how far the average is from the last weights (EDM2 App. C.2);
    a width outside the snapshots' (0.15) comes out close too, within 5%."""
    snaps, direct, live = _random_walk_snapshots(tmp_path)
    assert len(snaps) == 20 and snaps[-1].step == 400
    weights, coefficients = synthesize(snaps, 0.075)
    scale = (direct - live).norm()
    assert (weights["weight"] - direct).norm() < 0.02 * scale
    assert abs(sum(coefficients["main"]) - 1) < 1e-3  # a weighted average: the coefficients sum to 1
    snaps, direct, live = _random_walk_snapshots(tmp_path / "wide", target=0.15)
    weights, _ = synthesize(snaps, 0.15)
    assert (weights["weight"] - direct).norm() < 0.05 * (direct - live).norm()


def test_a_phase_first_updated_late_is_synthesised_from_its_own_counts(tmp_path):
    """Each phase's averages are solved with its own t; a weight of no phase is the last snapshot's."""
    snapshots, gammas = SnapshotDir(tmp_path), (sigma_rel_to_gamma(0.05), sigma_rel_to_gamma(0.1))
    for step, (ta, tb) in [(10, (10, 0)), (20, (20, 10)), (30, (30, 20))]:
        tensors = {f"{i}/{n}": torch.full((2,), float(step + i)) for i in (0, 1) for n in ("a", "b", "frozen")}
        snapshots.write(step, tensors, (0.05, 0.1), gammas, {"pa": (ta, ["a"]), "pb": (tb, ["b"])})
    weights, coefficients = synthesize(snapshots.snapshots(), 0.05)
    assert len(coefficients["pa"]) == 6 and len(coefficients["pb"]) == 4  # pb: not the snapshot before its first update
    assert torch.allclose(weights["a"], torch.full((2,), 30.0), atol=1e-4)  # σ_rel 0.05 at t=30: snapshot 30's 0/a
    assert torch.allclose(weights["b"], torch.full((2,), 30.0), atol=1e-4)
    assert torch.equal(weights["frozen"], torch.full((2,), 30.0))


BASE = ["train.ema.kind=power", "train.ema.snapshot_every=2", "train.checkpoint_every=3", "train.sample_every=0",
        "train.log_every=1", "eval.every=0"]


def _snapshot_contents(run_dir):
    found = {}
    for path in sorted((run_dir / "ema_snapshots").glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            found[path.name] = (f.metadata(), {k: f.get_tensor(k) for k in f.keys()})
    return found


def test_snapshots_survive_a_resume_exactly(tmp_path):
    """6 steps in one go and 3 + a resume to 6 write the same snapshots (steps 2, 4, 6: tensors and headers) and the
    same power-function EMAs in the last checkpoint; a resume removes the snapshots past its checkpoint (a continuation
    a kill abandoned) and a half-written one."""
    straight = tmp_path / "straight"
    make_trainer(load_config("dit-debug", [*BASE, "train.steps=6"]), straight).fit()
    split = tmp_path / "split"
    make_trainer(load_config("dit-debug", [*BASE, "train.steps=6"]), split).fit(stop_at=3)
    (split / "ema_snapshots" / "step-000005.safetensors").write_bytes(b"from a run killed after step 5")
    (split / "ema_snapshots" / ".tmp-step-000006.safetensors").write_bytes(b"torn")
    trainer = make_trainer(load_config("dit-debug", [*BASE, "train.steps=6"]), split)
    trainer.fit()
    a, b = _snapshot_contents(straight), _snapshot_contents(split)
    assert list(a) == list(b) == ["step-000002.safetensors", "step-000004.safetensors", "step-000006.safetensors"]
    for name in a:
        assert a[name][0] == b[name][0]
        assert a[name][1].keys() == b[name][1].keys() and all(torch.equal(a[name][1][k], b[name][1][k])
                                                              for k in a[name][1])
    meta = a["step-000006.safetensors"][0]
    assert json.loads(meta["sigma_rels"]) == [0.05, 0.1] and json.loads(meta["phases"])["main"]["t"] == 6
    assert any(k.startswith("1/") for k in a["step-000006.safetensors"][1])
    for part in ("ema", "power_ema"):
        with safe_open(str(straight / "checkpoints/step-000006" / f"{part}.safetensors"), "pt") as f, \
                safe_open(str(split / "checkpoints/step-000006" / f"{part}.safetensors"), "pt") as g:
            assert all(torch.equal(f.get_tensor(k), g.get_tensor(k)) for k in f.keys())
    state = json.loads((straight / "checkpoints/step-000006/trainer_state.json").read_text())
    assert state["ema_gammas"] == pytest.approx([sigma_rel_to_gamma(0.05), sigma_rel_to_gamma(0.1)])


def test_a_resume_may_not_change_the_kind_or_widths(tmp_path):
    make_trainer(load_config("dit-debug", [*BASE, "train.steps=2"]), tmp_path).fit()
    for change in (["train.ema.kind=exponential", "train.ema.snapshot_every=null"], ["train.ema.sigma_rels=[0.05]"]):
        with pytest.raises(ConfigError, match="train.ema"):
            make_trainer(load_config("dit-debug", [*BASE, "train.steps=4", *change]), tmp_path).fit()
    make_trainer(load_config("dit-debug", [*BASE, "train.steps=4", "train.ema.snapshot_every=1"]), tmp_path).fit()
    assert sorted(p.name for p in (tmp_path / "ema_snapshots").iterdir()) == [
        "step-000002.safetensors", "step-000003.safetensors", "step-000004.safetensors"]


@pytest.mark.parametrize("overrides, field", [
    (["train.ema.sigma_rels=[0.05]"], "train.ema.sigma_rels applies to train.ema.kind=power"),
    (["train.ema.snapshot_every=10"], "train.ema.snapshot_every applies to train.ema.kind=power"),
    (["train.ema.kind=power", "train.ema.sigma_rels=[0.3]"], r"train.ema.sigma_rels\[0\]=0.3 must be in"),
    (["train.ema.kind=power", "train.ema.sigma_rels=[0.1, 0.1]"], "names one width twice"),
    (["train.ema.kind=power", "train.phases.main.ema_decay=0.99"], "train.phases.main.ema_decay=0.99 is a decay"),
])
def test_contradictory_ema_settings_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        load_config("dit-debug", overrides)
