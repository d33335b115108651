"""One loader builder for every source: a step-indexed, rank-sharded sampler and a collate that drops
(and reports) samples that could not be read.

The data position is a pure function of the optimizer step: optimizer step `s` consumes global batch
`s mod batches_per_epoch` of epoch `s div batches_per_epoch`, whose order is a permutation seeded by
(seed, epoch). Each micro-batch of each rank is a fixed slice of that global batch, so 1 process with
batch B, 2 processes with B/2 each, and 2 accumulation steps of B/2 all see exactly the same samples,
and resuming at step `s` needs nothing but `s`.

Webdataset shards stream instead (genforge.data.shards): their order depends on the number of processes
and workers, but resuming still needs nothing but `s` (`build_train_batches` serves both).

Joint image + video training (`data.images`) draws each global batch from one of two such loaders: global batch
`p` is images when floor((p + 1)·ratio) > floor(p·ratio), so the clips' loader is at batch p − floor(p·ratio) and
the images' at floor(p·ratio), both pure functions of `p` again.
"""

from __future__ import annotations

import itertools
import json
import math
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, Subset

from genforge.core.status import console
from genforge.core.config import DataConfig, TrainConfig
from genforge.core.random import mix_seed
from genforge.data.base import BadDataError, DataInfo, collate, source_of


def build_dataset(cfg: DataConfig, split: str = "train", flip: bool | None = None,
                  world_size: int | None = None) -> Dataset:
    """The data set of the source `cfg.source` names (raises FileNotFoundError/ValueError for a bad folder or shard
    list). `world_size`: the number of training processes, for sources that split by process (shards: checked
    here, before training, that every worker of every process gets a shard)."""
    return source_of(cfg).build(cfg, split, cfg.flip if flip is None else flip, world_size)


def data_info(dataset: Dataset, cfg: DataConfig) -> DataInfo:
    """What the model needs to know about `dataset` (built by `build_dataset(cfg)`)."""
    return source_of(cfg).info(dataset, cfg)


def data_notes(dataset: Dataset, cfg: DataConfig) -> list[str]:
    """What a run says about its data set beyond its samples: the images a folder's metadata leaves out, as Hugging
    Face datasets does (`DataSource.notes`)."""
    return source_of(cfg).notes(dataset)


def scan_data_info(cfg: DataConfig) -> DataInfo:
    """`data_info` without loading samples where the source can (a cache's manifest), else from a scan."""
    return source_of(cfg).scan_info(cfg)


def image_data(cfg: DataConfig) -> DataConfig | None:
    """The data section of the images a run trains on: `cfg`, or for a cache the section it was encoded from
    (None when the cache's manifest cannot be read)."""
    return source_of(cfg).image_data(cfg)


def pixel_field(cfg: DataConfig) -> str:
    """The batch field of the source's pixels: "image", or "video" for clips [C, T, H, W]."""
    return source_of(cfg).field


def heldout_split(cfg: DataConfig) -> str:
    """The split tokenizers are scored on and their previews drawn from: held-out images when the source has any
    (shapes: another seed; a folder: data.val_fraction > 0), else the training data (shards: in order)."""
    return source_of(cfg).heldout_split(cfg)


def class_names(cfg: DataConfig) -> list[str] | None:
    """The data set's class names in label order (a cache: those of the images it encoded), or None."""
    images = image_data(cfg)
    return source_of(images).class_names(images) if images is not None else None


def heldout_samples(cfg: DataConfig, n: int, spread: bool = False) -> Iterator[dict[str, Any]]:
    """The first `n` readable samples of `heldout_split(cfg)`, unflipped (`DataSource.heldout_samples`)."""
    return source_of(cfg).heldout_samples(cfg, n, spread)


def preview_conditions(cfg: DataConfig, n: int) -> dict[str, Any]:
    """The held-out captions / labels / directions of `n` samples (`DataSource.preview_conditions`)."""
    return source_of(cfg).preview_conditions(cfg, n)


