"""Data sets, loaders, caches and previews. Importing the package registers the built-in data sources (shapes,
image folders, webdataset shards, caches), the cache kinds and the preview writers."""

from genforge.data import cache, folder, previews, shapes, shards  # noqa: F401  (they register themselves)
