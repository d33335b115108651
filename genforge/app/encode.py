"""The cache writer (`genforge encode`): a data set run once through a tokenizer's frozen encoder into a cache folder
(genforge.data.cache describes the format and reads it)."""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm
from webdataset import ShardWriter

from genforge.core.codec import CodecInfo
from genforge.core.config import DataConfig
from genforge.core.files import TMP_PREFIX, fsync_dir, fsync_tree, write_atomically
from genforge.core.registry import CACHE_KINDS
from genforge.data.base import CacheError, source_of
from genforge.data.cache import MANIFEST, SHARD_PATTERN, CacheManifest, Preprocessing
from genforge.data.images import png_bytes
from genforge.data.loader import build_dataset, dataset_size, pixel_field
from genforge.data.text_embeds import write_text_embeds
from genforge.text.base import TextEncoder
from genforge.text.config import TextEncoderConfig
from genforge.text.encoders import build_text_encoder


def encode_dataset(codec: nn.Module, info: CodecInfo, data: DataConfig, out: str | Path, *, flip: bool,
                   batch_size: int = 64, shard_size: int = 10_000, device: torch.device | str = "cpu",
                   progress: bool = False, text: TextEncoderConfig | None = None) -> CacheManifest:
    """Encode the training split of `data` (images or clips; unflipped, plus its mirror image when `flip`) with
    `codec` into the cache folder `out`, which must not exist or be empty; with `text` (a frozen text encoder), also
    the distinct captions (genforge.data.text_embeds). Everything is written under a temporary name that is
    renamed to `out` at the end, so a killed encode never leaves a manifest for incomplete shards or embeddings."""
    out = Path(out)
    if data.source == "cache":
        raise CacheError(f"data.source=cache ({data.path}): encode reads images (data.source shapes, folder or "
                         "shards)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CacheError(f"--out {out} already exists and is not empty; remove it or choose another folder")
    text_encoder = _frozen_text_encoder(text, device) if text is not None else None  # before hours of encoding
    captions: dict[str, None] | None = {} if text is not None else None  # distinct captions, in order
    dataset = build_dataset(data, split="train", flip=False)
    staging = out.parent / f"{TMP_PREFIX}{out.name}"
    if staging.exists():
        shutil.rmtree(staging)  # left by an encode that was killed
    staging.mkdir(parents=True)
    try:
        manifest = _write_shards(codec, info, data, dataset, staging, flip, batch_size, shard_size, device, progress,
                                 captions)
        if text_encoder is not None:
            manifest.text_encoder = write_text_embeds(text_encoder, text, list(captions), staging, batch_size,
                                                      progress)
        fsync_tree(staging)
        write_atomically(staging / MANIFEST, manifest.model_dump_json(indent=1) + "\n")  # last
        os.replace(staging, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _frozen_text_encoder(cfg: TextEncoderConfig, device: torch.device | str) -> TextEncoder:
    """The text encoder whose embeddings a cache stores: frozen ones only, without the memo."""
    if not cfg.frozen:
        raise CacheError(f"--text-encoder {cfg.kind}: only frozen text encoders (minilm, t5, clip) can be cached; "
                         f"{cfg.kind} trains with the model, so its embeddings change every step")
    return build_text_encoder(cfg, memo=False).to(device)


@torch.no_grad()
def _encode(codec: nn.Module, images: Tensor, info: CodecInfo) -> np.ndarray:
    """Codes of a batch as the cache kind stores them (float16 latents [b, C, h, w], int16/int32 ids [b, h, w])."""
    try:
        kind = CACHE_KINDS.get(info.kind)
        return kind.store(kind.encode(codec, images), info.codebook_size)
    except CacheError as err:
        raise CacheError(f"{info.run_dir}: {err}") from None


def _write_shards(codec: nn.Module, info: CodecInfo, data: DataConfig, dataset: Dataset, folder: Path,
                  flip: bool, batch_size: int, shard_size: int, device: torch.device | str,
                  progress: bool, captions: dict[str, None] | None = None) -> CacheManifest:
    """Write the shards into `folder`; the distinct captions written (flipped ones too) are added to `captions`."""
    kind = CACHE_KINDS.get(info.kind)
    field = pixel_field(data)  # "image" [C, H, W], or "video" [C, T, H, W]: clips to video token ids [t, h, w]
    if field == "video" and kind.with_image:
        raise CacheError(f"{info.run_dir}: {info.kind} caches keep the source image; they cannot hold clips")
    mirror = getattr(dataset, "mirror_text", None)  # the caption of the flipped image, where a source has one
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=data.num_workers, collate_fn=list)
    shards: list[str] = []
    skipped: list[dict[str, str]] = []
    count, first, top_label = 0, None, -1
    total = dataset_size(dataset)  # None for webdataset shards: one ordered pass
    with ShardWriter(str(folder / SHARD_PATTERN), maxcount=shard_size, verbose=0,
                     post=lambda name: shards.append(Path(name).name)) as sink, \
            tqdm(total=total, unit="img", desc="encoding", disable=not progress) as bar:
        for samples in loader:
            bar.update(len(samples))
            skipped += [{"key": s["key"], "reason": s["bad"]} for s in samples if "bad" in s]
            good = [s for s in samples if "bad" not in s]
            if not good:
                continue
            images = torch.stack([s[field] for s in good]).to(device)  # [b, 3, (T,) H, W] in [-1, 1]
            codes = _encode(codec, images, info)
            flipped = _encode(codec, images.flip(-1), info) if flip else None
            first = codes if first is None else first
            if codes.shape[1:] != first.shape[1:]:
                raise CacheError(f"{info.run_dir} encoded images of one size to codes of shapes {first.shape[1:]} "
                                 f"and {codes.shape[1:]}")
            for i, s in enumerate(good):
                record = {"__key__": f"{count:09d}", kind.key: codes[i], "key.txt": s["key"]}
                if flipped is not None:
                    record[kind.flip_key] = flipped[i]
                if kind.with_image:
                    record["png"] = png_bytes(images[i])
                if "label" in s:
                    record["cls"] = int(s["label"])
                    top_label = max(top_label, int(s["label"]))
                if "text" in s:
                    record["txt"] = s["text"]
                    if flip and mirror is not None and mirror(s["text"]) != s["text"]:
                        record["txt_flip.txt"] = mirror(s["text"])
                    if captions is not None:
                        captions.update(dict.fromkeys(record[k] for k in ("txt", "txt_flip.txt") if k in record))
                sink.write(record)
                count += 1
    if first is None:
        raise CacheError(f"no readable sample in the data set ({data.source} {data.path or ''}); nothing to encode")
    source = source_of(data)
    return CacheManifest(
        kind=info.kind, shape=list(first.shape[1:]), dtype=str(first.dtype), count=count, flip=flip,
        # a stream does not know its classes up front: the largest label seen + 1
        num_classes=int(getattr(dataset, "num_classes", 0)) or top_label + 1, encoder_hash=info.encoder_hash,
        tokenizer={k: v for k, v in asdict(info).items() if k != "encoder_hash"},
        preprocessing=Preprocessing(
            source=data.source, path=source.identity(data).get("path"), split="train",
            image_size=data.image_size, resize=source.resize,
            flip_variants=["none", "horizontal"] if flip else ["none"], data=data.model_dump(mode="json")),
        shards=shards, skipped=skipped)
