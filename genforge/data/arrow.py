"""Folders written by Hugging Face `datasets`' `save_to_disk` (`data.source: arrow`; a `folder` or `parquet` data.path
that holds one is read here too): Arrow IPC stream files (`data-00000-of-00001.arrow`, ...) listed in each folder's
state.json, beside dataset_info.json; a DatasetDict's dataset_dict.json names its splits, one folder each.

Read as parquet files are (genforge.data.parquet, the same columns, captions, labels and errors), with the files'
record batches as the units that slots stream, over processes × workers, with exact resume. Row r of file F is the
sample `F@r`, F named `<split>/<file>` in a DatasetDict, so the splits' files (which share their names) stay apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from genforge.core.config import DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import BadDataError
from genforge.data.folder import ADM_RESIZE, is_saved_dataset, readable_name
from genforge.data.parquet import ROWS_PER_READ, Columns, ParquetDataset, TableFiles, label_column
from genforge.data.shards import ShardsSource, listing
from genforge.data.splits import DEFAULT_SPLIT

DICT_FILE = "dataset_dict.json"  # a DatasetDict: {"splits": [...]}, a folder per split
STATE_FILE = "state.json"  # a Dataset: {"_data_files": [{"filename": ...}, ...], ...}


class ArrowFiles(TableFiles):
    """Arrow IPC stream files, as `datasets` writes them, read memory-mapped; a unit is a record batch."""

    kind = "Arrow"
    suffix = ".arrow"
    unit = "record batch"

    def schema(self, path: str) -> pa.Schema:
        with pa.memory_map(path) as source:
            return pa.ipc.open_stream(source).schema

    def unit_rows(self, path: str) -> list[int]:
        with pa.memory_map(path) as source:
            return [batch.num_rows for batch in pa.ipc.open_stream(source)]

    def batches(self, path: str, index: int, columns: list[str]) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(path) as source:
            for number, batch in enumerate(pa.ipc.open_stream(source)):  # memory-mapped: skipping copies nothing
                if number == index:
                    chosen = batch.select(columns)
                    for start in range(0, chosen.num_rows, ROWS_PER_READ):
                        yield chosen.slice(start, ROWS_PER_READ)
                    return

    def column(self, path: str, name: str) -> pa.ChunkedArray:
        with pa.memory_map(path) as source:
            return pa.ipc.open_stream(source).read_all().column(name)


ARROW = ArrowFiles()


def split_files(folder: Path) -> list[str]:
    """The Arrow files of one saved Dataset, in its state.json's order (BadDataError naming the file when it cannot
    be read)."""
    state = folder / STATE_FILE
    try:
        names = [entry["filename"] for entry in json.loads(state.read_text(encoding="utf-8"))["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BadDataError(f"{state}: not the state.json of a datasets save_to_disk folder ({type(err).__name__}: "
                           f"{err})") from None
    return [str(folder / name) for name in names]


def saved_splits(path: str) -> tuple[dict[str, list[str]], bool]:
    """The Arrow files of each split of a save_to_disk folder, and whether it names splits: a DatasetDict's (its
    dataset_dict.json), or a Dataset's files, all "train". FileNotFoundError / BadDataError naming data.path when it
    is not such a folder."""
    root = Path(path)
    if not is_saved_dataset(root):
        if not root.is_dir():
            raise FileNotFoundError(f"data.path: folder {path!r} does not exist")
        raise BadDataError(f"data.path={path!r} is not a folder written by datasets' save_to_disk (no {DICT_FILE}, "
                           f"no {STATE_FILE} + dataset_info.json)")
    if not (root / DICT_FILE).is_file():
        return {DEFAULT_SPLIT: split_files(root)}, False
    try:
        names = json.loads((root / DICT_FILE).read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BadDataError(f"{root / DICT_FILE}: cannot read its splits ({type(err).__name__}: {err})") from None
    return {str(name): split_files(root / str(name)) for name in names}, True


def arrow_files(spec: str) -> list[str]:
    """The Arrow files `spec` names: every split's of a save_to_disk folder, or `::`-joined files (one split's)."""
    if is_saved_dataset(spec):
        return [f for files in saved_splits(spec)[0].values() for f in files]
    return [part for part in spec.split("::") if part]


class ArrowDataset(ParquetDataset):
    """The rows of Arrow files of a save_to_disk folder, streamed by record batches (see ParquetDataset)."""

    tables = ARROW

    def files_of(self, spec: str) -> list[str]:
        return arrow_files(spec)

    def key_name(self, path: str) -> str:
        folder = Path(path).parent
        return f"{folder.name}/{Path(path).name}" if (folder.parent / DICT_FILE).is_file() else Path(path).name


class ArrowSource(ShardsSource):
    """`data.source: arrow`: a folder written by `datasets`' save_to_disk, streamed by record batches like parquet row
    groups; a DatasetDict's splits are named splits (data.split trains), each split into train / val / test shares
    by whole files."""

    name = "arrow"
    path_help = "a folder written by datasets' save_to_disk"
    resize = ADM_RESIZE
    reads = ("image_column", "caption_column", "label_column", "shuffle_buffer")
    named_splits = True

    def files(self, spec: str) -> list[str]:
        return arrow_files(spec)

    def named_files(self, cfg: DataConfig) -> tuple[dict[str, list[str]], bool]:
        return saved_splits(cfg.path)

    def dataset(self, spec: str, cfg: DataConfig, flip: bool, world_size: int | None) -> ArrowDataset:
        columns = Columns(cfg.image_column, cfg.caption_column, cfg.label_column)
        return ArrowDataset(spec, cfg.image_size, columns, label_files=self.files(cfg.path), flip=flip,
                            shuffle_buffer=cfg.shuffle_buffer, max_image_pixels=cfg.max_image_pixels,
                            world_size=world_size, num_workers=cfg.num_workers)

    def class_names(self, cfg: DataConfig) -> list[str] | None:
        """The ClassLabel names of the label column, as words, when the files record them."""
        names = label_column(self.files(cfg.path)[0], cfg.label_column, ARROW)[1]
        return [readable_name(name) for name in names] or None

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        return {"path": str(Path(cfg.path).resolve()), "files": listing(self.files(cfg.path))}


DATA_SOURCES.register("arrow", ArrowSource())
