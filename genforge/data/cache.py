"""Latent / token caches: a data set run once through a tokenizer's encoder (`genforge encode`), so that a
generator trains on the codes without encoding pixels every step.

A cache is a folder of webdataset shards plus a manifest written last (see docs/cache.md):

    cache.json            kind, shape, dtype, count, encoder_hash, tokenizer, preprocessing, shards, ...
    shard-000000.tar      per sample: <n>.latent.npy (float16 [C, h, w]) or <n>.tokens.npy (int16/int32 [h, w]),
    shard-000001.tar      <n>.latent_flip.npy / tokens_flip.npy (the horizontally flipped image, optional),
    ...                   <n>.cls (label), <n>.txt (caption), <n>.txt_flip.txt (its mirror, when it differs),
                          <n>.key.txt (the source sample's key); <n> = __key__, the position in the cache
    text_embeds.*         with --text-encoder: a frozen text encoder's embeddings of the distinct captions
                          (genforge.data.text_embeds)

The encoder is identified by `encoder_hash`, the sha256 of the tokenizer checkpoint's ema.safetensors; a
generator refuses a cache whose hash differs from its configured tokenizer's (`check_cache`).
"""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal

import numpy as np
import torch
from pydantic import ValidationError
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from genforge.config.base import DataConfig, StrictModel
from genforge.data.images import flip_drawn
from genforge.data.loader import DataInfo, dataset_size
from genforge.data.text_embeds import TextEmbeds
from genforge.engine.checkpoint import TMP_PREFIX, fsync_dir, fsync_tree, write_atomically

if TYPE_CHECKING:
    from genforge.engine.runs import CodecInfo
    from genforge.text import TextEncoder, TextEncoderConfig

MANIFEST = "cache.json"
SHARD_PATTERN = "shard-%06d.tar"
RESIZE = {  # how each source turns its images into data.image_size pixels
    "shapes": "rendered at data.image_size (4x supersampled, box-filtered)",
    "folder": "ADM center crop: box-halve while the short side >= 2 x data.image_size, bicubic resize of the "
              "short side to data.image_size, center crop",
}
RESIZE["shards"] = RESIZE["folder"]


class CacheError(ValueError):
    """A cache that cannot be written or read, or that does not fit the run; the message names the file."""


class Preprocessing(StrictModel):
    """How the cached images were read before encoding."""

    source: str  # data.source of the encoded data set
    path: str | None  # its data.path (absolute), if any
    split: str
    image_size: int  # pixels
    resize: str
    flip_variants: list[str]  # ["none"] or ["none", "horizontal"]
    data: dict[str, Any]  # the whole data section the images were read with


class CacheManifest(StrictModel):
    """cache.json: what the shards hold and which encoder wrote them."""

    format: Literal["genforge-cache"] = "genforge-cache"
    version: Literal[1] = 1
    kind: Literal["latent", "tokens"]
    shape: list[int]  # of one sample: [C, h, w] latents or [h, w] token ids
    dtype: Literal["float16", "int16", "int32"]
    count: int
    flip: bool  # the flipped variant is stored too
    num_classes: int
    encoder_hash: str  # sha256 of the tokenizer checkpoint's ema.safetensors
    tokenizer: dict[str, Any]  # runs.CodecInfo: run_dir, family, step, checkpoint, channels, downsample, ...
    preprocessing: Preprocessing
    shards: list[str]
    skipped: list[dict[str, str]] = []  # unreadable source samples: {"key", "reason"}
    text_encoder: dict[str, Any] | None = None  # text_embeds.write_text_embeds: kind, path, fingerprint, files, ...

    def data_info(self) -> DataInfo:
        """What a generator needs to know about the cached data."""
        return DataInfo(num_classes=self.num_classes, channels=self.shape[0] if self.kind == "latent" else 0,
                        image_size=self.preprocessing.image_size, kind=self.kind, encoder_hash=self.encoder_hash,
                        text_encoder=self.text_encoder["fingerprint"] if self.text_encoder else None)


