"""The cache writer (`genforge encode`): a data set run once through a tokenizer's frozen encoder into a cache folder
(genforge.data.cache describes the format and reads it).

On several processes (torchrun; every rank calls `encode_dataset` with the same arguments) each rank encodes a
contiguous part of the data set (`dataset_part`) into temporary shards of its own; once every rank has finished,
the records are renumbered into the shards one process would write (shard k holds cache positions
k·shard_size onwards, each written by the rank that encoded its first record), and rank 0 writes the manifest and
renames the folder into place. The cache is the one a single process writes: the same records at the same
positions, the same cache.json.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from webdataset import TarWriter

from genforge.core.codec import CodecInfo, TextTowerEmbedder
from genforge.core.config import DataConfig
from genforge.core.files import TMP_PREFIX, fsync_dir, fsync_tree, write_atomically
from genforge.core.precision import autocast
from genforge.core.registry import CACHE_KINDS
from genforge.data.base import CacheError, source_of
from genforge.data.cache import MANIFEST, SHARD_PATTERN, CacheManifest, Preprocessing, read_manifest, shard_records
from genforge.data.images import png_bytes
from genforge.data.loader import build_dataset, dataset_part, dataset_size, pixel_field
from genforge.data.text_embeds import write_text_embeds
from genforge.engine.logging import Progress
from genforge.core.collectives import every_rank, gather_objects, rank_and_world
from genforge.text.base import TextEncoder
from genforge.text.config import TextEncoderConfig
from genforge.text.encoders import build_text_encoder

__all__ = ["TextEncoderConfig", "encode_dataset"]  # and the helpers below, imported by name

PART_PATTERN = "part-%06d.tar"  # a rank's temporary shards, in <staging>/.tmp-rank-NNNNN/
T = TypeVar("T")


def encode_dataset(codec: nn.Module, info: CodecInfo, data: DataConfig, out: str | Path, *, flip: bool,
                   batch_size: int = 64, shard_size: int = 10_000, device: torch.device | str = "cpu",
                   progress: bool = False, text: TextEncoderConfig | None = None, codec_text: bool = True,
                   precision: str = "no") -> CacheManifest:
    """Encode the training split of `data` (images or clips; unflipped, plus its mirror image when `flip`) with
    `codec`, run under the autocast of `precision` (codes stored from float32), into the cache folder `out`, which
    must not exist or be empty; also the distinct captions (genforge.data.text_embeds) by `text` (a frozen text
    encoder), else, when `codec_text` and the codec has a text tower (a TextTowerEmbedder: a clip run) and the data
    has captions, by that tower. Everything is written under a temporary name that is renamed to `out` at the end,
    so a killed or failed encode (on any rank) never leaves a manifest for incomplete shards or embeddings.
    `progress`: a bar on a terminal, else plain lines, and a closing summary (rank 0)."""
    out = Path(out)
    rank, world = rank_and_world()
    if data.source == "cache":
        raise CacheError(f"data.source=cache ({data.path}): encode reads images (data.source shapes, folder or "
                         "shards)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CacheError(f"--out {out} already exists and is not empty; remove it or choose another folder")
    if text is not None and not text.frozen:
        raise CacheError(f"--text-encoder {text.kind}: only frozen text encoders (minilm, t5, clip) can be cached; "
                         f"{text.kind} trains with the model, so its embeddings change every step")
    staging = out.parent / f"{TMP_PREFIX}{out.name}"
    tower = text is None and codec_text and isinstance(codec, TextTowerEmbedder)  # its own states, per caption
    # before hours of encoding; rank 0 embeds the captions
    text_encoder = _together(lambda: _text_encoder(codec, text, tower, device) if rank == 0 else None, staging)
    dataset = build_dataset(data, split="train", flip=False)
    if rank == 0:
        if staging.exists():
            shutil.rmtree(staging)  # left by an encode that was killed
        staging.mkdir(parents=True)
    every_rank(True)  # the staging folder exists for every rank
    noun = "clips" if pixel_field(data) == "video" else "images"
    bar = Progress("encoding", noun, enabled=progress and rank == 0, processes=world)
    try:
        folder = staging if world == 1 else staging / f"{TMP_PREFIX}rank-{rank:05d}"
        pattern = SHARD_PATTERN if world == 1 else PART_PATTERN
        mine = _together(lambda: _encode_part(codec, info, data, dataset, rank, world, folder, pattern, flip,
                                              batch_size, shard_size, device, precision, bar,
                                              text is not None or tower),
                         staging)
        parts = gather_objects(mine)
        if tower and not any(p.captions for p in parts):
            text_encoder = None  # uncaptioned images: their embeddings only
        manifest = _manifest(info, data, dataset, flip, parts, shard_size)
        if world > 1:
            _together(lambda: _renumber(staging, parts, shard_size, rank), staging)
        text_path = info.run_dir if tower else text.path if text is not None else None
        _together(lambda: _finish(staging, out, manifest, parts, text_encoder, text_path, batch_size, progress)
                  if rank == 0 else None, staging)
    except BaseException:
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    bar.finish(f"encoded {manifest.count} {noun} into {len(manifest.shards)} shard(s)",
               f"{len(manifest.skipped)} unreadable skipped" if manifest.skipped else "")
    return manifest if rank == 0 else read_manifest(out)


def _together(step: Callable[[], T], staging: Path) -> T:
    """Run `step` on this rank; when it raised here or on another rank, rank 0 removes the `staging` folder and then
    every rank raises (here the error itself, elsewhere a CacheError saying another process failed), so that no
    rank waits for one that stopped and none exits before the folder is gone. Every rank calls it at the same
    point."""
    try:
        result, error = step(), None
    except Exception as err:
        result, error = None, err
    if every_rank(error is None):
        return result
    if rank_and_world()[0] == 0:
        shutil.rmtree(staging, ignore_errors=True)
    every_rank(True)  # the folder is gone
    if error is not None:
        raise error
    raise CacheError("another process of this encode failed (its error is in its output); nothing was written")


def _text_encoder(codec: nn.Module, text: TextEncoderConfig | None, tower: bool,
                  device: torch.device | str) -> TextEncoder | None:
    """The encoder whose embeddings of the captions the cache stores: the codec's own text tower (`tower`), else
    the frozen text encoder of `text`, else none."""
    if tower:
        return codec.text_tower()
    return build_text_encoder(text, memo=False).to(device) if text is not None else None


@dataclass
class _Part:
    """What one rank encoded: its record count, the stored codes' shape and dtype (None: no record), the largest
    label, the unreadable samples and the distinct captions (flipped ones too), in order."""

    count: int = 0
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    top_label: int = -1
    skipped: list[dict[str, str]] = field(default_factory=list)
    captions: dict[str, None] = field(default_factory=dict)


class _ShardSink:
    """Writes records at cache positions into `folder`/`pattern` % (position // shard_size) under __key__ = the
    position (9 digits): shard k holds positions k·shard_size onwards, whoever writes it."""

    def __init__(self, folder: Path, pattern: str, shard_size: int) -> None:
        self.folder, self.pattern, self.shard_size = folder, pattern, shard_size
        self.names: list[str] = []
        self.writer: TarWriter | None = None

    def write(self, position: int, record: dict[str, Any]) -> None:
        name = self.pattern % (position // self.shard_size)
        if not self.names or self.names[-1] != name:
            self.close()
            self.writer = TarWriter(str(self.folder / name))
            self.names.append(name)
        self.writer.write({"__key__": f"{position:09d}", **record})

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@torch.no_grad()
def _encode(codec: nn.Module, images: Tensor, info: CodecInfo, precision: str) -> np.ndarray:
    """Codes of a batch as the cache kind stores them (float16 latents [b, C, h, w], int16/int32 ids [b, h, w]),
    the codec run under the autocast of `precision`."""
    try:
        kind = CACHE_KINDS.get(info.kind)
        with autocast(precision, images.device):
            codes = kind.encode(codec, images)
        return kind.store(codes.float() if codes.is_floating_point() else codes, info.codebook_size)
    except CacheError as err:
        raise CacheError(f"{info.run_dir}: {err}") from None


def _encode_part(codec: nn.Module, info: CodecInfo, data: DataConfig, dataset: Dataset, rank: int, world: int,
                 folder: Path, pattern: str, flip: bool, batch_size: int, shard_size: int,
                 device: torch.device | str, precision: str, bar: Progress, captions: bool) -> _Part:
    """Encode part `rank` of `world` of `dataset` into shards `folder`/`pattern`, records numbered from 0; with
    `captions`, note the distinct captions."""
    kind = CACHE_KINDS.get(info.kind)
    field_name = pixel_field(data)  # "image" [C, H, W], or "video" [C, T, H, W]: clips to video token ids [t, h, w]
    if field_name == "video" and kind.with_image:
        raise CacheError(f"{info.run_dir}: {info.kind} caches keep the source image; they cannot hold clips")
    mirror = getattr(dataset, "mirror_text", None)  # the caption of the flipped image, where a source has one
    part = dataset_part(dataset, rank, world, batch_size)
    loader = DataLoader(part, batch_size=batch_size, num_workers=data.num_workers, collate_fn=list)
    folder.mkdir(parents=True, exist_ok=True)
    sink, result, seen, total = _ShardSink(folder, pattern, shard_size), _Part(), 0, dataset_size(part)
    try:
        for samples in loader:
            seen += len(samples)
            bar.report(seen, total)
            result.skipped += [{"key": s["key"], "reason": s["bad"]} for s in samples if "bad" in s]
            good = [s for s in samples if "bad" not in s]
            if not good:
                continue
            images = torch.stack([s[field_name] for s in good]).to(device)  # [b, 3, (T,) H, W] in [-1, 1]
            codes = _encode(codec, images, info, precision)
            flipped = _encode(codec, images.flip(-1), info, precision) if flip else None
            if result.shape is None:
                result.shape, result.dtype = tuple(codes.shape[1:]), str(codes.dtype)
            if tuple(codes.shape[1:]) != result.shape:
                raise CacheError(f"{info.run_dir} encoded images of one size to codes of shapes "
                                 f"{list(result.shape)} and {list(codes.shape[1:])}")
            for i, s in enumerate(good):
                record = {kind.key: codes[i], "key.txt": s["key"]}
                if flipped is not None:
                    record[kind.flip_key] = flipped[i]
                if kind.with_image:
                    record["png"] = png_bytes(images[i])
                if "frame_mask" in s:  # a padded clip's real frames (data.video.min_frames)
                    record["frame_mask.npy"] = s["frame_mask"].numpy()
                if "label" in s:
                    record["cls"] = int(s["label"])
                    result.top_label = max(result.top_label, int(s["label"]))
                if "text" in s:
                    record["txt"] = s["text"]
                    if flip and mirror is not None and mirror(s["text"]) != s["text"]:
                        record["txt_flip.txt"] = mirror(s["text"])
                    if captions:
                        result.captions.update(dict.fromkeys(record[k] for k in ("txt", "txt_flip.txt") if k in record))
                sink.write(result.count, record)
                result.count += 1
    finally:
        sink.close()
    return result


def _manifest(info: CodecInfo, data: DataConfig, dataset: Dataset, flip: bool, parts: list[_Part],
              shard_size: int) -> CacheManifest:
    """The manifest of the whole cache from every rank's part (in rank order: the data set's order)."""
    shapes = {(p.shape, p.dtype) for p in parts if p.shape is not None}
    if not shapes:
        raise CacheError(f"no readable sample in the data set ({data.source} {data.path or ''}); nothing to encode")
    if len(shapes) > 1:
        raise CacheError(f"{info.run_dir} encoded images of one size to codes of shapes "
                         f"{' and '.join(str(list(shape)) for shape, _ in sorted(shapes))}")
    (shape, dtype), = shapes
    count, top_label = sum(p.count for p in parts), max(p.top_label for p in parts)
    source = source_of(data)
    return CacheManifest(
        kind=info.kind, shape=list(shape), dtype=dtype, count=count, flip=flip,
        # a stream does not know its classes up front: the largest label seen + 1
        num_classes=int(getattr(dataset, "num_classes", 0)) or top_label + 1, encoder_hash=info.encoder_hash,
        tokenizer={k: v for k, v in asdict(info).items() if k != "encoder_hash"},
        preprocessing=Preprocessing(
            source=data.source, path=source.identity(data).get("path"), split="train",
            image_size=data.image_size, resize=source.resize,
            flip_variants=["none", "horizontal"] if flip else ["none"], data=data.model_dump(mode="json")),
        shards=[SHARD_PATTERN % k for k in range(math.ceil(count / shard_size))],
        skipped=[s for p in parts for s in p.skipped])


def _renumber(staging: Path, parts: list[_Part], shard_size: int, rank: int) -> None:
    """Write the final shards whose first record this rank encoded, from the ranks' temporary shards (a shard may
    continue into the next ranks' parts)."""
    offsets = [0, *itertools.accumulate(p.count for p in parts)]
    total = offsets[-1]
    sink = _ShardSink(staging, SHARD_PATTERN, shard_size)
    try:
        first = -(-offsets[rank] // shard_size) * shard_size  # the first shard start in this rank's positions
        for start in range(first, offsets[rank + 1], shard_size):
            stop = min(start + shard_size, total)
            for position, record in enumerate(_records(staging, parts, offsets, start, stop, shard_size), start):
                sink.write(position, record)
    finally:
        sink.close()


def _records(staging: Path, parts: list[_Part], offsets: list[int], start: int, stop: int,
             shard_size: int) -> Iterator[dict[str, Any]]:
    """The records at cache positions [start, stop) from the ranks' temporary shards, their fields as bytes."""
    for rank, part in enumerate(parts):
        first, last = max(start, offsets[rank]) - offsets[rank], min(stop, offsets[rank + 1]) - offsets[rank]
        if first >= last:
            continue
        folder = staging / f"{TMP_PREFIX}rank-{rank:05d}"
        for number in range(first // shard_size, (last - 1) // shard_size + 1):
            base = number * shard_size
            for local, record in enumerate(shard_records(folder / (PART_PATTERN % number)), base):
                if first <= local < last:
                    yield {k: v for k, v in record.items() if not k.startswith("__")}


def _finish(staging: Path, out: Path, manifest: CacheManifest, parts: list[_Part], text_encoder: TextEncoder | None,
            text_path: str | None, batch_size: int, progress: bool) -> None:
    """Rank 0, once every rank's shards are in `staging`: drop the temporary parts, embed the captions (`text_path`:
    where the text encoder comes from), write the manifest last and rename the folder to `out`."""
    for folder in staging.glob(f"{TMP_PREFIX}rank-*"):
        shutil.rmtree(folder)
    if text_encoder is not None:
        captions = list(dict.fromkeys(c for p in parts for c in p.captions))
        manifest.text_encoder = write_text_embeds(text_encoder, captions, staging, batch_size, progress, text_path)
    fsync_tree(staging)
    write_atomically(staging / MANIFEST, manifest.model_dump_json(indent=1) + "\n")  # last
    os.replace(staging, out)
    fsync_dir(out.parent)
