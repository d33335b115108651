"""Checkpoint size of a latent DiT on a pretrained VAE: the VAE as a genforge klvae run (its weights copied into every
DiT checkpoint) against `model.latent.codec: diffusers` (the checkpoint refers to the folder by path and content
hash). The VAE is an AutoencoderKL with the SD VAE's architecture (stabilityai/sd-vae-ft-ema's config, random
weights: the size is what matters), the DiT the dit-latent-debug one on 32px shapes.

    python benchmarks/codec_reference.py [--work DIR]

prints the size of model.safetensors, ema.safetensors and the whole checkpoint folder for both.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from diffusers import AutoencoderKL

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genforge.app.config import load_config  # noqa: E402
from genforge.app.runs import make_trainer  # noqa: E402

SD_VAE = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4, sample_size=256,
              down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
              scaling_factor=0.18215)
QUICK = ["train.sample_every=0", "eval.every=0", "data.num_workers=0", "train.steps=1", "train.checkpoint_every=1",
         "data.image_size=32", "train.batch_size=4", "data.shapes.n=16"]


def folder_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="codec-reference-"))
    torch.manual_seed(0)
    vae = work / "sd-vae"
    AutoencoderKL(**SD_VAE).save_pretrained(vae)
    # before: the VAE "trained" into a klvae run (model.pretrained, one step at lr 1e-30), the DiT on that run
    klvae = load_config("klvae-debug", [*QUICK, f"model.pretrained={vae}", "train.lr=1e-30",
                                        "model.block_out_channels=[128,256,512,512]", "model.layers_per_block=2",
                                        "model.norm_num_groups=32"])
    make_trainer(klvae, work / "klvae").fit()
    copy = load_config("dit-latent-debug", [*QUICK, "model.latent.codec=tokenizer",
                                            f"model.latent.tokenizer={work / 'klvae'}"])
    make_trainer(copy, work / "dit-copy").fit()
    # now: the folder itself as the codec
    ref = load_config("dit-latent-debug", [*QUICK, "model.latent.codec=diffusers", f"model.latent.pretrained={vae}"])
    make_trainer(ref, work / "dit-reference").fit()
    print(f"VAE folder (SD VAE architecture): {folder_mib(vae):.1f} MiB")
    print(f"{'DiT checkpoint':<36} {'model':>10} {'ema':>10} {'folder':>10}")
    for label, run in (("codec copied (codec: tokenizer)", "dit-copy"), ("codec referred to (codec: diffusers)",
                                                                          "dit-reference")):
        ckpt = work / run / "checkpoints" / "step-000001"
        sizes = [(ckpt / f).stat().st_size / 2**20 for f in ("model.safetensors", "ema.safetensors")]
        print(f"{label:<36} {sizes[0]:>8.1f}Mi {sizes[1]:>8.1f}Mi {folder_mib(ckpt):>8.1f}Mi")
    if args.work is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