def read_manifest(path: str | Path) -> CacheManifest:
    """The manifest of the cache folder `path` (CacheError when missing or invalid)."""
    file = Path(path) / MANIFEST
    if not file.is_file():
        raise CacheError(f"{path} is not a cache: no {MANIFEST} (write one with `genforge encode`; an encode that "
                         "did not finish leaves none)")
    try:
        return CacheManifest.model_validate_json(file.read_text())
    except (OSError, ValidationError) as err:
        raise CacheError(f"{file} is not a readable cache manifest ({err})") from None


def open_manifest(cfg: DataConfig, flip: bool | None = None) -> CacheManifest:
    """The manifest of the cache `cfg.path`, checked against data.image_size and data.flip (or `flip`)."""
    manifest = read_manifest(cfg.path)
    size = manifest.preprocessing.image_size
    if cfg.image_size != size:
        raise CacheError(f"data.image_size={cfg.image_size}, but the cache {cfg.path} was encoded from "
                         f"{size}x{size} images; set data.image_size={size}")
    _check_flip(manifest, cfg.flip if flip is None else flip, cfg.path)
    return manifest


def _check_flip(manifest: CacheManifest, flip: bool, path: str | Path) -> None:
    if flip and not manifest.flip:
        raise CacheError(f"data.flip=true, but the cache {path} has no flipped variant: encode it with --flip, "
                         "or set data.flip=false")


def check_cache(data: DataInfo, codec: "CodecInfo", path: str | None) -> None:
    """Refuse cached data that another tokenizer checkpoint (or another kind of codec) wrote. A no-op for data
    that is not a cache (`data.encoder_hash` is None)."""
    if data.encoder_hash is None:
        return
    if data.kind != codec.kind:
        raise CacheError(f"the cache in {path} holds {data.kind}, but the tokenizer {codec.run_dir} ({codec.family}) "
                         f"encodes {codec.kind}")
    if data.encoder_hash != codec.encoder_hash:
        writer = read_manifest(path).tokenizer.get("checkpoint", "?")
        raise CacheError(
            f"the cache in {path} was encoded by another tokenizer checkpoint than the configured one:\n"
            f"  cache:     encoder_hash {data.encoder_hash} ({writer})\n"
            f"  tokenizer: encoder_hash {codec.encoder_hash} ({codec.checkpoint})\n"
            f"re-encode it (genforge encode {codec.run_dir} --out NEW_DIR) or configure the tokenizer that wrote it")
    if data.channels != codec.channels:
        raise CacheError(f"the cache in {path} holds {data.channels}-channel latents, the tokenizer {codec.run_dir} "
                         f"makes {codec.channels}")


# ---------------------------------------------------------------------------------------------- writing
def encode_dataset(codec: nn.Module, info: "CodecInfo", data: DataConfig, out: str | Path, *, flip: bool,
                   batch_size: int = 64, shard_size: int = 10_000, device: torch.device | str = "cpu",
                   progress: bool = False, text: "TextEncoderConfig | None" = None) -> CacheManifest:
    """Encode the training split of `data` (unflipped, plus its mirror image when `flip`) with `codec` into the
    cache folder `out`, which must not exist or be empty; with `text` (a frozen text encoder), also the distinct
    captions (genforge.data.text_embeds). Everything is written under a temporary name that is renamed to `out`
    at the end, so a killed encode never leaves a manifest for incomplete shards or embeddings."""
    from genforge.data.loader import build_dataset
    from genforge.data.text_embeds import write_text_embeds

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


def _frozen_text_encoder(cfg: "TextEncoderConfig", device: torch.device | str) -> "TextEncoder":
    """The text encoder whose embeddings a cache stores: frozen ones only, without the memo."""
    if not cfg.frozen:
        raise CacheError(f"--text-encoder {cfg.kind}: only frozen text encoders (minilm, t5, clip) can be cached; "
                         f"{cfg.kind} trains with the model, so its embeddings change every step")
    from genforge.text import build_text_encoder

    return build_text_encoder(cfg, memo=False).to(device)


