"""Loads every plug-in, so the registries of genforge.core.registry are complete before a config is validated or a
run is built: the built-in data sources, cache kinds and preview writers (genforge.data), the metrics
(genforge.eval.metrics), the families (every folder of genforge.families), and those of installed packages that
declare a `genforge.plugins` entry point (a module that registers what it brings when imported)."""

from __future__ import annotations

import functools
from importlib.metadata import entry_points

import genforge.data  # noqa: F401  (registers the data sources, cache kinds, preview writers)
import genforge.eval.metrics  # noqa: F401  (registers the metrics)
import genforge.families  # noqa: F401  (registers the families)

ENTRY_POINT_GROUP = "genforge.plugins"


@functools.cache
def load_entry_points() -> list[str]:
    """Import the modules of installed `genforge.plugins` entry points (once); returns their names."""
    loaded = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()
        loaded.append(entry.name)
    return loaded


load_entry_points()