def judged_by_shapes_judge(cfg: DataConfig) -> bool:
    """Whether the images behind `cfg` (a cache: those it encoded) have the shapes classes the judge knows."""
    images = image_data(cfg)
    return images is not None and source_of(images).judge_classes


def has_motion(cfg: DataConfig) -> bool:
    """Whether the samples of `cfg` carry the true motion `direction` (moving shapes)."""
    return source_of(cfg).motion


@dataclass(frozen=True)
class HeldOutData:
    """A run's held-out data as the application layer hands it to its task (genforge.core.task.HeldOut): for a
    cache, that of the data it was encoded from. Nothing is read until a task asks."""

    data: DataConfig  # the run's data section

    def pixels(self) -> DataConfig:
        images = image_data(self.data)
        if images is None:
            raise ValueError(f"data.path={self.data.path}: the data this cache was encoded from is unknown (its "
                             "cache.json cannot be read), so there are no held-out samples")
        return images

    def samples(self, n: int, spread: bool = False) -> dict[str, Any]:
        return heldout_batch(self.pixels(), n, spread)

    def conditions(self, n: int) -> dict[str, Any]:
        return preview_conditions(self.data, n)


def heldout_batches(cfg: DataConfig, n: int, batch_size: int, field: str = "image") -> Iterator[Tensor]:
    """The first `n` readable images (or clips: `field` "video") of `heldout_split(cfg)`, unflipped, in batches
    [b, C, H, W] ([b, C, T, H, W]) in [-1, 1]."""
    readable = (item[field] for item in heldout_samples(cfg, n))
    while batch := list(itertools.islice(readable, batch_size)):
        yield torch.stack(batch)


def heldout_sample_batches(cfg: DataConfig, n: int, batch_size: int) -> Iterator[dict[str, Any]]:
    """`heldout_samples` collated in batches of `batch_size` (the pixels with `label`, `direction`, `text`, `key`
    where the source has them)."""
    readable = heldout_samples(cfg, n)
    while items := list(itertools.islice(readable, batch_size)):
        yield collate_common(items)


