"""Frozen text encoders' embeddings stored in a cache folder (`genforge encode --text-encoder KIND`, or the text
tower of an image embedder that has one: a clip run's).

Every distinct caption of the cache (and of its flipped variant) is encoded once; two files hold them:

    text_embeds.safetensors   embeds float16 [U, L, D] (pads zero), mask bool [U, L] (True = token)
    text_embeds.json          captions (row order), fingerprint, kind, path, max_length

L is the longest tokenized caption (<= max_length); every row is padded to it, so batches stack.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm.auto import tqdm

from genforge.data.base import CacheError
from genforge.text.base import TextEncoder, pad_rows, trim_rows

EMBEDS_FILE = "text_embeds.safetensors"
CAPTIONS_FILE = "text_embeds.json"


@torch.no_grad()
def write_text_embeds(encoder: TextEncoder, captions: Sequence[str], folder: Path, batch_size: int = 64,
                      progress: bool = False, path: str | None = None) -> dict[str, Any]:
    """Encode the distinct `captions` once, `batch_size` at a time, and write both files into `folder`; returns
    the manifest's `text_encoder` entry (`path`: where the encoder's weights come from, recorded)."""
    if not captions:
        raise CacheError(f"--text-encoder {encoder.kind}: the data set has no captions to encode")
    rows: list[Tensor] = []
    batches = range(0, len(captions), batch_size)
    for start in tqdm(batches, desc="text embeddings", unit="batch", disable=not progress):
        rows += trim_rows(*encoder.encode(captions[start : start + batch_size]))  # [len, D] each
    embeds, mask = pad_rows(rows, encoder.dim)  # [U, L, D], [U, L]
    stored = embeds.half()
    if not torch.isfinite(stored).all():
        raise CacheError(f"the {encoder.kind} text embeddings overflow float16 (max |x| "
                         f"{embeds.abs().max().item():.4g})")
    save_file({"embeds": stored, "mask": mask}, str(folder / EMBEDS_FILE))
    entry = {"kind": encoder.kind, "path": path, "max_length": encoder.max_length,
             "fingerprint": encoder.fingerprint()}
    (folder / CAPTIONS_FILE).write_text(json.dumps({**entry, "captions": list(captions)}, ensure_ascii=False))
    return {**entry, "count": len(captions), "length": int(mask.shape[1]), "dim": encoder.dim,
            "files": {"embeds": EMBEDS_FILE, "captions": CAPTIONS_FILE}}


class TextEmbeds:
    """The stored embeddings of a cache folder, looked up by caption (`entry`: the manifest's `text_encoder`)."""

    def __init__(self, folder: Path, entry: dict[str, Any]) -> None:
        files = entry["files"]
        embeds_file, captions_file = folder / files["embeds"], folder / files["captions"]
        try:
            sidecar = json.loads(captions_file.read_text())
            tensors = load_file(str(embeds_file))
            self.embeds, self.mask = tensors["embeds"], tensors["mask"].bool()  # [U, L, D] float16, [U, L]
        except Exception as err:  # a missing or torn file: name it
            raise CacheError(f"the text embeddings of {folder} ({embeds_file.name}, {captions_file.name}) are not "
                             f"readable ({type(err).__name__}: {err})") from None
        captions = sidecar["captions"]
        if sidecar["fingerprint"] != entry["fingerprint"] or not len(captions) == len(self.embeds) == entry["count"]:
            raise CacheError(f"{captions_file} does not match {embeds_file.name} and the manifest (fingerprint or "
                             "caption count differ)")
        self.index = {caption: row for row, caption in enumerate(captions)}

    def rows(self, texts: Sequence[str | None]) -> np.ndarray:
        """Row of each caption, -1 for None (an uncaptioned sample)."""
        missing = next((t for t in texts if t is not None and t not in self.index), None)
        if missing is not None:
            raise CacheError(f"the caption {missing!r} has no stored text embedding")
        return np.array([-1 if t is None else self.index[t] for t in texts], dtype=np.int64)

    def __getitem__(self, row: int) -> tuple[Tensor, Tensor]:
        """(text_embed float32 [L, D], text_mask bool [L]) of a row."""
        return self.embeds[row].float(), self.mask[row]
