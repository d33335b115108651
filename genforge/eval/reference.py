"""Reference statistics for FID, KID and precision/recall: features of real images, computed once and cached.

Where the real images come from (`eval.ref`, `genforge eval --ref`):
- default: the held-out split of the run's data (`run.heldout_batches`; a latent/token cache: the data section
  it was encoded from, in its cache.json), at data.image_size;
- an image folder: all its images, resized like training data (ADM center crop) to the run's data.image_size;
- a statistics file: a `.safetensors` written here (any cache file below), or an `.npz` with `mu` and `sigma`
  of the same Inception pool3 feature (pytorch-fid / ADM reference batches; FID only: no features for KID/PRDC).

Cache: `$GENFORGE_CACHE/fid/<key>.safetensors` (default `~/.cache/genforge/fid`) holding `features` float32
[N, D] (for KID and PRDC), `mu` [D] and `sigma` [D, D] float64 (for FID), and the description the key hashes
in its metadata. The key is a sha256 of: the data (source, path and for a folder the names, sizes and mtimes of
its files, shapes parameters, split, number of images), the preprocessing (data.image_size, the source's
resize rule, the feature network's resize to its input size and input rule) and the feature network's file (path,
size, mtime). Changing any of them computes new statistics; nothing is ever overwritten in place (atomic rename).
Version 2: the Inception features are resized as NVlabs' detector resizes (`genforge.nn.features.fid_resize`;
issue 59), so statistics cached under version 1 (pytorch-fid's resize) are recomputed, never reused.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from genforge.core.status import console
from genforge.core.config import DataConfig
from genforge.core.files import cache_root
from genforge.data.base import source_of
from genforge.data.images import to_uint8
from genforge.data.loader import heldout_batches, heldout_split, image_data, pixel_field
from genforge.data.video import clip_frames
from genforge.core.collectives import gather_rows, main_decides, rank_and_world
from genforge.eval.distribution_metrics import gaussian_stats
from genforge.nn.features import PoolFeatures

REFERENCE_VERSION = 2  # 1: features resized as pytorch-fid; 2: as NVlabs' Inception (`feature_resize` below)
STATS_SUFFIXES = (".safetensors", ".npz")


@dataclass
class Reference:
    """Real-image statistics: Gaussian fit for FID, the features themselves for KID/PRDC (None from an .npz)."""

    mu: Tensor
    sigma: Tensor
    features: Tensor | None
    path: Path
    n: int | None  # images behind the statistics (None: an .npz that does not say)


@torch.no_grad()
def pool_features(net: PoolFeatures, images: Tensor, device: torch.device | str, batch_size: int = 50) -> Tensor:
    """Features [B, D] (float32, CPU) of images [B, 3, H, W] in [-1, 1], quantised to uint8 first."""
    pixels = to_uint8(images)
    features = [net.pool(pixels[i : i + batch_size].to(device)).float().cpu()
                for i in range(0, len(pixels), batch_size)]
    return torch.cat(features) if features else torch.zeros(0, net.dim)


def reference_source(data: DataConfig, ref: str | None) -> DataConfig | Path:
    """What to compare with: a statistics file (Path), or the data whose held-out images are the reference."""
    if ref is None:
        images = image_data(data)
        if images is None:
            raise ValueError(f"the cache {data.path} cannot say which images it was encoded from; give --ref")
        return images
    path = Path(ref).expanduser()
    if path.is_dir():
        return DataConfig(source="folder", path=str(path.resolve()), image_size=data.image_size)
    if path.is_file() and path.suffix in STATS_SUFFIXES:
        return path
    if not path.exists():
        raise FileNotFoundError(f"--ref {ref}: no such image folder or statistics file")
    raise ValueError(f"--ref {ref}: expected an image folder, a .safetensors statistics file written by genforge "
                     "or an .npz with mu and sigma")


def describe(data: DataConfig, n: int, net: PoolFeatures) -> dict[str, Any]:
    """Everything the reference features depend on (hashed into the cache key)."""
    source = source_of(data)
    fields = data.model_dump(mode="json", exclude={"num_workers", "flip", "max_bad_fraction", "shuffle_buffer"})
    fields.update(source.identity(data))
    fingerprint = net.fingerprint()
    return {"version": REFERENCE_VERSION, "data": fields, "split": heldout_split(data), "n": n,
            "resize": source.resize, "feature_resize": fingerprint.get("resize"), "features": fingerprint}


def reference_stats(net: PoolFeatures, source: DataConfig | Path, n: int, device: torch.device | str,
                    batch_size: int = 50, cache_dir: str | Path | None = None) -> Reference | None:
    """The reference statistics on rank 0 (None on the other ranks). Every rank must call it: when they are not
    cached, each rank extracts the features of its share of the first `n` held-out images."""
    rank, world = rank_and_world()
    if isinstance(source, Path):
        return load_stats(source, net) if rank == 0 else None
    description = describe(source, n, net)
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:24]
    path = cache_root(cache_dir) / "fid" / f"{key}.safetensors"
    if main_decides(path.is_file):
        if rank == 0:
            console().info(f"reference statistics: cached {path}")
            return load_stats(path, net)
        return None
    features, index, start = [], [], 0
    for number, images in enumerate(heldout_batches(source, n, batch_size, pixel_field(source))):
        images = clip_frames(images)  # clips: every frame is a reference image
        if number % world == rank:
            features.append(pool_features(net, images, device, batch_size))
            index.append(torch.arange(start, start + len(images)))
        start += len(images)
    local = torch.cat(features) if features else torch.zeros(0, net.dim)
    every = gather_rows(local, torch.cat(index) if index else torch.zeros(0, dtype=torch.long))
    if rank != 0:
        return None
    if len(every) < 2:
        raise ValueError(f"reference statistics need at least 2 readable images, found {len(every)} in "
                         f"{description['data']['source']} {source.path or ''} ({description['split']} split)")
    reference = save_stats(path, every, description)
    console().info(f"reference statistics: computed {path} ({len(every)} images)")
    return reference


def save_stats(path: Path, features: Tensor, description: dict[str, Any]) -> Reference:
    """Write features, mu and sigma with the description as metadata (atomically: write, then rename)."""
    mu, sigma = gaussian_stats(features)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    metadata = {"description": json.dumps(description), "network": description["features"]["network"],
                "n": str(len(features))}
    save_file({"features": features.float().contiguous(), "mu": mu, "sigma": sigma}, str(tmp), metadata=metadata)
    os.replace(tmp, path)
    return Reference(mu, sigma, features.float(), path, len(features))


def read_stats_file(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors (`mu` and `sigma` present, else ValueError naming the file) and metadata of a statistics file:
    a .safetensors from `save_stats`, or an .npz with `mu` and `sigma` (pytorch-fid, clean-fid, ADM, EDM)."""
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as arrays:
                names = list(arrays.files)
                tensors = {k: torch.from_numpy(arrays[k]) for k in ("mu", "sigma") if k in names}
            metadata: dict[str, str] = {}
        else:
            with safe_open(str(path), framework="pt") as file:
                names = list(file.keys())
                tensors = {k: file.get_tensor(k) for k in names}
                metadata = file.metadata() or {}
    except Exception as err:  # any reader error: name the file
        raise ValueError(f"{path}: not a readable statistics file ({type(err).__name__}: {err})") from err
    if "mu" not in tensors or "sigma" not in tensors:
        raise ValueError(f"{path}: a statistics file needs `mu` and `sigma`; it has {sorted(names) or 'nothing'}")
    return tensors, metadata


def load_stats(path: Path, net: PoolFeatures) -> Reference:
    """A statistics file (.safetensors from `save_stats`, or .npz with mu and sigma), checked against `net`."""
    tensors, metadata = read_stats_file(path)
    network = net.fingerprint()["network"]
    if metadata.get("network", network) != network:
        raise ValueError(f"{path} holds features of {metadata['network']}, but the feature network in use is "
                         f"{network}")
    mu, sigma = tensors["mu"].double().reshape(-1), tensors["sigma"].double()
    if mu.shape != (net.dim,) or sigma.shape != (net.dim, net.dim):
        raise ValueError(f"{path}: mu {tuple(mu.shape)} / sigma {tuple(sigma.shape)} do not fit {net.dim}-d "
                         f"features of {network}")
    features = tensors.get("features")
    n = len(features) if features is not None else (int(metadata["n"]) if "n" in metadata else None)
    return Reference(mu, sigma, features.float() if features is not None else None, path, n)
