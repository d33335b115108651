"""The data layer's leaf: what a data set tells a family (`DataInfo`), the interface a data source registers
(`DataSource`), the collate every loader uses, and the errors of caches and streams."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterator, TypeVar

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from genforge.core.config import DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.core.status import console
from genforge.core.task import Batch
from genforge.data.splits import DEFAULT_SPLIT, HELDOUT_SPLITS

T = TypeVar("T")


@dataclass(frozen=True)
class DataInfo:
    """What a family needs to know about its data to build its model."""

    num_classes: int
    channels: int  # of the tensor a sample holds: 3 for images, latent channels for a latent cache, 0 for tokens
    image_size: int  # pixels (a cache: of the images it was encoded from)
    kind: str = "image"  # "image", or a cache's "latent" / "tokens"
    encoder_hash: str | None = None  # a cache's: sha256 of the tokenizer checkpoint that wrote it
    text_encoder: str | None = None  # a cache's text embeddings: fingerprint of the text encoder that wrote them


class CacheError(ValueError):
    """A cache that cannot be written or read, or that does not fit the run; the message names the file."""


class BadDataError(ValueError):
    """Data a run cannot train on (a field the task needs is missing, nothing is readable): bad input, so the
    CLI exits 2; the message names the file or sample and the field."""


# What each condition field is, and where a sample gets it, for errors naming a missing one
FIELD_HELP = {
    "label": "a class label (shards: .cls or the .json's label; a folder without metadata: class sub-folders, two or "
             "more, every image at one depth; a folder's metadata or parquet / arrow: the data.label_column column)",
    "text": "a caption (shards: .txt or the .json's caption; a folder: its metadata's data.caption_column or "
            "a sidecar <stem>.txt per image; parquet / arrow: the data.caption_column column)",
    "image_embed": "an image embedding (shards: a 1-D .npy or data.image_embeds)",
    "latent": "a latent (shards: a 3-D .npy; a cache written by `genforge encode`)",
    "direction": "a motion direction (moving shapes)",
}


def missing_field_error(field: str, key: str | None) -> BadDataError:
    """The error for a batch without `field`, which the run's task needs; `key`: a sample that lacks it."""
    what = FIELD_HELP.get(field, f"a {field!r} field")
    sample = f"; sample {key!r} has none" if key else ""
    return BadDataError(f"the run needs {what} for every sample, but the data has no {field!r}{sample}. Add it to "
                        "every sample, or train a model that does not need it (e.g. model.conditioning)")


