import json

import pytest
import torch

from genforge.engine.checkpoint import (FORMAT_VERSION, UPGRADES, CheckpointDir, CheckpointReadError, load_state,
                                        read_trainer_state, save_state, write_trainer_state)


def test_state_round_trip_with_nested_tensors(tmp_path):
    state = {
        "optimizer": {"state": {0: {"exp_avg": torch.randn(3, 2), "step": torch.tensor(4.0)}},
                      "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.99), "params": [0]}]},
        "python": (3, tuple(range(5)), None),
        "flag": True,
    }
    save_state(tmp_path / "s", state)
    back = load_state(tmp_path / "s")
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)
    assert back["python"] == (3, tuple(range(5)), None)
    json.loads((tmp_path / "s.json").read_text())  # plain JSON, no pickle anywhere


def test_integer_keys_survive(tmp_path):
    save_state(tmp_path / "s", {"state": {0: torch.ones(1), 7: torch.zeros(1)}})
    back = load_state(tmp_path / "s")
    assert set(back["state"]) == {0, 7}


def test_refuses_objects(tmp_path):
    with pytest.raises(TypeError):
        save_state(tmp_path / "s", {"f": object()})


def _write(ckpts: CheckpointDir, step: int) -> None:
    tmp = ckpts.staging(step)
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
    ckpts.commit(tmp, step)


def test_commit_latest_and_retention(tmp_path):
    ckpts = CheckpointDir(tmp_path, keep_last=2)
    assert ckpts.latest() is None
    for step in (10, 20, 30):
        _write(ckpts, step)
    assert ckpts.latest().name == "step-000030"
    assert [p.name for p in ckpts.complete()] == ["step-000020", "step-000030"]


def test_incomplete_folders_ignored_and_cleaned(tmp_path):
    ckpts = CheckpointDir(tmp_path, keep_last=2)
    _write(ckpts, 5)
    torn = ckpts.staging(10)  # a write that never committed
    (torn / "model.safetensors").write_bytes(b"partial")
    assert ckpts.latest().name == "step-000005"
    assert ckpts.clean_incomplete() == [torn]
    assert not torn.exists()


def test_every_format_version_has_an_upgrade_to_the_next():
    assert sorted(UPGRADES) == list(range(1, FORMAT_VERSION))


def test_a_written_trainer_state_says_its_format_version_and_reads_back_unchanged(tmp_path):
    write_trainer_state(tmp_path, {"step": 3, "rollbacks": 1})
    assert json.loads((tmp_path / "trainer_state.json").read_text())["format_version"] == FORMAT_VERSION
    assert read_trainer_state(tmp_path) == {"format_version": FORMAT_VERSION, "step": 3, "rollbacks": 1}


def test_a_version_1_trainer_state_is_upgraded_by_its_explicit_step(tmp_path):
    """Version 1 (no format_version) lacked keys added one by one; the upgrade says what they meant then: data
    consumed up to the step, no rollback, the optimizer files optim/ holds, one EMA update a step of each trained
    phase; keys the file has are kept."""
    (tmp_path / "optim").mkdir()
    for stem in ("generator", "discriminator", "grad_scaler"):
        (tmp_path / "optim" / f"{stem}.json").write_text("{}")
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 7, "rollbacks": 2, "world_size": 1}))
    state = read_trainer_state(tmp_path)
    assert state == {"format_version": FORMAT_VERSION, "step": 7, "rollbacks": 2, "world_size": 1,
                     "sharding": "none", "data_position": 7, "data_slots": None, "eval": None, "inputs": {},
                     "optim_files": ["discriminator", "generator", "grad_scaler"],
                     "ema_updates": {"discriminator": 7, "generator": 7}}


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0, "2", True])
def test_a_format_version_this_genforge_does_not_know_is_refused(tmp_path, version):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"format_version": version, "step": 1}))
    with pytest.raises(CheckpointReadError, match="format_version"):
        read_trainer_state(tmp_path)
