"""Latent / token caches: a data set run once through a tokenizer's encoder (`genforge encode`), so that a
generator trains on the codes without encoding pixels every step.

A cache is a folder of webdataset shards plus a manifest written last (see docs/cache.md):

    cache.json            kind, shape, dtype, count, encoder_hash, tokenizer, preprocessing, shards, ...
    shard-000000.tar      per sample: <n>.latent.npy (float16 [C, h, w]) or <n>.tokens.npy (int16/int32 [h, w]),
    shard-000001.tar      <n>.latent_flip.npy / tokens_flip.npy (the horizontally flipped image, optional),
    ...                   <n>.cls (label), <n>.txt (caption), <n>.txt_flip.txt (its mirror, when it differs),
                          <n>.key.txt (the source sample's key); <n> = __key__, the position in the cache;
                          <n>.frame_mask.npy (bool [T]: a clip's real frames, data.video.min_frames)
    text_embeds.*         with --text-encoder: a frozen text encoder's embeddings of the distinct captions
                          (genforge.data.text_embeds)

The encoder is identified by `encoder_hash`, the sha256 of the tokenizer checkpoint's ema.safetensors; a
generator refuses a cache whose hash differs from its configured tokenizer's (`check_cache`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import numpy as np
import torch
from PIL import Image
from pydantic import ValidationError
from torch import Tensor
from torch.utils.data import Dataset

from genforge.core.codec import CodecInfo
from genforge.core.config import DataConfig, StrictModel
from genforge.core.registry import CACHE_KINDS, DATA_SOURCES
from genforge.data.base import CacheError, DataInfo, DataSource, source_of
from genforge.data.images import flip_drawn, to_tensor
from genforge.data.text_embeds import TextEmbeds

MANIFEST = "cache.json"
SHARD_PATTERN = "shard-%06d.tar"


# ------------------------------------------------------------------------------------------------ cache kinds
@dataclass(frozen=True)
class CacheKind:
    """One kind of cached codes: how a codec makes them from images (`encode`), how a batch of codes is stored
    (`store`: codes, codebook size -> the array written, CacheError when it cannot be) and under which record key
    (`record_key`, `record_key_flip` for the flipped image's), which Batch field a sample's row becomes (`field`, by
    `to_sample`), the channels a generator sees (`channels` of the stored shape of one sample), and whether the
    source image is kept beside the codes (`with_image`: a generator that needs both, the DALL·E 2 decoder)."""

    name: str
    field: str
    store: Callable[[Tensor, int], np.ndarray]
    to_sample: Callable[[Tensor], Tensor]
    channels: Callable[[list[int]], int]
    encode: Callable[[Any, Tensor], Tensor] = lambda codec, images: codec.encode(images)
    record_key: str = ""  # default "<name>.npy"
    with_image: bool = False

    @property
    def key(self) -> str:
        return self.record_key or f"{self.name}.npy"

    @property
    def flip_key(self) -> str:
        return self.key.replace(".npy", "") + "_flip.npy"


def _store_latents(codes: Tensor, codebook_size: int) -> np.ndarray:
    stored = codes.float().cpu().numpy().astype(np.float16)
    if not np.isfinite(stored).all():
        raise CacheError(f"latents overflow float16 (max |latent| {codes.abs().max().item():.4g}); is the "
                         "tokenizer's scale factor right?")
    return stored


def _store_tokens(codes: Tensor, codebook_size: int) -> np.ndarray:
    return codes.cpu().numpy().astype(np.int16 if codebook_size <= 2**15 else np.int32)


CACHE_KINDS.register("latent", CacheKind("latent", "latent", _store_latents, lambda row: row.float(),  # [C, h, w]
                                         lambda shape: shape[0]))
CACHE_KINDS.register("tokens", CacheKind("tokens", "tokens", _store_tokens, lambda row: row.long().flatten(),  # [h·w]
                                         lambda shape: 0))
# image embeddings [D] beside the image itself: the records are also DALLE2-pytorch-style shards (png + npy + txt)
CACHE_KINDS.register("image_embed", CacheKind("image_embed", "image_embed", _store_latents, lambda row: row.float(),
                                              lambda shape: 3, encode=lambda codec, images: codec.embed_images(images),
                                              record_key="npy", with_image=True))


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
    kind: str  # a registered cache kind: "latent", "tokens"
    shape: list[int]  # of one sample: [C, h, w] latents or [h, w] token ids
    dtype: str  # "float16" (latents), "int16" / "int32" (token ids)
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
        return DataInfo(num_classes=self.num_classes, channels=CACHE_KINDS.get(self.kind).channels(self.shape),
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


def check_cache(data: DataInfo, codec: CodecInfo, path: str | None) -> None:
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
    if data.kind == "latent" and data.channels != codec.channels:
        raise CacheError(f"the cache in {path} holds {data.channels}-channel latents, the tokenizer {codec.run_dir} "
                         f"makes {codec.channels}")


# ---------------------------------------------------------------------------------------------- reading
def shard_records(path: Path) -> Iterator[dict[str, Any]]:
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
    `text` (when captioned), `key` (the source sample's key) and the clip's `frame_mask` bool [T] (when its data
    had data.video.min_frames; the same for the flipped variant); a cache written with --text-encoder adds the
    caption's `text_embed` float32 [L, D] and `text_mask` bool [L] (the flipped caption's, for a flipped
    sample), looked up among the distinct captions' embeddings, held once."""

    def __init__(self, path: str | Path, flip: bool = False, manifest: CacheManifest | None = None) -> None:
        self.root = Path(path)
        self.manifest = m = manifest or read_manifest(self.root)
        _check_flip(m, flip, self.root)
        self.flip, self.kind, self.num_classes = flip, CACHE_KINDS.get(m.kind), m.num_classes
        codes, flipped, labels, texts, texts_flip, keys, images, masks = [], [], [], [], [], [], [], []
        for name in m.shards:
            shard = self.root / name
            if not shard.is_file():
                raise CacheError(f"{shard} is missing (listed in {self.root / MANIFEST})")
            try:
                for record in shard_records(shard):
                    codes.append(_array(record[self.kind.key], m))
                    if flip:
                        flipped.append(_array(record[self.kind.flip_key], m))
                    if self.kind.with_image:
                        images.append(np.asarray(Image.open(io.BytesIO(record["png"])).convert("RGB")))
                    if m.num_classes:
                        labels.append(int(record["cls"]))
                    text = record["txt"].decode() if "txt" in record else None
                    texts.append(text)
                    texts_flip.append(record["txt_flip.txt"].decode() if "txt_flip.txt" in record else text)
                    keys.append(record["key.txt"].decode())
                    if "frame_mask.npy" in record:
                        masks.append(np.load(io.BytesIO(record["frame_mask.npy"]), allow_pickle=False))
            except Exception as err:  # a torn tar, a bad array, a missing field: name the shard
                raise CacheError(f"{shard} is not a readable cache shard ({type(err).__name__}: {err})") from None
        if len(codes) != m.count:
            raise CacheError(f"the shards of {self.root} hold {len(codes)} samples; {MANIFEST} says {m.count}")
        self.codes = torch.from_numpy(np.stack(codes))  # [N, C, h, w] float16 or [N, h, w] int
        self.codes_flip = torch.from_numpy(np.stack(flipped)) if flip else None
        self.labels = torch.tensor(labels) if m.num_classes else None
        self.texts = texts if any(t is not None for t in texts) else None
        self.texts_flip, self.keys = texts_flip, keys
        self.images = torch.from_numpy(np.stack(images)) if images else None  # uint8 [N, H, W, 3]
        if masks and len(masks) != len(codes):
            raise CacheError(f"{self.root}: {len(masks)} of its {len(codes)} samples have a frame_mask")
        self.frame_masks = torch.from_numpy(np.stack(masks)).bool() if masks else None  # [N, T]
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
        sample[self.kind.field] = self.kind.to_sample(codes)
        if self.frame_masks is not None:
            sample["frame_mask"] = self.frame_masks[index]
        if self.images is not None:
            image = to_tensor(self.images[index].numpy())  # [3, H, W] in [-1, 1]
            sample["image"] = image.flip(-1) if flipped else image
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



class CacheSource(DataSource):
    """`data.source: cache`: a folder written by `genforge encode`, read into memory; no held-out split."""

    name = "cache"
    path_help = "a folder written by `genforge encode`"
    sections = ("video",)  # a cache of clips: the families read the clips' length from data.video
    field = "codes"  # its samples hold a codec's codes (`latent`, `tokens`), not pixels

    def build(self, cfg: DataConfig, split: str, flip: bool, world_size: int | None) -> CacheDataset:
        if split == "val":
            raise ValueError(f"data.source=cache ({cfg.path}) has no held-out split")
        return CacheDataset(cfg.path, flip=flip, manifest=open_manifest(cfg, flip))

    def heldout_split(self, cfg: DataConfig) -> str:
        raise ValueError(f"data.source=cache ({cfg.path}) has no held-out images; use the data it was encoded from")

    def info(self, dataset: Dataset, cfg: DataConfig) -> DataInfo:
        return dataset.manifest.data_info()

    def scan_info(self, cfg: DataConfig) -> DataInfo:
        return open_manifest(cfg).data_info()

    def image_data(self, cfg: DataConfig) -> DataConfig | None:
        try:
            return DataConfig.model_validate(read_manifest(cfg.path).preprocessing.data)
        except CacheError:
            return None

    def preview_conditions(self, cfg: DataConfig, n: int) -> dict[str, Any]:
        """Those of the data the cache was encoded from (its held-out captions and labels)."""
        images = self.image_data(cfg)
        if images is None:
            raise CacheError(f"data.path={cfg.path}: its cache.json cannot be read, so the data it was encoded from "
                             "(where preview prompts come from) is unknown; give --prompt or model.sample_prompts")
        return source_of(images).preview_conditions(images, n)


DATA_SOURCES.register("cache", CacheSource())
