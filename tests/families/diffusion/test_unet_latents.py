"""The U-Net backbone on latents (docs/diffusion.md, the space-to-depth rows of the lever table): the U-Net models
the 12x8x8 space-to-depth latents of 16-px images, trains, and its samples decode to 16-px images."""

from __future__ import annotations

from genforge.app.api import load_run
from genforge.app.config import load_config
from genforge.app.runs import make_trainer

S2D_16PX = ["model.latent={codec: space_to_depth, factor: 2, scale: 1.0}", "data.image_size=16",
            "model.backbone.dim=16", "model.backbone.dim_mults=[1,2]", "model.backbone.attention_levels=[1]",
            "model.backbone.head_dim=16", "data.shapes.n=64", "train.steps=2", "train.checkpoint_every=2",
            "train.sample_every=0", "eval.every=0", "data.num_workers=0", "model.diffusion.sample_steps=2",
            "log.progress=false", "log.tensorboard=false"]


def test_a_unet_trains_on_space_to_depth_latents_and_samples_images(tmp_path):
    cfg = load_config("unet-shapes", S2D_16PX)
    run_dir = make_trainer(cfg, tmp_path / "run").fit()
    run = load_run(run_dir, device="cpu")
    assert run.task.model.in_channels == 12  # 3 channels x 2 x 2: the U-Net sees the latent, not the pixels
    images = run.sample(n=4, seed=0)
    assert images.shape == (4, 3, 16, 16) and images.min() >= -1 and images.max() <= 1
