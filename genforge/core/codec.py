"""Codecs: the interface between pixels and the space a generator models, and the record of where one comes from.

A tokenizer family hands its encoder/decoder out through `Task.codec()`: continuous ones (klvae) implement
`LatentCodec`, discrete ones (dvae, vqgan) `TokenCodec`. A generator built on a tokenizer run names it in its
config (`FamilyConfig.input_runs`: an `InputRun` per field); the application layer loads the run's frozen codec
and hands it, with its `CodecInfo`, to the family's builder. Parameter-free stand-ins live in genforge.nn.codec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

CODE_KINDS = {"latent": "continuous latents", "tokens": "discrete tokens"}


@runtime_checkable
class LatentCodec(Protocol):
    """image [B, 3, H, W] in [-1, 1]  <->  latent [B, latent_channels, H / downsample, W / downsample]."""

    latent_channels: int
    downsample: int

    def encode(self, image: Tensor) -> Tensor: ...

    def decode(self, latent: Tensor) -> Tensor: ...


@runtime_checkable
class TokenCodec(Protocol):
    """image [B, 3, H, W] in [-1, 1]  <->  token ids long [B, H / downsample, W / downsample] in [0, codebook_size)."""

    codebook_size: int
    downsample: int

    def encode(self, image: Tensor) -> Tensor: ...

    def decode(self, ids: Tensor) -> Tensor: ...


def codec_kind(codec: object) -> str | None:
    """"tokens" for a TokenCodec, "latent" for a LatentCodec, None for anything else."""
    if isinstance(codec, TokenCodec):
        return "tokens"
    if isinstance(codec, LatentCodec):
        return "latent"
    return None


@dataclass(frozen=True)
class InputRun:
    """A run a model is built from: its directory, and the codes its codec must make ("latent" or "tokens")."""

    path: str
    kind: str


@dataclass(frozen=True)
class CodecInfo:
    """Which tokenizer checkpoint a codec comes from; `encoder_hash` identifies its weights."""

    kind: str  # "latent" (LatentCodec: float [B, C, h, w]) or "tokens" (TokenCodec: long ids [B, h, w])
    run_dir: str  # absolute path of the tokenizer's run directory
    family: str
    step: int
    checkpoint: str  # the checkpoint folder the weights come from
    encoder_hash: str  # sha256 of that checkpoint's ema.safetensors
    channels: int  # latent channels (0 for tokens)
    codebook_size: int  # (0 for latents)
    downsample: int  # pixels per latent or token, along each side
    image_size: int  # the tokenizer's training resolution (data.image_size)