def _absolute(data: DataConfig) -> str | None:
    """data.path made absolute (for webdataset shards: the local parts of the URL spec)."""
    if not data.path:
        return None
    if data.source == "shards":
        from genforge.data.shards import absolute_spec

        return absolute_spec(data.path)
    return str(Path(data.path).resolve())


@torch.no_grad()
def _encode(codec: nn.Module, images: Tensor, info: "CodecInfo") -> np.ndarray:
    """Codes of a batch in their stored dtype: float16 latents [b, C, h, w] or int16/int32 ids [b, h, w]."""
    codes = codec.encode(images)
    if info.kind == "latent":
        stored = codes.float().cpu().numpy().astype(np.float16)
        if not np.isfinite(stored).all():
            raise CacheError(f"latents of {info.run_dir} overflow float16 (max |latent| "
                             f"{codes.abs().max().item():.4g}); is its scale factor right?")
        return stored
    return codes.cpu().numpy().astype(np.int16 if info.codebook_size <= 2**15 else np.int32)


def _write_shards(codec: nn.Module, info: "CodecInfo", data: DataConfig, dataset: Dataset, folder: Path,
                  flip: bool, batch_size: int, shard_size: int, device: torch.device | str,
                  progress: bool, captions: dict[str, None] | None = None) -> CacheManifest:
    """Write the shards into `folder`; the distinct captions written (flipped ones too) are added to `captions`."""
    from tqdm import tqdm
    from webdataset import ShardWriter

    field = info.kind  # "latent" or "tokens"
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
            images = torch.stack([s["image"] for s in good]).to(device)  # [b, 3, H, W] in [-1, 1]
            codes = _encode(codec, images, info)
            flipped = _encode(codec, images.flip(-1), info) if flip else None
            first = codes if first is None else first
            if codes.shape[1:] != first.shape[1:]:
                raise CacheError(f"{info.run_dir} encoded images of one size to codes of shapes {first.shape[1:]} "
                                 f"and {codes.shape[1:]}")
            for i, s in enumerate(good):
                record = {"__key__": f"{count:09d}", f"{field}.npy": codes[i], "key.txt": s["key"]}
                if flipped is not None:
                    record[f"{field}_flip.npy"] = flipped[i]
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
    return CacheManifest(
        kind=info.kind, shape=list(first.shape[1:]), dtype=str(first.dtype), count=count, flip=flip,
        # a stream does not know its classes up front: the largest label seen + 1
        num_classes=int(getattr(dataset, "num_classes", 0)) or top_label + 1, encoder_hash=info.encoder_hash,
        tokenizer={k: v for k, v in asdict(info).items() if k != "encoder_hash"},
        preprocessing=Preprocessing(
            source=data.source, path=_absolute(data), split="train",
            image_size=data.image_size, resize=RESIZE[data.source],
            flip_variants=["none", "horizontal"] if flip else ["none"], data=data.model_dump(mode="json")),
        shards=shards, skipped=skipped)


# ---------------------------------------------------------------------------------------------- reading
def _shard_records(path: Path) -> Iterator[dict[str, Any]]:
    """The samples of one shard as {field: bytes}, in write order."""
    from webdataset.tariterators import tarfile_samples

    yield from tarfile_samples([{"url": str(path)}])


def _array(data: bytes, manifest: CacheManifest) -> np.ndarray:
    array = np.load(io.BytesIO(data), allow_pickle=False)
    if list(array.shape) != manifest.shape or str(array.dtype) != manifest.dtype:
        raise ValueError(f"an array of shape {list(array.shape)} {array.dtype}, the manifest says "
                         f"{manifest.shape} {manifest.dtype}")
    return array