def collate_common(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields every one of `items` has, collated (held-out samples: nothing was skipped)."""
    fields = set.intersection(*(set(item) for item in items)) - {"skipped"}
    batch = collate([{k: v for k, v in item.items() if k in fields} for item in items])
    batch.pop("skipped")
    batch.pop("missing", None)
    return batch


def heldout_batch(cfg: DataConfig, n: int, spread: bool = False) -> dict[str, Any]:
    """`n` readable held-out samples (`heldout_samples`) collated into one batch (`image` [n, C, H, W], `label` [n],
    `text`, `image_embed` [n, D], `key`: the fields every sample has)."""
    items = list(heldout_samples(cfg, n, spread))
    if not items:
        raise ValueError(f"no readable images in the {heldout_split(cfg)!r} split of the data")
    return collate_common(items)


def dataset_size(dataset: Dataset) -> int | None:
    """Samples in a map-style data set; None for a stream (webdataset shards), whose size is unknown."""
    return None if isinstance(dataset, IterableDataset) else len(dataset)


def dataset_part(dataset: Dataset, rank: int, world: int, batch_size: int = 1) -> Dataset:
    """Part `rank` of `world` contiguous parts of a data set's ordered pass (`genforge encode` on several processes):
    a block of whole batches of `batch_size` indices of a map-style data set (so every batch holds the samples it
    holds in one process), a block of the shards of a stream (its `part`). The parts in rank order are the whole
    pass, in the order one process reads it (a stream read by several DataLoader workers interleaves their shards,
    in each part as in the whole)."""
    if world == 1:
        return dataset
    if isinstance(dataset, IterableDataset):
        part = getattr(dataset, "part", None)
        if part is None:
            raise ValueError(f"a {type(dataset).__name__} cannot be split over {world} processes")
        return part(rank, world)
    size = len(dataset)
    batches = -(-size // batch_size)
    start, stop = (min(size, batch_size * (batches * r // world)) for r in (rank, rank + 1))
    return Subset(dataset, range(start, stop))


def micro_batch_size(global_batch: int, grad_accum: int = 1, world_size: int = 1) -> int:
    """Samples in each micro-batch of each rank (ValueError when the global batch does not split evenly)."""
    if global_batch % (grad_accum * world_size):
        raise ValueError(
            f"train.batch_size={global_batch} must be divisible by train.grad_accum x processes "
            f"= {grad_accum} x {world_size}"
        )
    return global_batch // (grad_accum * world_size)


def check_enough_samples(dataset: Dataset, data: DataConfig, batch_size: int) -> None:
    """BadDataError when a map-style data set holds fewer samples than one global batch (a stream cannot tell)."""
    size = dataset_size(dataset)
    if size is not None and size < batch_size:
        raise BadDataError(
            f"data.path={data.path!r} (data.source={data.source}) holds {size} training sample(s), fewer than "
            f"train.batch_size={batch_size}: every optimizer step takes one batch of distinct samples. Lower "
            f"train.batch_size to at most {size} (e.g. --set train.batch_size={max(1, size)}) or add data")


def refuse_unreadable_start(dataset: Dataset, data: DataConfig, skips: "SkipLog", record: bool) -> None:
    """BadDataError (exit 2) before training when the data set's first samples are all unreadable (an image folder
    of broken files); `record`: they are listed in the skip log (the main process)."""
    bad = unreadable_start(dataset)
    if not bad:
        return
    if record:
        skips.path.parent.mkdir(parents=True, exist_ok=True)
        skips.record(0, bad, 0)
    size = dataset_size(dataset) or len(bad)
    which = f"all {size}" if len(bad) == size else f"the first {len(bad)} of {size}"
    reasons = "; ".join(f"{key}: {reason}" for key, reason in bad[:3])
    raise BadDataError(f"data.path={data.path!r}: {which} samples are unreadable ({reasons}"
                       f"{'; ...' if len(bad) > 3 else ''}); all are listed in {skips.path}")


def unreadable_start(dataset: Dataset, limit: int = 64) -> list[tuple[str, str]]:
    """(key, reason) of the first `limit` samples of a map-style data set (all of them when it holds fewer) when
    every one is unreadable; [] as soon as one is readable, and for a stream. Cheap for good data: one read."""
    if isinstance(dataset, IterableDataset):
        return []
    bad: list[tuple[str, str]] = []
    for index in range(min(limit, len(dataset))):
        sample = dataset[(index, None)]
        if "bad" not in sample:
            return []
        bad.append((sample["key"], sample["bad"]))
    return bad


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
        where = getattr(self.dataset, "root", "the data set")
        raise BadDataError(f"{self.max_tries} unreadable samples in a row in {where}, from {skipped[0][0]!r} on ("
                           + "; ".join(f"{key}: {reason}" for key, reason in skipped[:3]) + "); is it a folder of "
                           "readable files?")


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


def image_batches_before(position: int, ratio: float) -> int:
    """Image batches among global batches [0, `position`) of a joint image + video run with `data.images.ratio`."""
    return math.floor(position * ratio)


def is_image_batch(position: int, ratio: float) -> bool:
    """Whether global batch `position` of a joint image + video run is images (ratio of them, evenly spread)."""
    return image_batches_before(position + 1, ratio) > image_batches_before(position, ratio)


class JointBatches:
    """The micro-batches of a joint image + video run: for each global batch from `start_position` on, its
    `grad_accum` micro-batches all from the clips' loader or all from the images' (`is_image_batch`), an image
    batch's `image` [B, C, H, W] served as `video` [B, C, 1, H, W] (a 1-frame clip). At ratio 1 there are no clip
    batches (`clips` None: no clip is read)."""

    def __init__(self, clips: DataLoader | None, images: DataLoader, ratio: float, start_position: int,
                 grad_accum: int) -> None:
        self.clips, self.images, self.ratio = clips, images, ratio
        self.start_position, self.grad_accum = start_position, grad_accum

    def __iter__(self) -> Iterator[dict[str, Any]]:
        clips, images = iter(self.clips or ()), iter(self.images)
        for position in itertools.count(self.start_position):
            from_images = is_image_batch(position, self.ratio)
            for _ in range(self.grad_accum):
                if not from_images:
                    yield next(clips)
                    continue
                batch = next(images)
                batch["video"] = batch.pop("image").unsqueeze(2)  # [B, C, 1, H, W]
                yield batch


def build_train_batches(dataset: Dataset, data: DataConfig, train: TrainConfig, world_size: int = 1, rank: int = 0,
                        start_position: int = 0, pin_memory: bool = False) -> DataLoader | JointBatches:
    """This rank's micro-batches (`train.grad_accum` per optimizer step) from global batch `start_position` on,
    forever: a map-style data set through StepBatchSampler + build_loader; webdataset shards (a stream) through
    the rank's ShardStream, whose workers batch, and which skips the micro-batches consumed before. With
    `data.images`, clips of `dataset` and images of `data.images` mixed by JointBatches (the images' order seeded
    apart from the clips')."""
    if data.images is not None:
        ratio, image_cfg = data.images.ratio, data.joint_images()
        before = image_batches_before(start_position, ratio)
        clips = None if ratio >= 1 else build_train_batches(dataset, data.model_copy(update={"images": None}), train,
                                                            world_size, rank, start_position - before, pin_memory)
        images = build_train_batches(build_dataset(image_cfg, "train", world_size=world_size), image_cfg,
                                     train.model_copy(update={"seed": mix_seed(train.seed, 1)}), world_size, rank,
                                     before, pin_memory)
        return JointBatches(clips, images, ratio, start_position, train.grad_accum)
    if isinstance(dataset, IterableDataset):
        micro = micro_batch_size(train.batch_size, train.grad_accum, world_size)
        stream = dataset.stream(micro, world_size, rank, data.num_workers, train.seed,
                                consumed=start_position * train.grad_accum)
        return DataLoader(stream, batch_size=None, num_workers=data.num_workers, pin_memory=pin_memory,
                          persistent_workers=False, prefetch_factor=4 if data.num_workers else None,
                          worker_init_fn=_worker_init, collate_fn=_as_collated)
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
        self.warned = 0
        if path.is_file():  # resumed run: keep listing each file once
            self.listed = self._read_listed(path)

    @staticmethod
    def _read_listed(path: Path) -> set[str]:
        """The keys already listed; a line a kill tore (or any unreadable one) is ignored with a warning naming
        the file: the sample is simply listed again when it is met."""
        listed, torn = set(), 0
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                listed.add(str(json.loads(line)["key"]))
            except (ValueError, KeyError, TypeError):
                torn += bool(line.strip())
        if torn:
            console().warning(f"{path}: {torn} unreadable line(s) ignored (torn by an interrupted write?)")
        return listed

    WARNINGS = 5  # unreadable samples named on stderr per process; the rest only in skipped.jsonl

    def record(self, batch_size: int, skipped: list[tuple[str, str]], step: int) -> None:
        self.reads += batch_size + len(skipped)
        self.bad += len(skipped)
        new = [(key, reason) for key, reason in dict(skipped).items() if key not in self.listed]
        if not new:
            return
        for key, reason in new[: max(0, self.WARNINGS - self.warned)]:
            console().warning(f"skipped unreadable sample {key} ({reason}); listed in {self.path}")
        if self.warned < self.WARNINGS <= self.warned + len(new):
            console().warning(f"more unreadable samples are listed in {self.path} only")
        self.warned += len(new)
        self.listed.update(key for key, _ in new)
        with open(self.path, "a") as f:
            f.write("".join(json.dumps({"key": key, "reason": reason, "step": step}) + "\n" for key, reason in new))
