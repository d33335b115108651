"""Parquet files (`data.source: parquet`): a Hugging Face dataset written with `ds.to_parquet(...)` or downloaded as its
hub's parquet files, read with pyarrow and streamed like webdataset shards; and the machinery Arrow files of a
`save_to_disk` folder share (genforge.data.arrow): a `TableFiles` says how one kind of table file is read.

Columns, by name (`data.image_column`, `data.caption_column`, `data.label_column`): the image as `datasets` stores an
`Image` feature, a struct {bytes, path} (the bytes of the encoded file; where they are null, the file at `path`,
relative to the parquet file), or plain binary; the caption a string, or a list of strings (one drawn per sample by
its seed); a file without the column has no captions; the label an integer (a `ClassLabel`; its names, kept in the
file's `huggingface` schema metadata, name the classes; without them the class count is the largest label + 1;
without data.label_column, the one ClassLabel column that metadata records is the label).
A file without the image or label column, or with a column of another type, is bad input naming the column and the
columns the file has.

`data.path`: local files, globs (`data/train-*.parquet`), brace patterns (`train-{00000..00003}.parquet`) or folders
(their `*.parquet` at any depth), several joined by `::`. Named splits as `datasets` infers them
(genforge.data.splits): in a folder, from the files' paths under it (`data/train-00000-of-00001.parquet`,
`test/x.parquet`, `validation-0.parquet`), of other files from their names; `data.split` trains. The stream's units
are the files' row groups, read in batches: with R processes and W workers, slot `rank·W + worker` reads row groups i
with i % (R·W) == slot, in a seeded order each epoch, through the seeded shuffle buffer, and resumes exactly, all as
`ShardDataset` streams shards. Train / val / test shares of a split by whole files (`split_shards`). Row r of file F
is the sample `F@r`: one that cannot be decoded is skipped and reported under that key; a file or row group that
cannot be read counts as one unreadable record keyed by the row where reading stopped.
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
import pyarrow.compute as pc
import pyarrow.parquet as pq

from genforge.core.config import DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import BadDataError, DataSource, draw_caption
from genforge.data.folder import columns_error, is_saved_dataset, readable_name
from genforge.data.images import read_image
from genforge.data.shards import Record, ShardDataset, ShardsSource, absolute_spec, expand_spec, listing, local_path
from genforge.data.splits import has_named_splits, infer_splits

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
        if self.caption in names and not is_captions(schema.field(self.caption).type):
            raise BadDataError(f"{path}: column {self.caption!r} (data.caption_column) is "
                               f"{schema.field(self.caption).type}; a caption column holds strings or lists of "
                               "strings")

    def present(self, schema: pa.Schema) -> list[str]:
        """The columns to read from a file of `schema` (the caption only where the file has it)."""
        wanted = [self.image, self.caption, self.label]
        return [c for c in dict.fromkeys(wanted) if c is not None and c in schema.names]


def is_binary(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def is_captions(kind: pa.DataType) -> bool:
    """A caption column: strings, or lists of strings (several captions an image)."""
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    return is_text(kind) or listed and is_text(kind.value_type)


class TableFiles:
    """How one kind of table file is read: parquet files by row groups (this class), Arrow IPC streams by record
    batches (genforge.data.arrow). Each method raises what pyarrow raises for a file it cannot read."""

    kind = "parquet"
    suffix = ".parquet"
    unit = "row group"

    def schema(self, path: str) -> pa.Schema:
        """The file's Arrow schema (with its `huggingface` metadata)."""
        return pq.read_schema(path)

    def unit_rows(self, path: str) -> list[int]:
        """The rows of each of the file's units, in order."""
        with pq.ParquetFile(path) as parquet:
            return [parquet.metadata.row_group(i).num_rows for i in range(parquet.metadata.num_row_groups)]

    def batches(self, path: str, index: int, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """Unit `index` of the file, `columns` only, in batches of at most ROWS_PER_READ rows."""
        with pq.ParquetFile(path) as parquet:
            yield from parquet.iter_batches(batch_size=ROWS_PER_READ, row_groups=[index], columns=columns)

    def column(self, path: str, name: str) -> pa.ChunkedArray:
        """One whole column of the file."""
        return pq.read_table(path, columns=[name]).column(name)


PARQUET = TableFiles()


@dataclass(frozen=True)
class RowGroup:
    """A unit of the stream: row group `index` of `path`, rows first_row .. first_row + rows - 1 of the file; or a
    file whose footer cannot be read (`error`), which reads as one unreadable record."""

    path: str
    index: int
    first_row: int
    rows: int
    error: str | None = None
    name: str = ""  # the file as sample keys name it (its file name; a save_to_disk split's: <split>/<file>)
    unit: str = "row group"

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", Path(self.path).name)

    def __str__(self) -> str:
        return f"{self.path} ({self.unit} {self.index})"


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
            found = folder_tables(path)
        else:
            found = [str(path)] if path.is_file() else []
        if not found:
            raise FileNotFoundError(f"data.path={spec!r}: {path} {'matches' if glob.has_magic(str(path)) else 'is'} "
                                    f"no parquet file" + (" (a folder without *.parquet)" if path.is_dir() else ""))
        files += found
    if not files:
        raise ValueError(f"data.path={spec!r} names no parquet files")
    return files


def folder_tables(folder: Path, suffix: str = ".parquet") -> list[str]:
    """The files of `suffix` under `folder`, any depth, hidden entries skipped, sorted."""
    return sorted(str(p) for p in folder.rglob(f"*{suffix}") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def parquet_splits(spec: str) -> tuple[dict[str, list[str]], bool]:
    """The parquet files of each named split of `spec` (genforge.data.splits, as `datasets` infers them: in a folder
    from the paths under it, of a file or glob from its file name), in the spec's order, and whether any is named.
    Files no split takes in a data set with named splits are not read (as in `datasets`)."""
    splits: dict[str, list[str]] = {}
    named = False
    for part in spec.split("::"):
        path = local_path(part)
        folder = path if path is not None and not glob.has_magic(str(path)) and path.is_dir() else None
        files = parquet_files(part)
        names = {(Path(f).relative_to(folder).as_posix() if folder else Path(f).name): f for f in files}
        found = infer_splits(list(names))
        named = named or has_named_splits(found, list(names))
        for split, members in found.items():
            splits.setdefault(split, []).extend(names[m] for m in members)
    return splits, named


def row_groups(path: str, columns: Columns, tables: TableFiles = PARQUET, name: str = "") -> list[RowGroup]:
    """The non-empty units (row groups, record batches) of a table file, its schema checked (`Columns.check`); a file
    that cannot be opened is one RowGroup with its `error`. `name`: the file as sample keys name it."""
    try:
        schema, sizes = tables.schema(path), tables.unit_rows(path)
    except Exception as err:  # not parquet, truncated, unreadable: reported when the stream reaches it
        return [RowGroup(path, 0, 0, 0, error=f"{type(err).__name__}: {err}", name=name, unit=tables.unit)]
    columns.check(path, schema)
    groups, first = [], 0
    for index, rows in enumerate(sizes):
        if rows:
            groups.append(RowGroup(path, index, first, rows, name=name, unit=tables.unit))
        first += rows
    return groups


def class_labels(path: str, tables: TableFiles = PARQUET) -> dict[str, list[str]]:
    """The ClassLabel columns of a table file written by `datasets` and their class names, from its `huggingface`
    schema metadata ({} when it records none, or cannot be read)."""
    try:
        metadata = tables.schema(path).metadata or {}
        features = json.loads(metadata[b"huggingface"])["info"]["features"]
        return {column: [str(name) for name in feature["names"]] for column, feature in features.items()
                if isinstance(feature, dict) and feature.get("_type") == "ClassLabel"
                and isinstance(feature.get("names"), list)}
    except (KeyError, TypeError, ValueError, AttributeError, OSError, pa.ArrowException):
        return {}


def label_column(path: str, column: str | None, tables: TableFiles = PARQUET) -> tuple[str | None, list[str]]:
    """The label column of a table data set whose first file is `path` and its class names ([] when the file does
    not record them): `column` (data.label_column), else the file's one ClassLabel column, else none."""
    labels = class_labels(path, tables)
    if column is None and len(labels) == 1:
        column = next(iter(labels))
    return column, labels.get(column, []) if column is not None else []


def label_count(files: list[str], column: str, tables: TableFiles = PARQUET) -> int:
    """The classes of an integer label column without ClassLabel names: its largest value + 1 over `files` (every
    split of the data set), files that cannot be read or lack the column left to the stream to report."""
    largest = -1
    for path in files:
        try:
            value = pc.max(tables.column(path, column)).as_py()
        except Exception:  # an unreadable file or a column of another type: the stream reports it
            continue
        largest = max(largest, value if isinstance(value, int) else -1)
    return largest + 1


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
    """The rows of the table files `spec` names, streamed by units (parquet row groups; `tables`), which `ShardDataset`
    streams as shards. A sample: `image` [3, S, S] in [-1, 1] (ADM resize and centre crop, flipped by the per-sample
    coin), `text` (one of a list of captions, drawn by the per-sample seed), `label`, `key` "<file>@<row>".
    `label_files`: the files whose label column counts the classes when no ClassLabel names them (every split)."""

    tables: TableFiles = PARQUET

    def __init__(self, spec: str, image_size: int, columns: Columns, label_files: list[str] | None = None,
                 **kwargs: Any) -> None:
        self.unit = self.tables.unit
        label, self.class_names = label_column(self.files_of(spec)[0], columns.label, self.tables)
        self.columns = replace(columns, label=label)  # before the units are listed: each file's schema is checked
        super().__init__(spec, image_size, **kwargs)
        self.num_classes = len(self.class_names)
        if label is not None and not self.class_names:  # a plain integer column: the classes the data holds
            self.num_classes = label_count(label_files or self.files_of(spec), label, self.tables)

    def files_of(self, spec: str) -> list[str]:
        """The table files `spec` names."""
        return parquet_files(spec)

    def key_name(self, path: str) -> str:
        """The file as the keys of its rows name it."""
        return Path(path).name

    def units(self, spec: str) -> list[RowGroup]:
        groups = [group for path in self.files_of(spec)
                  for group in row_groups(path, self.columns, self.tables, self.key_name(path))]
        if not groups:
            raise BadDataError(f"data.path={spec!r}: the {self.tables.kind} files hold no rows")
        return groups

    def what(self) -> str:
        return f"a set of {self.tables.kind} files with images"

    def read(self, group: RowGroup) -> Iterator[Record]:
        """The rows of one unit as records {"__key__": "<file>@<row>", column: value}; a unit that cannot be read ends
        with one marker record {"__key__", "__bad__"} keyed by the row where reading stopped."""
        row = group.first_row
        if group.error is not None:
            yield {"__key__": f"{group.name}@{row}", "__bad__": f"cannot open {group.path}: {group.error}"}
            return
        try:
            wanted = self.columns.present(self.tables.schema(group.path))
            for batch in self.tables.batches(group.path, group.index, wanted):
                values = {column: batch.column(column).to_pylist() for column in wanted}
                for i in range(batch.num_rows):
                    yield {"__key__": f"{group.name}@{row}", **{c: v[i] for c, v in values.items()}}
                    row += 1
        except Exception as err:  # a torn or corrupt unit: the rest of it is one unreadable record
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
            caption = draw_caption(record.get(self.columns.caption), aug_seed)
            if caption is not None:
                sample["text"] = caption
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
    named splits as `datasets` infers them (data.split trains), each split into train / val / test shares by whole
    files. A folder written by `save_to_disk` is read by data.source=arrow."""

    name = "parquet"
    path_help = "parquet files: a path, glob or brace pattern, e.g. data/train-*.parquet"
    reads = ("image_column", "caption_column", "label_column", "shuffle_buffer")
    named_splits = True

    def resolved(self, cfg: DataConfig) -> DataSource:
        return DATA_SOURCES.get("arrow") if is_saved_dataset(cfg.path) else self

    def files(self, spec: str) -> list[str]:
        return parquet_files(spec)

    def named_files(self, cfg: DataConfig) -> tuple[dict[str, list[str]], bool]:
        return parquet_splits(cfg.path)

    def dataset(self, spec: str, cfg: DataConfig, flip: bool, world_size: int | None) -> ParquetDataset:
        columns = Columns(cfg.image_column, cfg.caption_column, cfg.label_column)
        return ParquetDataset(spec, cfg.image_size, columns, label_files=self.files(cfg.path), flip=flip,
                              shuffle_buffer=cfg.shuffle_buffer, max_image_pixels=cfg.max_image_pixels,
                              world_size=world_size, num_workers=cfg.num_workers)

    def class_names(self, cfg: DataConfig) -> list[str] | None:
        """The ClassLabel names of the label column, as words, when the files record them."""
        names = label_column(parquet_files(cfg.path)[0], cfg.label_column)[1]
        return [readable_name(name) for name in names] or None

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        return {"path": absolute_spec(cfg.path), "files": listing(parquet_files(cfg.path))}


DATA_SOURCES.register("parquet", ParquetSource())
