"""Data sets, loaders, caches and previews. Importing the package registers the built-in data sources (shapes,
image folders, webdataset shards, parquet files, save_to_disk folders, caches, video folders, moving shapes), the
cache kinds and the preview writers."""

from genforge.data import arrow, cache, folder, moving_shapes, parquet, previews, shapes, shards, video  # noqa: F401  (registries)
