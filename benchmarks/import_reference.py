"""`genforge import` against facebookresearch/DiT's own code: its models.py DiT (from a checkout, `--reference`; timm's
three layers stood in, as benchmarks/common.py does) with random weights is saved as the `.pt` state dict its
checkpoints are, imported, and both networks run on the same (x, t, y), the null class included.

    python benchmarks/import_reference.py --reference /path/to/facebookresearch/DiT [--size S/2] [--input-size 8]

prints the inferred size and the largest difference of the outputs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from diffusers import AutoencoderKL

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import load_reference  # noqa: E402
from genforge.app.importer import import_run  # noqa: E402
from genforge.app.runs import load_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True, help="a facebookresearch/DiT checkout")
    parser.add_argument("--size", default="S/2", help="a DiT zoo size (models.py's DiT_models key, e.g. XL/2)")
    parser.add_argument("--input-size", type=int, default=8, help="latent side (the image is 2x this here)")
    args = parser.parse_args()
    models, _ = load_reference(args.reference)
    torch.manual_seed(0)
    official = models.DiT_models[f"DiT-{args.size}"](input_size=args.input_size, num_classes=1000).eval()
    with torch.no_grad():  # random weights everywhere (a fresh DiT's adaLN-Zero would output 0)
        for name, p in official.named_parameters():
            if name != "pos_embed":
                p.copy_(torch.randn_like(p) * 0.02)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        torch.save(official.state_dict(), work / "DiT.pt")
        AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                      block_out_channels=(16, 32), layers_per_block=1, norm_num_groups=8, latent_channels=4,
                      scaling_factor=0.18215).save_pretrained(work / "vae")
        imported = import_run(work / "DiT.pt", work / "run", vae=work / "vae")
        dit = load_run(work / "run").task.model
        x = torch.randn(4, 4, args.input_size, args.input_size)
        t, y = torch.tensor([0, 10, 500, 999]), torch.tensor([1, 2, 999, 1000])  # 1000: the null class
        with torch.no_grad():
            theirs, ours = official(x, t, y), dit(x, t, y)
    model = imported.config.model
    print(f"imported DiT-{args.size}: size {model.backbone.size}, {model.num_classes} classes, "
          f"{imported.config.data.image_size}px through the stand-in VAE")
    print(f"output scale (mean |official|): {theirs.abs().mean():.4f}")
    print(f"max |official - imported|:      {(theirs - ours).abs().max():.2e}")


if __name__ == "__main__":
    main()
