"""A stand-in tokenizer run for the cache tests (the tokenizer families are tested on their own): a run
directory with a checkpoint, whose task's `codec()` is an exact space-to-depth codec (latents), a colour
quantizer (tokens: ColourQuantizerCodec, 64 ids) or None (not a tokenizer). `load_run` is patched to open such a run; everything else
(`load_codec`, hashing, `genforge encode`, DiT's tokenizer codec) runs unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from genforge.app.config import load_config, to_yaml
from genforge.app import runs
from genforge.engine.checkpoint import CheckpointDir, save_tensors
from genforge.core.task import Task
from genforge.tokenizers.standins import ColourQuantizerCodec, SpaceToDepthCodec

MARKER = "fake-tokenizer.json"


class FakeTokenizer(Task):
    def __init__(self, scale: float, kind: str | None) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(float(scale)))  # its "weights": another scale, another hash
        self.the_codec = {"latent": SpaceToDepthCodec(3, 2, scale), "tokens": ColourQuantizerCodec(2, 4), None: None}[kind]

    def codec(self) -> nn.Module | None:
        return self.the_codec


def make_fake_tokenizer(run_dir: Path, scale: float = 0.5, kind: str | None = "latent",
                        data: tuple[str, ...] = ("data.shapes.n=40",)) -> Path:
    """A tokenizer run directory; its config's data section is dit-latent-debug's (16 px shapes) + `data`."""
    run_dir = Path(run_dir)
    ckpt = run_dir / "checkpoints" / "step-000001"
    ckpt.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(load_config("dit-latent-debug", list(data))))
    for name in ("model", "ema"):
        save_tensors(ckpt / f"{name}.safetensors", {"scale": torch.tensor(float(scale))})
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 1}))
    (run_dir / "checkpoints" / "latest").write_text("step-000001\n")
    (run_dir / MARKER).write_text(json.dumps({"scale": scale, "kind": kind}))
    return run_dir


@pytest.fixture
def fake_tokenizer(monkeypatch):
    """`make_fake_tokenizer`, with `load_run` able to open what it makes."""
    real = runs.load_run

    def load_run(run_dir, device="cpu", ema=True, synthesized=True):
        marker = Path(run_dir) / MARKER
        if not marker.is_file():
            return real(run_dir, device, ema, synthesized)
        with torch.device(device):
            task = FakeTokenizer(**json.loads(marker.read_text()))
        ckpt = CheckpointDir(Path(run_dir) / "checkpoints").latest()
        return runs.LoadedRun(load_config(str(Path(run_dir) / "config.yaml")), task.eval(), 1, ckpt, None)

    monkeypatch.setattr(runs, "load_run", load_run)
    return make_fake_tokenizer
