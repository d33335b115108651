"""model.backbone.magnitude_preserving on the trainer: the forced weight normalisation (EDM2 eq. 66) runs after every
optimizer step, so every stored filter of a checkpoint is at RMS 1."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from genforge.app.config import load_config
from genforge.app.runs import make_trainer

MP_16PX = ["data.image_size=16", "model.backbone.dim=16", "model.backbone.dim_mults=[1,2]",
           "model.backbone.attention_levels=[1]", "model.backbone.head_dim=16",
           "model.backbone.magnitude_preserving=true",
           "train.steps=3", "train.checkpoint_every=3", "train.sample_every=0", "eval.every=0", "data.num_workers=0",
           "train.lr=0.1", "train.precision=no"]  # float32 (the preset's auto is bf16 on some CPUs); Adam steps of ~0.1 per element: without the projection the RMS drifts by ~1 %


def test_every_stored_filter_is_at_unit_rms_after_training(tmp_path):
    run = make_trainer(load_config("unet-shapes", MP_16PX), tmp_path / "run").fit()
    weights = load_file(str(run / "checkpoints" / "step-000003" / "model.safetensors"))
    filters = {name: w for name, w in weights.items() if w.ndim >= 2}
    assert filters and any("qkv" in name for name in filters)
    for name, w in filters.items():
        rms = w.float().flatten(1).pow(2).mean(1).sqrt()
        assert torch.allclose(rms, torch.ones_like(rms), atol=2e-4), name  # 1/(1 + eps) with eps 1e-4
