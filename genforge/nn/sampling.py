"""Sampling helpers shared by the families: Gumbel noise (the Gumbel-softmax of dvae, MaskGIT's decoding)."""

from __future__ import annotations

import torch
from torch import Tensor


def gumbel(uniform: Tensor) -> Tensor:
    """Standard Gumbel noise g = −log(−log u) from uniform draws u ∈ [0, 1) (u = 0, where g = −∞, is clamped to the
    smallest positive float)."""
    return -torch.log(-torch.log(uniform.clamp_min(torch.finfo(uniform.dtype).tiny)))
