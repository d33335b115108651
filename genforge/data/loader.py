"""One loader builder for every source: a step-indexed, rank-sharded sampler and a collate that drops
(and reports) samples that could not be read.

The data position is a pure function of the optimizer step: optimizer step `s` consumes global batch
`s mod batches_per_epoch` of epoch `s div batches_per_epoch`, whose order is a permutation seeded by
(seed, epoch). Each micro-batch of each rank is a fixed slice of that global batch, so 1 process with
batch B, 2 processes with B/2 each, and 2 accumulation steps of B/2 all see exactly the same samples,
and resuming at step `s` needs nothing but `s`.

Webdataset shards stream instead (genforge.data.shards): their order depends on the number of processes
and workers, but resuming still needs nothing but `s` (`build_train_batches` serves both).
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from genforge.config.base import DataConfig, TrainConfig


@dataclass(frozen=True)
class DataInfo:
    """What a family needs to know about its data to build its model."""

    num_classes: int
    channels: int  # of the tensor a sample holds: 3 for images, latent channels for a latent cache, 0 for tokens
    image_size: int  # pixels (a cache: of the images it was encoded from)
    kind: str = "image"  # "image", or a cache's "latent" / "tokens"
    encoder_hash: str | None = None  # a cache's: sha256 of the tokenizer checkpoint that wrote it
    text_encoder: str | None = None  # a cache's text embeddings: fingerprint of the text encoder that wrote them


def build_dataset(cfg: DataConfig, split: str = "train", flip: bool | None = None,
                  world_size: int | None = None) -> Dataset:
    """The data set named by `cfg.source` (raises FileNotFoundError/ValueError for a bad folder or shard list).
    `world_size`: the number of training processes, for sources that split by process (shards: checked here,
    before training, that every worker of every process gets a shard)."""
    flip = cfg.flip if flip is None else flip
    if cfg.source == "shards":
        from genforge.data.shards import ShardDataset

        if split == "val":
            raise ValueError(f"data.source=shards ({cfg.path}) has no held-out split")
        return ShardDataset(cfg.path, cfg.image_size, flip=flip, shuffle_buffer=cfg.shuffle_buffer,
                            max_image_pixels=cfg.max_image_pixels, world_size=world_size,
                            num_workers=cfg.num_workers)
    if cfg.source == "shapes":
        from genforge.data.shapes import ShapesDataset, ShapesSpec

        spec = ShapesSpec(cfg.shapes.min_shapes, cfg.shapes.max_shapes, cfg.shapes.textured_fraction)
        seed = cfg.shapes.seed if split != "val" else cfg.shapes.seed + 1_000_003
        return ShapesDataset(cfg.shapes.n, cfg.image_size, seed=seed, spec=spec, flip=flip)
    if cfg.source == "folder":
        from genforge.data.folder import ImageFolderDataset

        if cfg.path is None or not Path(cfg.path).is_dir():
            raise FileNotFoundError(f"data.path: folder {cfg.path!r} does not exist")
        return ImageFolderDataset(cfg.path, cfg.image_size, split=split, val_fraction=cfg.val_fraction, flip=flip,
                                  seed=0, max_image_pixels=cfg.max_image_pixels)
    if cfg.source == "cache":
        from genforge.data.cache import CacheDataset, open_manifest

        if split == "val":
            raise ValueError(f"data.source=cache ({cfg.path}) has no held-out split")
        return CacheDataset(cfg.path, flip=flip, manifest=open_manifest(cfg, flip))
    raise ValueError(f"data.source={cfg.source!r} is not supported")


def data_info(dataset: Dataset, cfg: DataConfig) -> DataInfo:
    """What the model needs to know about `dataset` (built by `build_dataset(cfg)`)."""
    if cfg.source == "cache":
        return dataset.manifest.data_info()
    return DataInfo(num_classes=int(getattr(dataset, "num_classes", 0)), channels=3, image_size=cfg.image_size)


def scan_data_info(cfg: DataConfig) -> DataInfo:
    """`data_info` without loading samples: a cache's manifest, or a scan of the data set."""
    if cfg.source == "cache":
        from genforge.data.cache import open_manifest

        return open_manifest(cfg).data_info()
    return data_info(build_dataset(cfg), cfg)


