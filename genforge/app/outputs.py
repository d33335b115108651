"""What a command shows and writes, for the command line: progress (a bar on a terminal, plain step lines in a log),
status lines on stderr, sample grids and per-caption files (the preview writers, by suffix), evaluation results,
a cache's summary, and which process of a group writes them (rank 0)."""

from __future__ import annotations

from genforge.core.collectives import rank_and_world
from genforge.core.registry import PREVIEW_WRITERS
from genforge.core.status import console, status_on_stderr
from genforge.data.cache import MANIFEST, manifest_summary
from genforge.engine.logging import Progress, write_per_caption, write_samples
from genforge.eval.run import write_eval_results

__all__ = ["MANIFEST", "PREVIEW_WRITERS", "Progress", "console", "manifest_summary", "rank_and_world",
           "status_on_stderr", "write_eval_results", "write_per_caption", "write_samples"]
