"""Mixed precision when a trained network only runs forward (`genforge sample`, `eval`, `encode`): the network runs
under `torch.autocast` of the chosen dtype, and what it returns is cast back to float32 by the caller before any
metric or file sees it. The names are those of `train.precision`."""

from __future__ import annotations

import contextlib
from typing import ContextManager, Literal

import torch

Precision = Literal["no", "bf16", "fp16"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def native_bf16() -> bool:
    """Whether this machine's training device runs bf16 matmuls and convolutions natively: a CUDA GPU with bf16, else
    a CPU with AVX-512-BF16 or AMX (oneDNN's check). Without, a CPU emulates bf16 far slower than float32."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_auto(precision: str) -> str:
    """`train.precision: auto`: bf16 where the device has it natively (`native_bf16`), else no (float32); any other
    value as it is."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16() else "no"


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
