import json

import pytest
import torch

from genforge.engine.checkpoint import CheckpointDir, load_state, save_state


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
