"""Registries: how plug-ins (families, data sources, metrics, preview writers, cache kinds) make themselves known.

A plug-in registers itself when its module is imported, in the layer it belongs to; the layers above look it up by
name and never switch over the known ones. The registries live here, at the bottom, so that any layer can read
them; `genforge.app.plugins` imports every built-in plug-in (and the families' folders are discovered).
"""

from __future__ import annotations

from typing import Any, Generic, Iterator, TypeVar

from genforge.core.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> entry, in registration order. Registering a taken name is an error unless it is the same entry
    again (a module imported twice)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        if name in self._entries and self._entries[name] != entry:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def get(self, name: str, field: str | None = None) -> T:
        """The entry of `name`; a ConfigError naming `field` and the allowed names when there is none."""
        if name not in self._entries:
            where = f"{field}={name!r}" if field else f"{self.what} {name!r}"
            raise ConfigError(f"{where} is not a registered {self.what}; allowed: {', '.join(self._entries)}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def unregister(self, name: str) -> None:
        """Remove an entry (tests that register a plug-in of their own)."""
        self._entries.pop(name, None)


FAMILIES: Registry[Any] = Registry("family")  # name -> genforge.core.family.FamilySpec
DATA_SOURCES: Registry[Any] = Registry("data source")  # name -> genforge.data.base.DataSource
METRICS: Registry[Any] = Registry("metric")  # name -> genforge.eval.metrics.Metric
PREVIEW_WRITERS: Registry[Any] = Registry("preview writer")  # file suffix -> genforge.data.previews.PreviewWriter
CACHE_KINDS: Registry[Any] = Registry("cache kind")  # "latent", "tokens" -> genforge.data.cache.CacheKind
