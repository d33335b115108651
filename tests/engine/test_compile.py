"""train.compile: the trained blocks compiled with inductor (the first compile takes about a minute here, so this
module trains one tiny compiled run and reuses it; benchmarks/compile_families.py checks every family)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from safetensors.torch import load_file

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.core.config import ConfigError
from genforge.core.registry import FAMILIES

# bf16 and activation checkpointing too: the compiled blocks run under autocast and inside checkpoint()
COMPILED = ["train.compile=true", "train.precision=bf16", "model.grad_checkpointing=true", "train.steps=4",
            "train.checkpoint_every=2", "train.log_every=1", "train.sample_every=4", "log.tensorboard=false"]


def _losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "loss" in r]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / "step-000004" / "model.safetensors"))


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory) -> Path:
    """dit-debug compiled: 4 steps straight; 2 steps, stop, the same command again; and 4 eager steps."""
    root = tmp_path_factory.mktemp("compiled")
    AcceleratorState._reset_state(reset_partial_state=True)  # module-scoped: before the per-test reset runs
    GradientState._reset_state()
    trainer = make_trainer(load_config("dit-debug", COMPILED), root / "straight")
    blocks = trainer.task.trained_blocks()
    assert blocks and all(hasattr(block.forward, "_torchdynamo_orig_callable") for block in blocks)
    trainer.fit()
    make_trainer(load_config("dit-debug", COMPILED), root / "resumed").fit(stop_at=2)
    make_trainer(load_config("dit-debug", COMPILED), root / "resumed").fit()
    make_trainer(load_config("dit-debug", [*COMPILED, "train.compile=false"]), root / "eager").fit()
    return root


def test_a_compiled_run_resumes_bit_for_bit(compiled_runs):
    straight, resumed = _weights(compiled_runs / "straight"), _weights(compiled_runs / "resumed")
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert _losses(compiled_runs / "straight") == _losses(compiled_runs / "resumed")


def test_a_compiled_run_trains_as_the_eager_one_and_samples(compiled_runs):
    """Same losses and weights up to kernel rounding (bf16 autocast); the preview was sampled through the
    compiled blocks; parameter names are those of the eager model (no `_orig_mod.` prefix)."""
    compiled, eager = _losses(compiled_runs / "straight"), _losses(compiled_runs / "eager")
    assert len(compiled) == len(eager) == 4
    assert all(abs(a - b) <= 2e-2 * abs(b) for a, b in zip(compiled, eager))
    straight, plain = _weights(compiled_runs / "straight"), _weights(compiled_runs / "eager")
    assert straight.keys() == plain.keys()
    assert all(torch.allclose(straight[k], plain[k], rtol=0, atol=1e-2) for k in straight)
    assert (compiled_runs / "straight" / "samples" / "step-000004.png").is_file()


def test_a_family_that_cannot_compile_is_refused_at_config_time(monkeypatch):
    spec = FAMILIES.get("diffusion")
    refusing = dataclasses.replace(spec, traits=spec.traits.but(no_compile="has a block inductor cannot trace"))
    monkeypatch.setitem(FAMILIES._entries, "diffusion", refusing)
    with pytest.raises(ConfigError, match="train.compile=true: model.family=diffusion has a block"):
        load_config("dit-debug", ["train.compile=true"])
    load_config("dit-debug", ["train.compile=false"])

