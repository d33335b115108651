"""`tiny`: a small byte-level transformer text encoder trained with the model (tests and CPU runs).

Tokens are the caption's UTF-8 bytes between BOS and EOS (no vocabulary file); token + learned position
embeddings, `depth` pre-norm encoder layers with key-padding masked attention, a final LayerNorm.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from genforge.nn.attention import PreNormBlock
from genforge.text.base import TextEncoder

PAD, BOS, EOS = 0, 1, 2
OFFSET = 3  # byte b is token b + OFFSET
VOCAB_SIZE = 256 + OFFSET


def byte_tokenize(texts: Sequence[str], max_length: int) -> tuple[Tensor, Tensor]:
    """Captions -> (ids long [B, L], mask bool [B, L]): BOS, the UTF-8 bytes (truncated to keep EOS within
    max_length), EOS, then PAD; L = the longest row."""
    raw = [np.frombuffer(t.encode("utf-8"), np.uint8)[: max(max_length - 2, 0)] for t in texts]
    n = np.array([len(r) for r in raw], dtype=np.int64)  # bytes kept per caption
    lengths = np.minimum(n + 2, max_length)  # [B]
    cols = np.arange(lengths.max(initial=0))
    ids = np.full((len(texts), len(cols)), PAD, dtype=np.int64)  # [B, L]
    ids[:, :1] = BOS
    ids[(cols >= 1) & (cols <= n[:, None])] = np.concatenate([np.zeros(0, np.uint8), *raw]).astype(np.int64) + OFFSET
    if max_length >= 2:
        ids[np.arange(len(texts)), n + 1] = EOS
    return torch.from_numpy(ids), torch.from_numpy(cols < lengths[:, None])


class TinyTextEncoder(TextEncoder):
    """Byte-level transformer encoder; trains with the family that holds it (a submodule, in its checkpoints)."""

    kind = "tiny"
    trainable = True

    def __init__(self, dim: int = 128, depth: int = 2, heads: int = 4, max_length: int = 32) -> None:
        super().__init__()
        self.dim, self.depth, self.heads, self.max_length = dim, depth, heads, max_length
        self.token = nn.Embedding(VOCAB_SIZE, dim)
        self.position = nn.Parameter(torch.randn(max_length, dim) * 0.02)  # learned, [max_length, D]
        self.layers = nn.ModuleList(PreNormBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        nn.init.normal_(self.token.weight, std=0.02)

    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        ids, mask = (t.to(self.device) for t in byte_tokenize(texts, self.max_length))  # [B, L] each
        x = self.token(ids) + self.position[: ids.shape[1]]  # [B, L, D]
        for layer in self.layers:
            x = layer(x, mask)
        return torch.where(mask[..., None], self.norm(x), 0.0), mask

    def fingerprint(self) -> str:
        """The architecture and the sha256 of the current weights (they change as it trains; never cached)."""
        arch = f"tiny:dim={self.dim}:depth={self.depth}:heads={self.heads}:max_length={self.max_length}"
        if self.device.type == "meta":
            return arch
        digest = hashlib.sha256()
        for name, tensor in sorted(self.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return f"{arch}:sha256={digest.hexdigest()}"