class DataSource:
    """A value of `data.source`: how its data set is built and described. A source module subclasses this and
    registers an instance (`DATA_SOURCES.register(name, source)`); the loader only ever looks sources up."""

    name: str
    path_help: str | None = None  # what data.path names; data.path is required when set
    resize: str = ""  # how images become data.image_size pixels (recorded in caches and reference statistics)
    field: str = "image"  # the sample's key of its pixels: "image" [C, H, W], or "video" [C, T, H, W] for clips
    judge_classes: bool = False  # its labels are the built-in shapes classes, which the shapes judge (eval) knows
    motion: bool = False  # its samples carry `direction`, the motion of moving shapes (metric recon_direction)
    CONDITION_FIELDS = ("text", "label", "direction")  # what a sample conditions a generator on
    # the data fields only some sources read (tables' columns, a stream's shuffle, shards' embedding files): each
    # source names those it reads in `reads`, and one set to other than its default for a source that does not read
    # it is an error naming the field and its readers; the other data fields are every source's (DataConfig)
    SOURCE_FIELDS = ("image_column", "caption_column", "label_column", "shuffle_buffer", "image_embeds",
                     "embed_index_width")
    reads: tuple[str, ...] = ()
    # the data sub-sections only some sources read: the built-in shapes, clips (video sources, and caches of clips,
    # whose token layout a family reads), joint images (video sources); a source's config keeps those it names in
    # `sections` and drops the others on validation (a preset's shapes section under --set data.source=folder means
    # nothing, as it meant nothing before), so a written config carries its source's keys only
    SECTIONS = ("shapes", "video", "images")
    sections: tuple[str, ...] = ()
    named_splits: bool = False  # its data may have named splits (split folders, files named by split): data.split

    def check(self, cfg: DataConfig) -> None:
        """Config checks of this source (ValueError naming the field)."""
        if self.path_help is not None and not cfg.path:
            raise ValueError(f"data.path ({self.path_help}) is required when data.source is {self.name!r}")
        if cfg.split != DEFAULT_SPLIT and not self.named_splits:
            raise ValueError(f"data.split={cfg.split!r} applies to data with named splits (data.source folder, "
                             f"video_folder, parquet, arrow), not data.source={self.name}")
        for name in self.SOURCE_FIELDS:
            if name not in self.reads and getattr(cfg, name) != type(cfg).model_fields[name].default:
                readers = [source for source in DATA_SOURCES if name in DATA_SOURCES.get(source).reads]
                raise ValueError(f"data.{name} is not read by data.source={self.name}; it is read by data.source "
                                 f"{', '.join(readers)}")

    def unread_sections(self) -> tuple[str, ...]:
        """The data sub-sections this source does not read (dropped on validation: their defaults)."""
        return tuple(name for name in self.SECTIONS if name not in self.sections)

    def unread(self) -> tuple[str, ...]:
        """The data fields and sub-sections this source does not read: at their defaults, and not written."""
        return tuple(name for name in self.SOURCE_FIELDS if name not in self.reads) + self.unread_sections()

    def build(self, cfg: DataConfig, split: str, flip: bool, world_size: int | None) -> Dataset:
        """The data set of `split` ("train" or "val"); FileNotFoundError/ValueError for a bad path."""
        raise NotImplementedError

    def resolved(self, cfg: DataConfig) -> "DataSource":
        """The source that reads `cfg`'s data: itself, or another the data turns out to be (a folder or parquet path
        that holds a `save_to_disk` data set is read by the arrow source)."""
        return self

    def split_names(self, cfg: DataConfig) -> list[str]:
        """The named splits of the data (split folders, files named by split), [] when it has none."""
        return []

    def heldout_split(self, cfg: DataConfig) -> str:
        """The split tokenizers are scored on, previews drawn from and FID's reference taken from: the data's named
        held-out split ("test", else "validation") other than data.split, else "val" when data.val_fraction holds
        one out, else "train"."""
        names = self.split_names(cfg)
        named = next((name for name in HELDOUT_SPLITS if name in names and name != cfg.split), None)
        return named or ("val" if cfg.val_fraction > 0 else "train")

    def notes(self, dataset: Dataset) -> list[str]:
        """What the run's start and closing summary say about the data set beyond its samples (images a folder's
        metadata leaves out)."""
        return []

    def info(self, dataset: Dataset, cfg: DataConfig) -> DataInfo:
        """What the model needs to know about `dataset` (built from `cfg`)."""
        return DataInfo(num_classes=int(getattr(dataset, "num_classes", 0)), channels=3, image_size=cfg.image_size)

    def scan_info(self, cfg: DataConfig) -> DataInfo:
        """`info` without loading samples where the source can (a cache reads its manifest)."""
        return self.info(self.build(cfg, "train", cfg.flip, None), cfg)

    def class_names(self, cfg: DataConfig) -> list[str] | None:
        """The names of the classes, in label order (zero-shot prompts), or None when the source has none."""
        return None

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        """What identifies the data beyond the config (an absolute path, a listing of files), for cache keys."""
        return {}

    def image_data(self, cfg: DataConfig) -> DataConfig | None:
        """The data section of the images behind `cfg`: itself, or for a cache the section it was encoded from
        (None when that cannot be read)."""
        return cfg

    def heldout_samples(self, cfg: DataConfig, n: int, spread: bool = False) -> Iterator[dict[str, Any]]:
        """The first `n` readable samples of `heldout_split(cfg)`, unflipped, one dict each (pixels, and `label`,
        `text`, `direction`, `image_embed`, `key` where the source has them). With `spread`, n samples evenly spaced
        over a larger indexable split instead (an image folder lists its classes in turn: the first n would all be of
        the first class); a stream is always read from its start, lazily (only the first n are decoded)."""
        split = self.heldout_split(cfg)
        if split in self.split_names(cfg) and (cfg.path, split) not in _SAID:  # say it once a process
            _SAID.add((cfg.path, split))
            console().info(f"held-out samples (evaluation, FID reference, previews): the {split!r} split of "
                           f"{cfg.path} (data.split={cfg.split!r} trains)")
        dataset = self.build(cfg, split, False, None)
        if isinstance(dataset, IterableDataset):
            items = iter(dataset)
        else:
            size = len(dataset)
            indices = [i * size // n for i in range(n)] if spread and size > n else range(size)
            items = (dataset[i] for i in indices)
        return itertools.islice((item for item in items if "bad" not in item), n)  # skip unreadable files

    def preview_conditions(self, cfg: DataConfig, n: int) -> dict[str, Any]:
        """What a conditional generator's previews and evaluation condition on when the user gives no prompt or
        label: the captions (`text`), labels (`label`) and motion directions (`direction`) of the first n held-out
        samples (the fields every one of them has), cycled when the split holds fewer. Shapes and moving shapes
        answer with their captions and classes, a folder or shards with their held-out captions and labels."""
        items = [{k: v for k, v in item.items() if k in self.CONDITION_FIELDS}
                 for item in self.heldout_samples(cfg, n)]
        if not items:
            raise ValueError(f"no readable samples in the {self.heldout_split(cfg)!r} split of data.source="
                             f"{self.name} to take preview conditions from")
        fields = set.intersection(*(set(item) for item in items))
        conditions: dict[str, Any] = {}
        for field in sorted(fields):
            values = [items[i % len(items)][field] for i in range(n)]
            conditions[field] = values if isinstance(values[0], str) else torch.tensor(values)
        return conditions


_SAID: set[tuple[str | None, str]] = set()  # (data.path, split) whose held-out reading was announced


def source_of(cfg: DataConfig) -> DataSource:
    """The source that reads `cfg`: the registered source of `data.source` (ConfigError naming the allowed ones), or
    the one its data turns out to need (`DataSource.resolved`)."""
    return DATA_SOURCES.get(cfg.source, "data.source").resolved(cfg)


def split_members(splits: dict[str, list[T]], train_split: str, split: str, what: str) -> tuple[list[T], str]:
    """What a source with named splits `splits` reads for `split`, and the share of it to keep: "train", "val" and
    "test" (where the data has no split "test") are the shares of the members of `train_split` (data.split) by
    data.val_fraction / data.test_fraction; a named split is read whole ("all"); "all" is every member. BadDataError
    naming data.split when the data has no such split (`what`: the data, for the message)."""
    if split == "all":
        return list(dict.fromkeys(m for members in splits.values() for m in members)), "all"
    if split in ("train", "val") or split == "test" and split not in splits:
        if train_split not in splits:
            names = ", ".join(repr(name) for name in splits)
            raise BadDataError(f"data.split={train_split!r}: {what} has no split {train_split!r}; its splits: "
                               f"{names}")
        return splits[train_split], split
    if split in splits:
        return splits[split], "all"
    raise ValueError(f"split={split!r}; {what} has the splits {', '.join(splits)} (and train / val / test shares)")


def draw_caption(value: Any, aug_seed: int | None) -> str | None:
    """The caption of a cell: a string stripped, or one of a list of captions, drawn by the sample's `aug_seed` (so a
    resumed run draws the same ones; the first without a seed: held-out samples); None for none or an empty list."""
    if isinstance(value, (list, tuple)):
        captions = [str(c).strip() for c in value if c is not None]
        if not captions:
            return None
        pick = 0 if aug_seed is None else int(np.random.default_rng([aug_seed, 1]).integers(len(captions)))
        return captions[pick]
    return None if value is None else str(value).strip()


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack sample dicts into a Batch; the unreadable samples they replaced go to `batch["skipped"]`. A field some
    samples lack is left out, and `batch["missing"]` maps it to the key of a sample lacking it (the trainer names
    it if the task needs the field)."""
    batch: dict[str, Any] = {"skipped": [s for sample in samples for s in sample.get("skipped", ())]}
    fields = [f for f in dict.fromkeys(f for sample in samples for f in sample) if f != "skipped"]
    missing = {f: next(str(s.get("key", "?")) for s in samples if f not in s) for f in fields
               if any(f not in s for s in samples)}
    if missing:
        batch["missing"] = missing
    for field in fields:
        if field in missing:
            continue
        values = [s[field] for s in samples]
        if isinstance(values[0], torch.Tensor):
            batch[field] = torch.stack(values)
        elif isinstance(values[0], (int, np.integer)):
            batch[field] = torch.tensor(values, dtype=torch.long)
        else:
            batch[field] = values
    return batch


def missing_field(err: KeyError, batch: dict[str, Any], missing: dict[str, str]) -> Exception:
    """A task's KeyError for a Batch field the data does not have, as a BadDataError naming the field and a sample
    that lacks it (`missing`: collate's record of fields some samples lacked); any other KeyError unchanged."""
    name = err.args[0] if err.args else None
    if not isinstance(name, str) or name not in Batch.__annotations__ or name in batch:
        return err
    keys = batch.get("key") or [None]
    return missing_field_error(name, missing.get(name, keys[0]))
