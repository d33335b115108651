"""Codecs: the interface between pixels and the space a generator models, and the record of where one comes from.

A tokenizer family hands its encoder/decoder out through `Task.codec()`: continuous ones (klvae) implement
`LatentCodec`, discrete ones (dvae, vqgan) `TokenCodec`. A generator built on a tokenizer run names it in its
config (`FamilyConfig.input_runs`: an `InputRun` per field; or a diffusers AutoencoderKL / VQModel folder); the
application layer loads the frozen codec and hands it, with its `CodecInfo`, to the family's builder. Parameter-free stand-ins live in genforge.tokenizers.standins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

import torch
from torch import Tensor

from genforge.core.errors import ConfigError

CODE_KINDS = {"latent": "continuous latents", "tokens": "discrete tokens", "image_embed": "image embeddings"}


@runtime_checkable
class LatentCodec(Protocol):
    """image [B, 3, H, W] in [-1, 1]  <->  latent [B, latent_channels, H / downsample, W / downsample]."""

    latent_channels: int
    downsample: int

    def encode(self, image: Tensor) -> Tensor: ...

    def decode(self, latent: Tensor) -> Tensor: ...


@runtime_checkable
class GaussianLatentCodec(LatentCodec, Protocol):
    """A LatentCodec whose encoder is a diagonal Gaussian q(z|x) (klvae): `encode` is its mean, `encode_moments` its
    mean and standard deviation in the same (scaled) latent units, so a generator can train on samples of it."""

    def encode_moments(self, image: Tensor) -> tuple[Tensor, Tensor]: ...


@runtime_checkable
class DiffusersAutoencoder(LatentCodec, Protocol):
    """A LatentCodec that is a diffusers `AutoencoderKL` (klvae): `diffusers_autoencoder()` returns one with the
    codec's weights whose `config.scaling_factor` is the codec's scale, so that diffusers' `decode(latent /
    scaling_factor)` is the codec's `decode(latent)` (what `genforge export` puts in a DiTPipeline)."""

    def diffusers_autoencoder(self) -> Any: ...


@runtime_checkable
class TokenCodec(Protocol):
    """image [B, 3, H, W] in [-1, 1]  <->  token ids long [B, H / downsample, W / downsample] in [0, codebook_size)."""

    codebook_size: int
    downsample: int

    def encode(self, image: Tensor) -> Tensor: ...

    def decode(self, ids: Tensor) -> Tensor: ...


def token_frame_mask(frame_mask: Tensor, temporal_downsample: int) -> Tensor:
    """The token frames of a causal video codec (C-ViViT, Phenaki §2.1: the first frame on its own, then blocks of
    `temporal_downsample` frames) that real frames alone feed: frame_mask bool [B, T] (True = a real frame, T =
    1 + k·temporal_downsample) -> bool [B, 1 + k]. A token frame counts as real when all its frames and every
    earlier one are (causal attention carries a padded frame into every later token frame), so a block mixing real
    and padded frames is padding."""
    first, rest = frame_mask[:, :1], frame_mask[:, 1:]
    blocks = rest.unflatten(1, (-1, temporal_downsample)).all(-1)  # [B, k]: every frame of the block real
    return torch.cat([first, blocks], dim=1).long().cumprod(dim=1).bool()  # and every earlier token frame


@runtime_checkable
class ImageEmbedder(Protocol):
    """A contrastive image(-text) model's embedding space (CLIP; Radford et al. 2021), what the DALL·E 2 decoder is
    conditioned on: image [B, 3, image_size, image_size] in [-1, 1] -> unit-norm embedding float [B, embed_dim];
    with a text tower (`has_text`), captions -> unit-norm embeddings [B, embed_dim] in the same space."""

    embed_dim: int
    image_size: int  # the resolution the image tower takes (other sizes are resized to it)
    has_text: bool

    def embed_images(self, image: Tensor) -> Tensor: ...

    def embed_texts(self, texts: list[str]) -> Tensor: ...


@runtime_checkable
class TextEncodingEmbedder(ImageEmbedder, Protocol):
    """An ImageEmbedder whose text tower also gives its per-token states: captions -> (encodings float [B, L, W_t],
    mask bool [B, L], True = a real token), what DALL·E 2's prior attends to besides the pooled text embedding;
    `text_width` is W_t."""

    text_width: int

    def encode_texts(self, texts: list[str]) -> tuple[Tensor, Tensor]: ...


@runtime_checkable
class TextTowerEmbedder(TextEncodingEmbedder, Protocol):
    """A TextEncodingEmbedder whose text embedding is a function of its text tower's states (genforge's `clip`:
    their mean over the real tokens, projected), so that states stored once stand in for the tower:
    `embed_encodings(states, mask)` is `embed_texts` of the captions they encode; `text_tower()` is the tower, a
    frozen genforge TextEncoder (`encode`, `fingerprint`) whose states `genforge encode` stores per caption."""

    def text_tower(self) -> Any: ...

    def embed_encodings(self, states: Tensor, mask: Tensor) -> Tensor: ...


@runtime_checkable
class TextToImageEmbedding(Protocol):
    """Captions -> image embeddings of an ImageEmbedder's space (DALL·E 2's prior, §2.2): unit-norm [B, D], drawn
    with `generator` and `options` (an object of its own options class, `traits.sample_options`; None: its
    defaults); what a decoder conditioned on image embeddings is driven by for text-to-image."""

    embed_dim: int
    traits: Any  # its family's traits: `traits.sample_options` is the class of the options it takes

    def image_embeds_for(self, texts: list[str], generator: Any, options: Any = None) -> Tensor: ...

    def sampler_settings(self, options: Any) -> dict[str, Any]: ...  # what `options` resolve to, for the record

    def resolve(self, options: Any = None) -> Any: ...  # its options, unset ones filled

    def text_embeds(self, texts: list[str]) -> Tensor: ...  # its CLIP's unit-norm text embeddings [B, D]


def codec_kind(codec: object) -> str | None:
    """"tokens" for a TokenCodec, "latent" for a LatentCodec, "image_embed" for an ImageEmbedder, None for anything
    else."""
    if isinstance(codec, ImageEmbedder):
        return "image_embed"
    if isinstance(codec, TokenCodec):
        return "tokens"
    if isinstance(codec, LatentCodec):
        return "latent"
    return None


@dataclass(frozen=True)
class InputRun:
    """What a model is built from: a genforge run directory (`source` "run"; the model's checkpoints keep a copy of
    its codec's weights) or a diffusers model folder (`source` "diffusers"; the checkpoints refer to it by path and
    content hash, `Task.input_references`), and the codes its codec must make ("latent", "tokens", "image_embed")."""

    path: str
    kind: str
    source: str = "run"


@dataclass(frozen=True)
class CodecInfo:
    """Which tokenizer checkpoint a codec comes from; `encoder_hash` identifies its weights."""

    kind: str  # "latent" (LatentCodec: float [B, C, h, w]), "tokens" (TokenCodec: long ids [B, h, w]) or
    # "image_embed" (ImageEmbedder: float [B, D], D in `channels`)
    run_dir: str  # absolute path of the tokenizer's run directory (or of the diffusers folder)
    family: str  # the family of the run (a diffusers folder: "diffusers <class name>")
    step: int
    checkpoint: str  # the checkpoint folder the weights come from
    encoder_hash: str  # sha256 of that checkpoint's ema.safetensors (a diffusers folder: core.files.folder_sha256)
    channels: int  # latent channels or the embedding width D (0 for tokens)
    codebook_size: int  # (0 for latents)
    downsample: int  # pixels per latent or token, along each side (0 for image embeddings)
    image_size: int  # the tokenizer's training resolution (data.image_size; a diffusers folder: its sample_size)
    source: str = "run"  # "run" or "diffusers" (InputRun.source)


def check_references(saved: Mapping[str, Mapping[str, str]], current: Mapping[str, Mapping[str, str]],
                     where: Any) -> None:
    """ConfigError (exit 2) when a frozen input that the checkpoint `where` refers to (trainer_state.json's
    "inputs": config field -> {"path", "sha256", "class"}) is not the one the task holds now (`current`,
    Task.input_references): its folder's content changed, or the field no longer names one."""
    for field, ref in saved.items():
        now = current.get(field)
        if now is None or now["sha256"] != ref["sha256"]:
            found = f"{now['path']} has content sha256 {now['sha256'][:16]}…" if now else "none is configured now"
            raise ConfigError(f"{field}: {where} was made with the {ref['class']} folder {ref['path']} (content "
                              f"sha256 {ref['sha256'][:16]}…), but {found}: the folder was changed or replaced. "
                              "The run's checkpoints refer to that folder instead of holding its weights: put the "
                              f"original back, or point {field} in the run's config.yaml at a copy of it")
