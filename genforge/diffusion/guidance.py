"""Classifier-free guidance (Ho & Salimans 2022)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor


def classifier_free_guidance(model: Callable[..., Tensor], scale: float, null_kwargs: dict[str, Tensor],
                             out_channels: int) -> Callable[..., Tensor]:
    """A model whose mean output is uncond + scale·(cond − uncond), both branches in one doubled batch.

    The first `out_channels` output channels are guided; any further ones (learned variance) come from the
    conditional branch. scale = 1 returns `model` itself.
    """
    if scale == 1.0:
        return model

    def guided(x: Tensor, t: Tensor, **kwargs: Any) -> Tensor:
        both = {k: torch.cat([v, null_kwargs[k]]) if k in null_kwargs else v for k, v in kwargs.items()}
        out = model(torch.cat([x, x]), torch.cat([t, t]), **both)  # [2B, C_out, ...]
        cond, uncond = out.chunk(2)
        mean = uncond[:, :out_channels] + scale * (cond[:, :out_channels] - uncond[:, :out_channels])
        return torch.cat([mean, cond[:, out_channels:]], dim=1)

    return guided
