"""genforge: train generative vision models. The Python API (genforge.app.api):

    run_dir = genforge.train("dit-debug", run_dir="runs/x")      # preset, YAML file or RunConfig -> run directory
    run = genforge.load_run(run_dir)                              # a Run: config, step, task, family
    images = run.sample(n=8, label=3, steps=25, seed=0)           # tensor [8, C, H, W] in [-1, 1] (output="pil")
    scores = run.evaluate(["judge"], n=64)                        # dict, as `genforge eval` computes it
    genforge.fid("real/", "samples/")["fid"]                      # folders or .npz statistics, as `genforge fid`

The names are imported from genforge.app.api on first use, so that `import genforge` (which every submodule's
import runs first) stays as light as the package's other entry points need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genforge.app.api import Run, fid, load_run, train

__all__ = ["Run", "fid", "load_run", "train"]


def __getattr__(name: str) -> Any:
    """`genforge.load_run`, `genforge.train`, `genforge.fid`, `genforge.Run`: from genforge.app.api, imported when
    first asked."""
    if name in __all__:
        return getattr(importlib.import_module("genforge.app.api"), name)
    raise AttributeError(f"module 'genforge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*(name for name in globals() if name.startswith("__")), *__all__])