def dataset_size(dataset: Dataset) -> int | None:
    """Samples in a map-style data set; None for a stream (webdataset shards), whose size is unknown."""
    return None if isinstance(dataset, IterableDataset) else len(dataset)


def micro_batch_size(global_batch: int, grad_accum: int = 1, world_size: int = 1) -> int:
    """Samples in each micro-batch of each rank (ValueError when the global batch does not split evenly)."""
    if global_batch % (grad_accum * world_size):
        raise ValueError(
            f"train.batch_size={global_batch} must be divisible by train.grad_accum x processes "
            f"= {grad_accum} x {world_size}"
        )
    return global_batch // (grad_accum * world_size)


class StepBatchSampler(Sampler[list[tuple[int, int]]]):
    """Yields this rank's micro-batches of `(index, aug_seed)` from optimizer step `start_step` on, forever."""

    def __init__(
        self,
        num_samples: int,
        global_batch: int,
        grad_accum: int = 1,
        world_size: int = 1,
        rank: int = 0,
        seed: int = 0,
        start_step: int = 0,
    ) -> None:
        micro_batch_size(global_batch, grad_accum, world_size)
        if num_samples < global_batch:
            raise ValueError(f"the data set has {num_samples} samples, fewer than train.batch_size={global_batch}")
        self.num_samples, self.global_batch, self.grad_accum = num_samples, global_batch, grad_accum
        self.world_size, self.rank, self.seed, self.start_step = world_size, rank, seed, start_step
        self.micro_batch = global_batch // (grad_accum * world_size)
        self.batches_per_epoch = num_samples // global_batch

    def epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Permutation of the data set for `epoch`, and a per-sample augmentation seed."""
        rng = np.random.default_rng([self.seed, epoch])
        return rng.permutation(self.num_samples), rng.integers(0, 2**62, size=self.num_samples)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        step = self.start_step
        epoch, order, seeds = -1, None, None
        while True:
            if step // self.batches_per_epoch != epoch:
                epoch = step // self.batches_per_epoch
                order, seeds = self.epoch_order(epoch)
            start = (step % self.batches_per_epoch) * self.global_batch
            for micro in range(self.grad_accum):
                offset = start + (micro * self.world_size + self.rank) * self.micro_batch
                idx = order[offset : offset + self.micro_batch]
                yield list(zip(idx.tolist(), seeds[idx].tolist()))
            step += 1

    def __len__(self) -> int:  # one epoch of this rank's micro-batches
        return self.batches_per_epoch * self.grad_accum


class ReplaceUnreadable(Dataset):
    """Serves a readable sample for every index: an item that comes back as {"key", "bad"} is replaced by the
    next readable one (index + 1, + 2, ..., the same in every run, so a resume replays it exactly), and the
    unreadable ones ride along in the sample's `skipped` list as (key, reason). Batches keep their size."""

    def __init__(self, dataset: Dataset, max_tries: int = 64) -> None:
        self.dataset, self.max_tries = dataset, max_tries

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: int | tuple[int, int]) -> dict[str, Any]:
        index, aug_seed = item if isinstance(item, tuple) else (item, None)
        skipped: list[tuple[str, str]] = []
        for k in range(self.max_tries):
            sample = self.dataset[((index + k) % len(self.dataset), aug_seed)]
            if "bad" not in sample:
                sample["skipped"] = skipped
                return sample
            skipped.append((sample["key"], sample["bad"]))
        raise RuntimeError(f"{self.max_tries} unreadable samples in a row, from {skipped[0][0]!r} "
                           f"({skipped[0][1]}) on; is this an image folder?")


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack sample dicts into a Batch; the unreadable samples they replaced go to `batch["skipped"]`."""
    batch: dict[str, Any] = {"skipped": [s for sample in samples for s in sample.get("skipped", ())]}
    for field in samples[0]:
        if field == "skipped":
            continue
        values = [s[field] for s in samples]
        if isinstance(values[0], torch.Tensor):
            batch[field] = torch.stack(values)
        elif isinstance(values[0], (int, np.integer)):
            batch[field] = torch.tensor(values, dtype=torch.long)
        else:
            batch[field] = values
    return batch


def _worker_init(worker_id: int) -> None:
    """Stop signals are the main process's business: it finishes the step, checkpoints and shuts workers down."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


