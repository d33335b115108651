"""Classifier-free guidance (Ho & Salimans 2022) as a model wrapper for any sampler."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from genforge.diffusion.gaussian import Model


def _with_null(value: Any, null: Tensor | None) -> Any:
    """A kwarg for the doubled batch: [value; null] for a guided input, [value; value] for any other tensor."""
    if not isinstance(value, Tensor):
        return value
    second = value if null is None else null.to(value).expand_as(value)
    return torch.cat([value, second])


def classifier_free_guidance(model: Model, scale: float, null_kwargs: dict[str, Tensor], out_channels: int,
                             active: Callable[[Tensor], bool] | None = None) -> Model:
    """A model returning ε̃ = ε_uncond + scale·(ε_cond − ε_uncond) (Ho & Salimans 2022, eq. 6 with
    scale = 1 + w), both branches in one doubled batch.

    The unconditional branch replaces each kwarg named in `null_kwargs` by its null value (same shape, or
    broadcastable to it, e.g. [1, D]); other tensor kwargs are per-example and repeated. The first `out_channels`
    output channels (the data's C) are guided; any further ones (learned variance, [B, 2C, ...]) come from the
    conditional branch. Guiding ε, x_0 or v is the same since each is affine in the others given x_t.
    scale == 1 returns `model` itself. With `active` (a predicate on the time input t [B]), guidance applies only
    where it holds, e.g. a limited interval of noise levels (Kynkäänniemi et al. 2024); elsewhere the model runs once,
    conditionally.
    """
    if scale == 1.0:
        return model

    def guided(x: Tensor, t: Tensor, **kwargs: Any) -> Tensor:
        if active is not None and not active(t):
            return model(x, t, **kwargs)
        missing = null_kwargs.keys() - kwargs.keys()
        if missing:
            raise ValueError(f"classifier-free guidance: no conditional value for {sorted(missing)}")
        both = {name: _with_null(value, null_kwargs.get(name)) for name, value in kwargs.items()}
        cond, uncond = model(torch.cat([x, x]), torch.cat([t, t]), **both).chunk(2)  # [B, C_out, ...] each
        mean = uncond[:, :out_channels] + scale * (cond[:, :out_channels] - uncond[:, :out_channels])
        return torch.cat([mean, cond[:, out_channels:]], dim=1)

    return guided