class CacheDataset(Dataset):
    """The samples of a cache folder, all read into memory tensors once, at construction: latents of small
    images are tiny (32 px through a 4x-downsampling VAE: 4x8x8 float16 = 512 bytes a sample). Streaming
    from shards, for caches larger than memory, is the webdataset-shards loader's job.

    Items are indices or the sampler's `(index, aug_seed)`; with `flip`, the per-sample coin that the image
    data sets toss (`flip_drawn`) picks the flipped variant, so a run on the cache sees the same flips as one
    encoding the images on the fly. Samples: `latent` float32 [C, h, w] (or `tokens` long [h·w]), `label`,
    `text` (when captioned) and `key` (the source sample's key); a cache written with --text-encoder adds the
    caption's `text_embed` float32 [L, D] and `text_mask` bool [L] (the flipped caption's, for a flipped
    sample), looked up among the distinct captions' embeddings, held once."""

    def __init__(self, path: str | Path, flip: bool = False, manifest: CacheManifest | None = None) -> None:
        self.root = Path(path)
        self.manifest = m = manifest or read_manifest(self.root)
        _check_flip(m, flip, self.root)
        self.flip, self.kind, self.num_classes = flip, m.kind, m.num_classes
        codes, flipped, labels, texts, texts_flip, keys = [], [], [], [], [], []
        for name in m.shards:
            shard = self.root / name
            if not shard.is_file():
                raise CacheError(f"{shard} is missing (listed in {self.root / MANIFEST})")
            try:
                for record in _shard_records(shard):
                    codes.append(_array(record[f"{m.kind}.npy"], m))
                    if flip:
                        flipped.append(_array(record[f"{m.kind}_flip.npy"], m))
                    if m.num_classes:
                        labels.append(int(record["cls"]))
                    text = record["txt"].decode() if "txt" in record else None
                    texts.append(text)
                    texts_flip.append(record["txt_flip.txt"].decode() if "txt_flip.txt" in record else text)
                    keys.append(record["key.txt"].decode())
            except Exception as err:  # a torn tar, a bad array, a missing field: name the shard
                raise CacheError(f"{shard} is not a readable cache shard ({type(err).__name__}: {err})") from None
        if len(codes) != m.count:
            raise CacheError(f"the shards of {self.root} hold {len(codes)} samples; {MANIFEST} says {m.count}")
        self.codes = torch.from_numpy(np.stack(codes))  # [N, C, h, w] float16 or [N, h, w] int
        self.codes_flip = torch.from_numpy(np.stack(flipped)) if flip else None
        self.labels = torch.tensor(labels) if m.num_classes else None
        self.texts = texts if any(t is not None for t in texts) else None
        self.texts_flip, self.keys = texts_flip, keys
        self.text_embeds = TextEmbeds(self.root, m.text_encoder) if m.text_encoder else None
        if self.text_embeds is not None:
            self.text_rows, self.text_rows_flip = self.text_embeds.rows(texts), self.text_embeds.rows(texts_flip)

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, item: int | tuple[int, int]) -> dict[str, Any]:
        index, aug_seed = item if isinstance(item, tuple) else (item, None)
        flipped = self.flip and flip_drawn(aug_seed)
        codes = (self.codes_flip if flipped else self.codes)[index]
        sample: dict[str, Any] = {"key": self.keys[index]}
        if self.kind == "latent":
            sample["latent"] = codes.float()  # [C, h, w]
        else:
            sample["tokens"] = codes.long().flatten()  # [h·w]
        if self.labels is not None:
            sample["label"] = int(self.labels[index])
        if self.texts is not None and self.texts[index] is not None:
            sample["text"] = (self.texts_flip if flipped else self.texts)[index]
            if self.text_embeds is not None:
                row = (self.text_rows_flip if flipped else self.text_rows)[index]
                sample["text_embed"], sample["text_mask"] = self.text_embeds[row]  # [L, D], [L]
        return sample


def manifest_summary(manifest: CacheManifest) -> str:
    """One line: what a cache holds."""
    shape = "x".join(map(str, manifest.shape))
    flip = " (+ flipped)" if manifest.flip else ""
    return (f"{manifest.count} {manifest.kind} {shape} {manifest.dtype}{flip} in {len(manifest.shards)} "
            f"shard(s), encoder_hash {manifest.encoder_hash[:12]}…" + (
                f", {manifest.text_encoder['kind']} text embeddings of {manifest.text_encoder['count']} distinct "
                "captions" if manifest.text_encoder else ""))