def build_loader(dataset: Dataset, sampler: StepBatchSampler, num_workers: int, pin_memory: bool,
                 seed: int = 0) -> DataLoader:
    """A DataLoader that decodes in `num_workers` worker processes; unreadable samples are replaced and
    reported (see ReplaceUnreadable). The workers' RNGs are seeded from `seed` (not from the global torch
    RNG), so a resumed run gives its workers the same seeds as an uninterrupted one."""
    return DataLoader(
        ReplaceUnreadable(dataset),
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        persistent_workers=False,
        prefetch_factor=4 if num_workers else None,
        worker_init_fn=_worker_init,
        generator=torch.Generator().manual_seed(seed),
    )


def _as_collated(batch: dict[str, Any]) -> dict[str, Any]:
    """A stream's workers collate their micro-batches themselves (the default would turn tuples into lists)."""
    return batch


def build_train_batches(dataset: Dataset, data: DataConfig, train: TrainConfig, world_size: int = 1, rank: int = 0,
                        start_position: int = 0, pin_memory: bool = False) -> DataLoader:
    """This rank's micro-batches (`train.grad_accum` per optimizer step) from global batch `start_position` on,
    forever: a map-style data set through StepBatchSampler + build_loader; webdataset shards (a stream) through
    the rank's ShardStream, whose workers batch, and which skips the micro-batches consumed before."""
    if isinstance(dataset, IterableDataset):
        micro = micro_batch_size(train.batch_size, train.grad_accum, world_size)
        stream = dataset.stream(micro, world_size, rank, data.num_workers, train.seed,
                                consumed=start_position * train.grad_accum)
        return DataLoader(stream, batch_size=None, num_workers=data.num_workers, pin_memory=pin_memory,
                          persistent_workers=False, prefetch_factor=4 if data.num_workers else None,
                          worker_init_fn=_worker_init, collate_fn=_as_collated)
    from genforge.engine.random import mix_seed

    sampler = StepBatchSampler(len(dataset), train.batch_size, train.grad_accum, world_size, rank, seed=train.seed,
                               start_step=start_position)
    return build_loader(dataset, sampler, data.num_workers, pin_memory, seed=mix_seed(train.seed, rank,
                                                                                        start_position))


class SkipLog:
    """Lists every unreadable sample once in `skipped.jsonl` (key, reason, step) and counts reads, so the
    trainer can stop when the share of unreadable samples passes `data.max_bad_fraction`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reads = 0  # samples read, unreadable ones included
        self.bad = 0  # unreadable reads (a bad file read in two epochs counts twice)
        self.listed: set[str] = set()
        if path.is_file():  # resumed run: keep listing each file once
            self.listed = {json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip()}

    def record(self, batch_size: int, skipped: list[tuple[str, str]], step: int) -> None:
        self.reads += batch_size + len(skipped)
        self.bad += len(skipped)
        new = [(key, reason) for key, reason in dict(skipped).items() if key not in self.listed]
        if not new:
            return
        self.listed.update(key for key, _ in new)
        with open(self.path, "a") as f:
            f.write("".join(json.dumps({"key": key, "reason": reason, "step": step}) + "\n" for key, reason in new))
