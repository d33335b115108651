"""Parquet files (`data.source: parquet`): a Hugging Face dataset written with `ds.to_parquet(...)` or downloaded as its
hub's parquet files, read with pyarrow and streamed like webdataset shards.

Columns, by name (`data.image_column`, `data.caption_column`, `data.label_column`): the image as `datasets` stores an
`Image` feature, a struct {bytes, path} (the bytes of the encoded file; where they are null, the file at `path`,
relative to the parquet file), or plain binary; the caption a string (a file without the column has no captions);
the label an integer (a `ClassLabel`; its names, kept in the file's `huggingface` schema metadata, name the classes;
without data.label_column, the one ClassLabel column that metadata records is the label).
A file without the image or label column, or with a column of another type, is bad input naming the column and the
columns the file has.

`data.path`: local files, globs (`data/train-*.parquet`), brace patterns (`train-{00000..00003}.parquet`) or folders
(their `*.parquet`), several joined by `::`. The stream's units are the files' row groups, read in batches: with R
processes and W workers, slot `rank·W + worker` reads row groups i with i % (R·W) == slot, in a seeded order each
epoch, through the seeded shuffle buffer, and resumes exactly, all as `ShardDataset` streams shards. Train / val /
test split by whole files (`split_shards`). Row r of file F is the sample `F@r`: one that cannot be decoded is
skipped and reported under that key; a file or row group that cannot be read counts as one unreadable record keyed
by the row where reading stopped.
"""

from __future__ import annotations

import glob
import io
import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from genforge.core.config import DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import BadDataError
from genforge.data.folder import columns_error, readable_name
from genforge.data.images import read_image
from genforge.data.shards import Record, ShardDataset, ShardsSource, absolute_spec, expand_spec, listing, local_path

ROWS_PER_READ = 64  # rows decoded from parquet at a time: a row group of a whole file is never held at once


@dataclass(frozen=True)
class Columns:
    """The columns a parquet data set is read from (data.image_column, data.caption_column, data.label_column)."""

    image: str
    caption: str
    label: str | None = None

    def check(self, path: str, schema: pa.Schema) -> None:
        """BadDataError naming the column and the file's columns when the image or label column is missing or of a
        type genforge cannot read."""
        names = list(schema.names)
        for column, field_name in ((self.image, "data.image_column"), (self.label, "data.label_column")):
            if column is not None and column not in names:
                raise columns_error(path, column, field_name, names)
        kind = schema.field(self.image).type
        if not (is_binary(kind) or pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0
                and is_binary(kind.field("bytes").type)):
            raise BadDataError(f"{path}: column {self.image!r} (data.image_column) is {kind}; an image column is a "
                               "struct {bytes, path} (a Hugging Face Image) or binary")
        if self.label is not None and not pa.types.is_integer(schema.field(self.label).type):
            raise BadDataError(f"{path}: column {self.label!r} (data.label_column) is {schema.field(self.label).type}"
                               "; a label column holds integers (a Hugging Face ClassLabel)")
        if self.caption in names and not is_text(schema.field(self.caption).type):
            raise BadDataError(f"{path}: column {self.caption!r} (data.caption_column) is "
                               f"{schema.field(self.caption).type}; a caption column holds strings")

    def present(self, schema: pa.Schema) -> list[str]:
        """The columns to read from a file of `schema` (the caption only where the file has it)."""
        wanted = [self.image, self.caption, self.label]
        return [c for c in dict.fromkeys(wanted) if c is not None and c in schema.names]


