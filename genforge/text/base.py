"""The interface every text encoder implements (and all a family may rely on), and the padding helpers."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence


class TextEncoder(nn.Module):
    """The interface every text encoder implements (and all a family may rely on)."""

    kind: str
    dim: int  # D of the embeddings
    max_length: int  # L <= max_length: longer captions are truncated
    trainable: bool = False  # True only for `tiny`, which trains with the model

    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Captions -> (embeddings float32 [B, L, D] with pad positions zero, mask bool [B, L], True = token),
        L = the longest tokenized caption of the batch; on the device of the encoder's parameters."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """Identifies weights + tokenizer + max_length, so stored embeddings can be checked against an encoder."""
        raise NotImplementedError

    def forward(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        return self.encode(texts)

    @property
    def device(self) -> torch.device:
        """Where the encoder runs (its parameters' device)."""
        param = next(self.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def encode_on(self, texts: Sequence[str], device: torch.device | str) -> tuple[Tensor, Tensor]:
        """`encode`, with the outputs on `device`; a frozen encoder (kept outside its family's module tree, so not
        moved by the family's `.to()`) first moves itself there."""
        device = torch.device(device)
        if not self.trainable and not _same_device(self.device, device):
            self.to(device)
        embeds, mask = self.encode(texts)
        return embeds.to(device), mask.to(device)


def _same_device(a: torch.device, b: torch.device) -> bool:
    """`cuda` and `cuda:0` (the current device) are the same."""
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    current = torch.cuda.current_device()
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


# ---------------------------------------------------------------------------------------------- padding
def trim_rows(embeds: Tensor, mask: Tensor) -> list[Tensor]:
    """A right-padded batch (embeds [B, L, D], mask [B, L]) -> B float32 CPU rows [len_b, D]."""
    lengths = mask.sum(1).tolist()
    embeds = embeds.detach().float().cpu()
    return [embeds[b, :n].clone() for b, n in enumerate(lengths)]  # clone: rows don't pin the batch's storage


def pad_rows(rows: Sequence[Tensor], dim: int) -> tuple[Tensor, Tensor]:
    """Rows [len_b, D] -> (embeds [B, L, D] zero-padded to the longest, mask bool [B, L]); the inverse of
    `trim_rows`."""
    if not rows:
        return torch.zeros(0, 0, dim), torch.zeros(0, 0, dtype=torch.bool)
    lengths = torch.tensor([len(r) for r in rows])
    embeds = pad_sequence(list(rows), batch_first=True)  # [B, L, D]
    mask = torch.arange(embeds.shape[1]) < lengths[:, None]  # [B, L]
    return embeds, mask
