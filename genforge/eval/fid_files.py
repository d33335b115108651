"""FID between image folders and statistics files (`genforge fid A B`), and statistics files other tools read.

- A folder: every image under it (sub-folders too, genforge.data.folder's extensions, hidden entries skipped, in
  sorted order), read as RGB uint8 at its own size: no crop and no resize of ours, as StyleGAN2-ADA / EDM /
  clean-fid hand images to the detector, whose resize (`genforge.nn.features.fid_resize`) takes them to 299 px.
- A statistics file: an `.npz` with `mu` and `sigma` (pytorch-fid, clean-fid, EDM's `fid.py ref`, ADM), or a
  genforge `.safetensors` (a reference cache file: checked to hold the same network's features, resize included).
- `save_npz` writes float64 `mu` [D] and `sigma` [D, D] under those names: what pytorch-fid's `fid_score`
  (`np.load(path)["mu"]`, `["sigma"]`), clean-fid and EDM's `fid.py calc --ref` read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from genforge.data.folder import EXTENSIONS, scan_images
from genforge.data.images import load_rgb
from genforge.eval.distribution_metrics import frechet_distance, gaussian_stats
from genforge.eval.reference import STATS_SUFFIXES, load_stats, read_stats_file
from genforge.nn.features import PoolFeatures

Report = Callable[[int, int], None]  # (images read so far, images in all)


@dataclass
class FidInput:
    """What one argument of `genforge fid` names: an image folder (`files`, relative paths) or a statistics file."""

    path: Path
    files: list[str] | None  # None: a statistics file

    @property
    def kind(self) -> str:
        return "folder" if self.files is not None else "statistics"


@dataclass
class Stats:
    """Gaussian statistics (float64) of the pool3 features of one input, and how many images are behind them."""

    mu: Tensor
    sigma: Tensor
    n: int | None  # None: a statistics file that does not say


def check_input(path: str | Path, name: str) -> FidInput:
    """`path` as an input of `genforge fid`, checked before any network is loaded: a folder with at least 2 images,
    or a readable statistics file with `mu` and `sigma`. FileNotFoundError / ValueError naming `name` and `path`."""
    path = Path(path).expanduser()
    if path.is_dir():
        files = scan_images(path)
        if len(files) < 2:
            found = "no images" if not files else "only 1 image"
            raise ValueError(f"{name} {path}: {found} in the folder (FID needs at least 2; looked for "
                             f"{', '.join(EXTENSIONS)}, sub-folders included)")
        return FidInput(path, files)
    if not path.exists():
        raise FileNotFoundError(f"{name} {path}: no such image folder or statistics file")
    if path.suffix not in STATS_SUFFIXES:
        raise ValueError(f"{name} {path}: expected an image folder or a statistics file (.npz with mu and sigma, or a "
                         ".safetensors written by genforge)")
    try:
        read_stats_file(path)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    return FidInput(path, None)


def read_pixels(path: Path) -> Tensor:
    """uint8 [3, H, W] of an image file (genforge.data.images.load_rgb: EXIF orientation, alpha over white);
    ValueError naming the file when it cannot be read."""
    try:
        return torch.from_numpy(np.asarray(load_rgb(path)).copy()).permute(2, 0, 1)
    except Exception as err:  # any decoder error (PIL raises several kinds): name the file
        raise ValueError(f"{path}: cannot read it as an image ({type(err).__name__}: {err})") from None


@torch.no_grad()
def folder_features(net: PoolFeatures, folder: FidInput, device: torch.device | str, batch_size: int = 50,
                    report: Report | None = None) -> Tensor:
    """Features [N, D] (float32, CPU) of every image of a folder at its own size; images of one size share a
    batch (a run of same-size files in sorted order), so a folder of one size runs `batch_size` at a time."""
    files = folder.files or []
    features: list[Tensor] = []
    pending: list[Tensor] = []

    def flush() -> None:
        if pending:
            features.append(net.pool(torch.stack(pending).to(device)).float().cpu())
            pending.clear()
            if report is not None:
                report(sum(len(f) for f in features), len(files))

    for name in files:
        pixels = read_pixels(folder.path / name)
        if pending and (pixels.shape != pending[0].shape or len(pending) == batch_size):
            flush()
        pending.append(pixels)
    flush()
    return torch.cat(features)


def input_stats(net: PoolFeatures, given: FidInput, device: torch.device | str, batch_size: int = 50,
                report: Report | None = None) -> Stats:
    """The statistics of a folder (its features' mean and covariance) or of a statistics file (checked against
    `net`: feature size, and the network and resize a genforge file names)."""
    if given.files is None:
        loaded = load_stats(given.path, net)
        return Stats(loaded.mu, loaded.sigma, loaded.n)
    mu, sigma = gaussian_stats(folder_features(net, given, device, batch_size, report))
    return Stats(mu, sigma, len(given.files))


def fid_of(a: Stats, b: Stats) -> float:
    """FID of two statistics (Heusel et al. 2017, eq. 6; genforge.eval.distribution_metrics.frechet_distance)."""
    return frechet_distance(a.mu, a.sigma, b.mu, b.sigma)


def check_npz_path(path: str | Path, name: str = "--save-stats") -> Path:
    """Where `save_npz` may write: a path ending in .npz that is not a folder (ValueError naming `name`)."""
    path = Path(path).expanduser()
    if path.suffix != ".npz" or path.is_dir():
        raise ValueError(f"{name} {path}: give a file name ending in .npz")
    return path


def save_npz(path: str | Path, stats: Stats) -> Path:
    """Write float64 `mu` [D] and `sigma` [D, D] to an .npz (atomically: a temporary file, then rename), as
    pytorch-fid's `--save-stats` and EDM's `fid.py ref` write them."""
    path = check_npz_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as file:  # a file object: np.savez adds no second suffix
        np.savez(file, mu=stats.mu.double().numpy(), sigma=stats.sigma.double().numpy())
    os.replace(tmp, path)
    return path