def is_binary(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


@dataclass(frozen=True)
class RowGroup:
    """A unit of the stream: row group `index` of `path`, rows first_row .. first_row + rows - 1 of the file; or a
    file whose footer cannot be read (`error`), which reads as one unreadable record."""

    path: str
    index: int
    first_row: int
    rows: int
    error: str | None = None

    @property
    def name(self) -> str:
        return Path(self.path).name

    def __str__(self) -> str:
        return f"{self.path} (row group {self.index})"


def parquet_files(spec: str) -> list[str]:
    """The local parquet files `spec` names: `::`-separated parts, each brace-expanded, then a glob (sorted), a folder
    (its *.parquet, sorted) or a file. FileNotFoundError naming a part that names nothing; ValueError for a URL."""
    files: list[str] = []
    for part in expand_spec(spec):
        path = local_path(part)
        if path is None:
            raise ValueError(f"data.path={spec!r}: {part!r} is not a local path; data.source=parquet reads local "
                             "files (copy remote parquet files first)")
        if glob.has_magic(str(path)):
            found = sorted(p for p in glob.glob(str(path)) if Path(p).is_file())
        elif path.is_dir():
            found = sorted(str(p) for p in path.glob("*.parquet") if p.is_file())
        else:
            found = [str(path)] if path.is_file() else []
        if not found:
            raise FileNotFoundError(f"data.path={spec!r}: {path} {'matches' if glob.has_magic(str(path)) else 'is'} "
                                    f"no parquet file" + (" (a folder without *.parquet)" if path.is_dir() else ""))
        files += found
    if not files:
        raise ValueError(f"data.path={spec!r} names no parquet files")
    return files


def row_groups(path: str, columns: Columns) -> list[RowGroup]:
    """The non-empty row groups of a parquet file, its schema checked (`Columns.check`); a file whose footer cannot
    be read is one RowGroup with its `error`."""
    try:
        with pq.ParquetFile(path) as parquet:
            schema, meta = parquet.schema_arrow, parquet.metadata
    except Exception as err:  # not parquet, truncated, unreadable: reported when the stream reaches it
        return [RowGroup(path, 0, 0, 0, error=f"{type(err).__name__}: {err}")]
    columns.check(path, schema)
    groups, first = [], 0
    for index in range(meta.num_row_groups):
        rows = meta.row_group(index).num_rows
        if rows:
            groups.append(RowGroup(path, index, first, rows))
        first += rows
    return groups


def class_labels(path: str) -> dict[str, list[str]]:
    """The ClassLabel columns of a parquet file written by `datasets` and their class names, from its `huggingface`
    schema metadata ({} when it records none, or cannot be read)."""
    try:
        metadata = pq.read_schema(path).metadata or {}
        features = json.loads(metadata[b"huggingface"])["info"]["features"]
        return {column: [str(name) for name in feature["names"]] for column, feature in features.items()
                if isinstance(feature, dict) and feature.get("_type") == "ClassLabel"
                and isinstance(feature.get("names"), list)}
    except (KeyError, TypeError, ValueError, AttributeError, OSError, pa.ArrowException):
        return {}


def label_column(path: str, column: str | None) -> tuple[str | None, list[str]]:
    """The label column of a parquet data set whose first file is `path` and its class names ([] when the file does
    not record them): `column` (data.label_column), else the file's one ClassLabel column, else none."""
    labels = class_labels(path)
    if column is None and len(labels) == 1:
        column = next(iter(labels))
    return column, labels.get(column, []) if column is not None else []


def image_bytes(value: Any, parquet_path: str) -> bytes:
    """The encoded image of an image cell: binary, or a Hugging Face Image struct {bytes, path} (the file at `path`,
    relative to the parquet file's folder, where the bytes are null). ValueError for a null cell."""
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return value["bytes"]
        if value.get("path"):
            return (Path(parquet_path).parent / value["path"]).read_bytes()
        raise ValueError("an image struct with neither bytes nor path")
    if value is None:
        raise ValueError("no image (null)")
    return value


HF_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # how `datasets` stores an Image feature


def write_parquet(out: str | Path, prefix: str, rows: Iterable[tuple[bytes, str, int]], class_names: list[str],
                  rows_per_file: int = 1000, row_group_size: int = 100) -> tuple[str, int]:
    """Write (PNG bytes, caption, label) rows as `datasets` writes a data set of features image (Image), text and
    label (ClassLabel of `class_names`, recorded in the `huggingface` schema metadata): files
    `out/<prefix>-NNNNNN.parquet` of `rows_per_file` rows in row groups of `row_group_size` (datasets' own size
    for image sets). Returns the glob naming them (a data.path of data.source=parquet) and the number of files."""
    features = {"image": {"_type": "Image"}, "text": {"dtype": "string", "_type": "Value"},
                "label": {"names": class_names, "_type": "ClassLabel"}}
    schema = pa.schema([("image", HF_IMAGE), ("text", pa.string()), ("label", pa.int64())],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    rows, count = iter(rows), 0
    while chunk := list(itertools.islice(rows, rows_per_file)):
        images, captions, labels = zip(*chunk)
        table = pa.table([pa.array([{"bytes": b, "path": None} for b in images], HF_IMAGE),
                          pa.array(captions, pa.string()), pa.array(labels, pa.int64())], schema=schema)
        pq.write_table(table, root / f"{prefix}-{count:06d}.parquet", row_group_size=row_group_size)
        count += 1
    return str(root / f"{prefix}-*.parquet"), count


class ParquetDataset(ShardDataset):
    """The rows of the parquet files `spec` names, streamed by row groups (the units `ShardDataset` streams). A
    sample: `image` [3, S, S] in [-1, 1] (ADM resize and centre crop, flipped by the per-sample coin), `text`,
    `label`, `key` "<file>@<row>"."""

    unit = "row group"

    def __init__(self, spec: str, image_size: int, columns: Columns, **kwargs: Any) -> None:
        label, self.class_names = label_column(parquet_files(spec)[0], columns.label)
        self.columns = replace(columns, label=label)  # before the units are listed: each file's schema is checked
        super().__init__(spec, image_size, **kwargs)
        self.num_classes = len(self.class_names)

    def units(self, spec: str) -> list[RowGroup]:
        groups = [group for path in parquet_files(spec) for group in row_groups(path, self.columns)]
        if not groups:
            raise BadDataError(f"data.path={spec!r}: the parquet files hold no rows")
        return groups

    def what(self) -> str:
        return "a set of parquet files with images"

    def read(self, group: RowGroup) -> Iterator[Record]:
        """The rows of one row group as records {"__key__": "<file>@<row>", column: value}; a group that cannot be
        read ends with one marker record {"__key__", "__bad__"} keyed by the row where reading stopped."""
        row = group.first_row
        if group.error is not None:
            yield {"__key__": f"{group.name}@{row}", "__bad__": f"cannot open {group.path}: {group.error}"}
            return
        try:
            with pq.ParquetFile(group.path) as parquet:
                wanted = self.columns.present(parquet.schema_arrow)
                for batch in parquet.iter_batches(batch_size=ROWS_PER_READ, row_groups=[group.index], columns=wanted):
                    values = {column: batch.column(column).to_pylist() for column in wanted}
                    for i in range(batch.num_rows):
                        yield {"__key__": f"{group.name}@{row}", **{c: v[i] for c, v in values.items()}}
                        row += 1
        except Exception as err:  # a torn or corrupt row group: the rest of it is one unreadable record
            reason = f"{type(err).__name__}: {err}"
            yield {"__key__": f"{group.name}@{row}", "__bad__": f"unreadable from row {row} of {group} on ({reason})"}

    def decode(self, group: RowGroup, record: Record, aug_seed: int | None) -> dict[str, Any]:
        key = record["__key__"]
        if "__bad__" in record:
            return {"key": key, "bad": record["__bad__"]}
        try:
            data = image_bytes(record[self.columns.image], group.path)
            sample: dict[str, Any] = {"key": key, "image": read_image(io.BytesIO(data), self.image_size, self.flip,
                                                                      aug_seed, self.max_image_pixels)}
            caption = record.get(self.columns.caption)
            if caption is not None:
                sample["text"] = caption.strip()
            if self.columns.label is not None:
                label = record[self.columns.label]
                if label is None or label < 0:  # a ClassLabel's -1: no label
                    raise ValueError(f"no label in column {self.columns.label!r} ({label})")
                sample["label"] = int(label)
        except Exception as err:  # any decoder error: skip and report, never kill the worker
            return {"key": key, "bad": f"{type(err).__name__}: {err}"}
        return sample


class ParquetSource(ShardsSource):
    """`data.source: parquet`: parquet files of images (a Hugging Face dataset), streamed by row groups like shards;
    split into train / val / test by whole files."""

    name = "parquet"
    path_help = "parquet files: a path, glob or brace pattern, e.g. data/train-*.parquet"
    column_fields = ("image_column", "caption_column", "label_column")

    def files(self, spec: str) -> list[str]:
        return parquet_files(spec)

    def dataset(self, spec: str, cfg: DataConfig, flip: bool, world_size: int | None) -> ParquetDataset:
        columns = Columns(cfg.image_column, cfg.caption_column, cfg.label_column)
        return ParquetDataset(spec, cfg.image_size, columns, flip=flip, shuffle_buffer=cfg.shuffle_buffer,
                              max_image_pixels=cfg.max_image_pixels, world_size=world_size,
                              num_workers=cfg.num_workers)

    def class_names(self, cfg: DataConfig) -> list[str] | None:
        """The ClassLabel names of the label column, as words, when the files record them."""
        names = label_column(parquet_files(cfg.path)[0], cfg.label_column)[1]
        return [readable_name(name) for name in names] or None

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        return {"path": absolute_spec(cfg.path), "files": listing(parquet_files(cfg.path))}


DATA_SOURCES.register("parquet", ParquetSource())
