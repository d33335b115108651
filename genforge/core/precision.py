"""Mixed precision when a trained network only runs forward (`genforge sample`, `eval`, `encode`): the network runs
under `torch.autocast` of the chosen dtype, and what it returns is cast back to float32 by the caller before any
metric or file sees it. The names are those of `train.precision`."""

from __future__ import annotations

import contextlib
from typing import ContextManager, Literal

import torch

Precision = Literal["no", "bf16", "fp16"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: torch.device | str, setting: str) -> None:
    """ValueError naming `setting` (e.g. "--precision fp16") for a precision the device cannot run: an unknown
    name, or fp16 off a CUDA GPU (float16 runs on CUDA only, as training's grad scaler does)."""
    if precision != "no" and precision not in DTYPES:
        raise ValueError(f"{setting}: unknown precision; allowed: no, {', '.join(DTYPES)}")
    if precision == "fp16" and torch.device(device).type != "cuda":
        raise ValueError(f"{setting} needs a CUDA GPU (float16 mixed precision runs on GPUs only); "
                         "use bf16 or no here")


def autocast(precision: str, device: torch.device | str) -> ContextManager[None]:
    """`torch.autocast` of `precision` on `device`'s type; "no": nothing (float32)."""
    if precision == "no":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=DTYPES[precision])
