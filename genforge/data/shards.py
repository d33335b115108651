"""Webdataset shards (`data.source: shards`): tar files of records `<key>.jpg|.jpeg|.png|.webp` + `.txt`
caption, optional `.cls` label, `.json` metadata and `.npy` array, streamed from local paths or URLs.

`data.path` is a webdataset URL spec: a path, `file://`, `http(s)://` or `pipe:` URL with brace expansion
(`data/train-{000000..000127}.tar`), several joined by `::`.

Training streams. With R processes and W = max(1, data.num_workers) DataLoader workers per process there are
R·W *slots*; slot `rank·W + worker` reads the shards i with i % (R·W) == slot, forever: in its epoch e the
shard order is a permutation seeded by (train.seed, e, slot) and the records pass a seeded shuffle buffer
(`data.shuffle_buffer`), so each slot's epoch covers its shards' records exactly once. Epochs are per slot:
slots may hold different numbers of records, and a slot that runs out starts its next epoch, so no rank ever
waits for data (DDP never hangs on unequal shards). Fewer shards than slots is an error.

Workers batch: each yields collated micro-batches of exactly `micro_batch` raw records (unreadable ones are
dropped and reported in `batch["skipped"]`, so such a batch is smaller; a shard that cannot be opened or read to its
end counts as one more raw record, an unreadable one named `<shard>.tar@<offset>`), and the DataLoader takes them from
its workers in turn, so micro-batch j of a rank comes from worker j % W. The position is therefore a function
of the micro-batches consumed: a resumed stream makes each worker skip (read, shuffle, not decode) the raw
records of the micro-batches it already produced, and yields what an uninterrupted one would have.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from genforge.core.config import ConfigError, DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import DataSource, collate, split_members
from genforge.data.folder import ADM_RESIZE
from genforge.data.images import read_image
from genforge.data.splits import DEFAULT_SPLIT

IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp")  # the first one a record has is its image
Record = dict[str, Any]  # {"__key__": str, field: bytes}


class DataError(RuntimeError):
    """The stream cannot go on (a shard that cannot be read, a micro-batch of unreadable records)."""


# ------------------------------------------------------------------------------------------- URL specs
ALLOW_PIPE_ENV = "GENFORGE_ALLOW_PIPE"  # =1: shard URLs may be `pipe:` shell commands (an opt-in of the user's)


def refuse_pipes(spec: str, field: str = "data.path") -> None:
    """ConfigError for a `pipe:` URL in `spec` unless GENFORGE_ALLOW_PIPE=1 is set in the environment. webdataset runs
    `pipe:CMD` as a shell command, so a config file or preset received from someone else could run code on
    `genforge train`; the opt-in is an environment variable, never a config key that travels with the file."""
    if os.environ.get(ALLOW_PIPE_ENV) == "1":
        return
    piped = [part for part in spec.split("::") if part.strip().startswith("pipe:")]
    if piped:
        raise ConfigError(f"{field}={piped[0]!r}: a 'pipe:' URL runs a shell command; genforge refuses it unless you "
                          f"allow it for this shell: export {ALLOW_PIPE_ENV}=1 (docs/data.md)")


def expand_spec(spec: str) -> list[str]:
    """The shard URLs of a webdataset spec: `::`-separated parts, each brace-expanded, in order (`pipe:` URLs only
    with the user's opt-in, `refuse_pipes`)."""
    from webdataset.shardlists import expand_urls

    refuse_pipes(spec)
    return [url for url in expand_urls(spec) if url]


def shard_pattern(folder: Path, prefix: str, n: int, shard_size: int) -> tuple[str, int]:
    """The brace pattern (a data.path) naming the shards `folder/<prefix>-NNNNNN.tar` that a ShardWriter wrote for n
    records of `shard_size` each, and how many there are."""
    count = -(-n // shard_size)
    name = f"{prefix}-{{000000..{count - 1:06d}}}.tar" if count > 1 else f"{prefix}-000000.tar"
    return str(folder / name), count


def local_path(url: str) -> Path | None:
    """The file a URL names on this machine (a plain path or file://), None for remote and pipe: URLs."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "":
        return Path(url)
    return None


def absolute_spec(spec: str) -> str:
    """`spec` with its local parts made absolute (URLs unchanged): a key that does not depend on the cwd."""
    return "::".join(str(Path(part).absolute()) if local_path(part) is not None and urlparse(part).scheme == ""
                     else part for part in spec.split("::"))


def shard_name(url: str) -> str:
    """The shard's file name without .tar: the prefix of its records' keys."""
    name = Path(urlparse(url).path.split()[-1] if url.startswith("pipe:") else urlparse(url).path).name
    return name[: -len(".tar")] if name.endswith(".tar") else name


def check_shards(spec: str) -> list[str]:
    """The URLs of `spec`; FileNotFoundError naming the first local shard that does not exist."""
    urls = expand_spec(spec)
    if not urls:
        raise ValueError(f"data.path={spec!r} names no shards")
    for url in urls:
        path = local_path(url)
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"data.path={spec!r}: shard {path} does not exist "
                                    f"({len(urls)} shard(s) named)")
    return urls


def check_slots(num_shards: int, world_size: int, num_workers: int, spec: str, unit: str = "shard") -> None:
    """Every worker of every process needs at least one shard (`unit`: a parquet row group) of its own (else it
    would have nothing to read)."""
    slots = world_size * max(1, num_workers)
    if num_shards < slots:
        raise ValueError(
            f"data.path={spec!r} holds {num_shards} {unit}(s), fewer than processes x data.num_workers = "
            f"{world_size} x {max(1, num_workers)} = {slots}: each worker of each process streams {unit}s of its "
            f"own. Lower data.num_workers (0 or 1 reads in the main process), use fewer processes, or write the "
            f"data into at least {slots} {unit}s")


def listing(urls: list[str]) -> str:
    """sha256 of the shard URLs and, for local ones, their sizes and mtimes (changed shards are new data)."""
    digest = hashlib.sha256()
    for url in urls:
        path = local_path(url)
        stat = path.stat() if path is not None and path.is_file() else None
        digest.update(f"{url}\0{stat.st_size if stat else ''}\0{stat.st_mtime_ns if stat else ''}\n".encode())
    return digest.hexdigest()


def read_shard(url: str) -> Iterator[Record]:
    """The records of one shard, in tar order (webdataset grouping: files `<key>.<field>`)."""
    from webdataset.gopen import gopen
    from webdataset.tariterators import group_by_keys, tar_file_expander

    try:
        stream = gopen(url)
    except Exception as err:
        raise DataError(f"cannot open shard {url} ({type(err).__name__}: {err})") from None
    finished = False
    try:
        files = tar_file_expander([{"url": url, "stream": stream}])
        try:
            for record in group_by_keys(files):
                yield record
        except Exception as err:  # a torn tar, a dropped connection: name the shard
            raise DataError(f"cannot read shard {url} ({type(err).__name__}: {err.args[0] if err.args else err})"
                            ) from None
        finished = True
    finally:
        try:
            stream.close()
        except Exception:  # a pipe: closed before its end reports SIGPIPE
            if finished:
                raise


def read_shard_or_report(url: str) -> Iterator[Record]:
    """`read_shard`, but a shard that cannot be opened or read to its end yields, after its readable records, one
    marker record {"__key__": "<shard>.tar@<offset>", "__bad__": reason}, which decodes as an unreadable sample
    (skipped and reported like a broken image). A readable shard yields exactly what `read_shard` does."""
    offset = 0
    try:
        for record in read_shard(url):
            yield record
            offset += 1
    except DataError as err:
        yield {"__key__": f"{shard_name(url)}.tar@{offset}", "__bad__": f"unreadable from record {offset} on: {err}"}


# ------------------------------------------------------------------------------------ separate embeddings
class ShardEmbeddings:
    """Image embeddings kept beside the shards, one .npy [records, D] per shard (DALLE2-pytorch's
    `embeddings_url`, clip-retrieval's img_emb/img_emb_<n>.npy): the file numbered like the shard (its name without
    .tar, a number) holds the record with key K in row int(K[-index_width:]); an all-zero row means no embedding."""

    PATTERN = re.compile(r"^(.*?)(\d+)\.npy$")

    def __init__(self, folder: str | Path, index_width: int) -> None:
        self.folder, self.index_width = Path(folder), index_width
        if not self.folder.is_dir():
            raise FileNotFoundError(f"data.image_embeds: folder {self.folder} does not exist")
        self.files = {int(m.group(2)): self.folder / name for name in sorted(os.listdir(self.folder))
                      if (m := self.PATTERN.match(name))}
        if not self.files:
            raise ValueError(f"data.image_embeds: {self.folder} holds no <prefix>_<number>.npy embedding files")
        self._open: dict[int, np.ndarray] = {}

    def row(self, url: str, key: str) -> torch.Tensor:
        """The embedding [D] of record `key` of shard `url` (ValueError when there is none)."""
        name = shard_name(url)
        if not name.isdigit():
            raise ValueError(f"shard {name!r}: data.image_embeds needs shards named by their number, e.g. 00012.tar")
        shard = int(name)
        if shard not in self._open:
            if shard not in self.files:
                raise ValueError(f"no embedding file numbered {shard} in {self.folder}")
            self._open = {shard: np.load(self.files[shard], mmap_mode="r", allow_pickle=False)}  # one open at a time
        index = key[-self.index_width:]
        if not index.isdigit():
            raise ValueError(f"key {key!r}: its last {self.index_width} characters (data.embed_index_width) are not "
                             "a row number")
        table = self._open[shard]
        if int(index) >= len(table) or not np.any(table[int(index)]):
            raise ValueError(f"no embedding for key {key!r} (row {int(index)} of {self.files[shard].name})")
        return torch.from_numpy(np.array(table[int(index)], dtype=np.float32))


# ---------------------------------------------------------------------------------------------- records
def _text(data: bytes) -> str:
    return data.decode("utf-8").strip()


def decode_record(record: Record, key: str, image_size: int, flip: bool, aug_seed: int | None,
                  max_image_pixels: int | None = None) -> dict[str, Any]:
    """A sample (`image` [3, S, S] in [-1, 1], `text`, `label`, `image_embed` [D], `latent` [C, h, w], `key`),
    or {"key", "bad": reason} when the record cannot be used. Images are read like image folders' (RGB, ADM
    center crop to `image_size`, flipped when `flip` and the per-sample coin of `aug_seed` says so); latents
    are never flipped."""
    sample: dict[str, Any] = {"key": key}
    try:
        meta = record_meta(record)
        if "npy" in record:
            array = np.load(io.BytesIO(record["npy"]), allow_pickle=False)
            if array.ndim == 1:
                sample["image_embed"] = torch.from_numpy(array.astype(np.float32))
            elif array.ndim == 3:
                sample["latent"] = torch.from_numpy(array.astype(np.float32))
            else:
                raise ValueError(f".npy of shape {list(array.shape)}: expected 1-D (an image embedding) or 3-D "
                                 "(a latent [C, h, w])")
        field = next((f for f in IMAGE_FIELDS if f in record), None)
        if field is not None:
            sample["image"] = read_image(io.BytesIO(record[field]), image_size, flip, aug_seed, max_image_pixels)
        elif "latent" not in sample:
            fields = ", ".join(f".{f}" for f in sorted(record) if not f.startswith("__")) or "none"
            raise ValueError(f"no image (.{', .'.join(IMAGE_FIELDS)}) and no 3-D .npy latent; fields: {fields}")
        add_text_and_label(record, meta, sample)
    except Exception as err:  # any decoder error: skip and report, never kill the worker
        return {"key": key, "bad": f"{type(err).__name__}: {err}"}
    return sample


def record_meta(record: Record) -> dict[str, Any]:
    """The record's `.json` metadata object ({} without one; ValueError when it is not an object)."""
    meta = json.loads(record["json"]) if "json" in record else {}
    if not isinstance(meta, dict):
        raise ValueError(f".json holds a {type(meta).__name__}, not an object")
    return meta


def add_text_and_label(record: Record, meta: dict[str, Any], sample: dict[str, Any]) -> None:
    """`text` from `.txt` (else the metadata's caption / text) and `label` from `.cls` (else its label / cls)."""
    if "txt" in record:
        sample["text"] = _text(record["txt"])
    elif isinstance(meta.get("caption", meta.get("text")), str):
        sample["text"] = meta.get("caption", meta.get("text")).strip()
    if "cls" in record:
        sample["label"] = int(_text(record["cls"]))
    elif meta.get("label", meta.get("cls")) is not None:
        sample["label"] = int(meta.get("label", meta.get("cls")))


def consistent(samples: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Samples that stack into one batch, and the others as (key, reason). A field most samples have is
    required (a missing caption is ""), one few have is left to `collate`, which drops it and names a sample
    lacking it in `batch["missing"]`; tensors of a shape other than the most common one are unreadable."""
    good, bad = list(samples), []
    counts = Counter(f for s in samples for f in s if f != "key")
    for field, count in counts.items():
        if field == "text":
            for s in good:
                s.setdefault("text", "")
        elif 2 * count > len(samples):
            bad += [(s["key"], f"no {field}, which most records of its batch have") for s in good if field not in s]
            good = [s for s in good if field in s]
    stacked = [f for f in counts if good and all(f in s for s in good) and isinstance(good[0][f], torch.Tensor)]
    for field in stacked:  # the tensors collate stacks
        shape = Counter(tuple(s[field].shape) for s in good).most_common(1)[0][0]
        bad += [(s["key"], f"{field} of shape {list(s[field].shape)}, others in its batch {list(shape)}")
                for s in good if tuple(s[field].shape) != shape]
        good = [s for s in good if tuple(s[field].shape) == shape]
    return good, bad


# ---------------------------------------------------------------------------------------------- data sets
class ShardDataset(IterableDataset):
    """The shards named by `spec`. Iterating it gives one pass over the shards in order, unshuffled and
    unflipped, every record as a sample or {"key", "bad"} (held-out images, `genforge encode`); with
    DataLoader workers, worker w reads shards w, w + W, ... `stream()` makes the training stream.
    Built with `world_size`, it checks that every worker of every process gets a shard.

    A subclass streams other units the same way (parquet row groups): `units` lists them, `read` yields the
    records of one, `decode` makes a record a sample."""

    num_classes = 0  # unknown without reading every record; a model config names its own
    record_kind = "image"  # what the records hold, for errors
    unit = "shard"  # what `urls` lists, for errors

    def __init__(self, spec: str, image_size: int, flip: bool = False, shuffle_buffer: int = 1000,
                 max_image_pixels: int | None = None, world_size: int | None = None, num_workers: int = 0,
                 embeddings: ShardEmbeddings | None = None) -> None:
        self.spec, self.image_size, self.flip = spec, image_size, flip
        self.shuffle_buffer, self.max_image_pixels = shuffle_buffer, max_image_pixels
        self.embeddings = embeddings  # image embeddings kept beside the shards, if any
        self.urls = self.units(spec)
        self.slots = None
        if world_size is not None:
            check_slots(len(self.urls), world_size, num_workers, spec, self.unit)
            self.slots = world_size * max(1, num_workers)

    def units(self, spec: str) -> list[Any]:
        """What the stream is split into and read by: the shard URLs of `spec`."""
        return check_shards(spec)

    def read(self, url: Any) -> Iterator[Record]:
        """The records of one unit, a marker record last for a part that cannot be read (read_shard_or_report)."""
        return read_shard_or_report(url)

    def decode(self, url: str, record: Record, aug_seed: int | None) -> dict[str, Any]:
        if "__bad__" in record:  # a shard that could not be read (read_shard_or_report)
            return {"key": record["__key__"], "bad": record["__bad__"]}
        key = f"{shard_name(url)}/{record['__key__']}"
        sample = decode_record(record, key, self.image_size, self.flip, aug_seed, self.max_image_pixels)
        if self.embeddings is not None and "bad" not in sample:
            try:
                sample["image_embed"] = self.embeddings.row(url, record["__key__"])
            except ValueError as err:
                return {"key": key, "bad": f"ValueError: {err}"}
        return sample

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for url in self.urls[worker::workers]:
            for record in self.read(url):
                yield self.decode(url, record, None)

    def part(self, rank: int, world: int) -> "ShardDataset":
        """The same data set over a contiguous block of its shards, part `rank` of `world` (loader.dataset_part);
        a part may hold no shard when there are fewer shards than parts."""
        part = copy.copy(self)
        count = len(self.urls)
        part.urls = self.urls[count * rank // world : count * (rank + 1) // world]
        return part

    # ---------------------------------------------------------------------------- the training stream
    def slot_records(self, slot: int, slots: int, seed: int, skip: int = 0) -> Iterator[tuple[str, Record, int]]:
        """(url, record, aug_seed) of slot `slot` of `slots`, epoch after epoch, from raw record `skip` on.
        Whole epochs are skipped without reading once the slot's record count is known."""
        shards = self.urls[slot::slots]
        epoch, per_epoch = 0, None
        while True:
            if per_epoch is not None and skip >= per_epoch:
                epoch, skip = epoch + skip // per_epoch, skip % per_epoch
            count = 0
            for item in self._epoch(shards, seed, epoch, slot):
                count += 1
                if skip:
                    skip -= 1
                    continue
                yield item
            if count == 0:
                raise DataError(f"data.path={self.spec!r}: the {self.unit}s of worker slot {slot} hold no records "
                                f"({', '.join(map(str, shards[:3]))}{', ...' if len(shards) > 3 else ''})")
            epoch, per_epoch = epoch + 1, count

    def _epoch(self, shards: list[str], seed: int, epoch: int, slot: int) -> Iterator[tuple[str, Record, int]]:
        """One epoch of a slot: its shards in a seeded order, through a seeded shuffle buffer."""
        rng = np.random.default_rng([seed, epoch, slot])
        records = ((shards[i], record) for i in rng.permutation(len(shards))
                   for record in self.read(shards[i]))
        buffer: list[tuple[str, Record]] = []
        for item in records:
            if len(buffer) < max(1, self.shuffle_buffer):
                buffer.append(item)
                continue
            k = int(rng.integers(len(buffer)))
            buffer[k], item = item, buffer[k]
            yield (*item, int(rng.integers(0, 2**62)))
        for k in rng.permutation(len(buffer)) if self.shuffle_buffer else range(len(buffer)):
            yield (*buffer[k], int(rng.integers(0, 2**62)))

    def what(self) -> str:
        """What data.path should name, for errors."""
        return f"a set of webdataset {self.record_kind} shards"

    def batch(self, raw: list[tuple[str, Record, int]]) -> dict[str, Any]:
        """Decode and collate raw records; the unreadable ones go to `skipped` (DataError if all are)."""
        decoded = [self.decode(url, record, aug) for url, record, aug in raw]
        skipped = [(s["key"], s["bad"]) for s in decoded if "bad" in s]
        good, inconsistent = consistent([s for s in decoded if "bad" not in s])
        skipped += inconsistent
        if not good:
            first = "; ".join(f"{key}: {reason}" for key, reason in skipped[:3])
            raise DataError(f"every one of {len(raw)} records of a micro-batch was unreadable ({first}); is "
                            f"data.path={self.spec!r} {self.what()}?")
        batch = collate(good)
        batch["skipped"] = skipped
        return batch

    def stream(self, micro_batch: int, world_size: int, rank: int, num_workers: int, seed: int,
               consumed: int = 0) -> "ShardStream":
        """This rank's stream of micro-batches, after the `consumed` micro-batches it already trained on."""
        check_slots(len(self.urls), world_size, num_workers, self.spec, self.unit)
        return ShardStream(self, micro_batch, world_size, rank, max(1, num_workers), seed, consumed)


class ShardStream(IterableDataset):
    """One rank's micro-batches, forever; iterate it in a DataLoader with `batch_size=None` and
    `num_workers` workers (0 when `workers` is 1)."""

    def __init__(self, shards: ShardDataset, micro_batch: int, world_size: int, rank: int, workers: int,
                 seed: int, consumed: int) -> None:
        self.shards, self.micro_batch, self.world_size, self.rank = shards, micro_batch, world_size, rank
        self.workers, self.seed, self.consumed = workers, seed, consumed

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if workers != self.workers:
            raise RuntimeError(f"a stream built for {self.workers} worker(s) is read by {workers}")
        # DataLoader worker w yields the rank's micro-batches consumed + w, consumed + w + W, ...: it plays
        # the worker v that produces micro-batches v, v + W, ... and has produced ceil((consumed - v) / W)
        v = (self.consumed + worker) % workers
        done = max(0, -(-(self.consumed - v) // workers))
        records = self.shards.slot_records(self.rank * workers + v, self.world_size * workers, self.seed,
                                           skip=done * self.micro_batch)
        while True:
            yield self.shards.batch([next(records) for _ in range(self.micro_batch)])


def split_shards(urls: list[str], val_fraction: float, test_fraction: float, seed: int) -> dict[str, list[str]]:
    """Train / val / test by whole shards (DALLE2-pytorch's `splits`, made deterministic): the shards are permuted by
    `seed`, the first round(n·val_fraction) go to val (at least one when val_fraction > 0), the next
    round(n·test_fraction) to test (likewise), the rest to train; each split keeps the spec's order. ValueError when
    train would be left without a shard."""
    n = len(urls)
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 else 0
    n_test = max(1, round(n * test_fraction)) if test_fraction > 0 else 0
    if n_val + n_test >= n:
        raise ValueError(f"data.path names {n} shard(s): too few to hold out {n_val} for data.val_fraction="
                         f"{val_fraction} and {n_test} for data.test_fraction={test_fraction} and train on the rest")
    order = np.random.default_rng(seed).permutation(n)
    chosen = {"val": set(order[:n_val].tolist()), "test": set(order[n_val : n_val + n_test].tolist())}
    chosen["train"] = set(range(n)) - chosen["val"] - chosen["test"]
    return {split: [url for i, url in enumerate(urls) if i in members] for split, members in chosen.items()}


class ShardsSource(DataSource):
    """`data.source: shards`: webdataset shards, streamed; split into train / val / test by whole shards
    (`split_shards`). Without a val split, held-out images are the first records of the training shards, in order."""

    name = "shards"
    path_help = "webdataset shards, e.g. data/train-{000000..000127}.tar"
    resize = ADM_RESIZE
    reads = ("shuffle_buffer", "image_embeds", "embed_index_width")

    def check(self, cfg: DataConfig) -> None:
        super().check(cfg)
        refuse_pipes(cfg.path)

    def files(self, spec: str) -> list[str]:
        """The files (URLs) data.path names, split into train / val / test as wholes."""
        return check_shards(spec)

    def named_files(self, cfg: DataConfig) -> tuple[dict[str, list[str]], bool]:
        """The files of each named split of data.path, and whether it names any (shards: none, all is "train")."""
        return {DEFAULT_SPLIT: self.files(cfg.path)}, False

    def split_names(self, cfg: DataConfig) -> list[str]:
        """The named splits of data.path ([] for shards, and for data not there: building it says what is wrong)."""
        if not self.named_splits:
            return []
        try:
            splits, named = self.named_files(cfg)
        except FileNotFoundError:
            return []
        return list(splits) if named else []

    def build(self, cfg: DataConfig, split: str, flip: bool, world_size: int | None) -> ShardDataset:
        splits, named = self.named_files(cfg)
        files, share = split_members(splits, cfg.split, split, f"data.path={cfg.path!r}")
        spec = "::".join(files) if named or share == "all" else cfg.path
        if share != "all" and (cfg.val_fraction > 0 or cfg.test_fraction > 0):
            spec = "::".join(split_shards(files, cfg.val_fraction, cfg.test_fraction, cfg.split_seed)[share])
        elif share not in ("all", "train"):
            raise ValueError(f"data.source={self.name} ({cfg.path}) has no {split!r} split: set data.val_fraction / "
                             "data.test_fraction")
        return self.dataset(spec, cfg, flip, world_size)

    def dataset(self, spec: str, cfg: DataConfig, flip: bool, world_size: int | None) -> ShardDataset:
        """The data set of the shards `spec` (one split of data.path)."""
        embeddings = ShardEmbeddings(cfg.image_embeds, cfg.embed_index_width) if cfg.image_embeds else None
        return ShardDataset(spec, cfg.image_size, flip=flip, shuffle_buffer=cfg.shuffle_buffer,
                            max_image_pixels=cfg.max_image_pixels, world_size=world_size,
                            num_workers=cfg.num_workers, embeddings=embeddings)

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        spec = absolute_spec(cfg.path)
        return {"path": spec, "files": listing(expand_spec(spec))}


DATA_SOURCES.register("shards", ShardsSource())
