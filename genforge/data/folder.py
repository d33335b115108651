"""Image folders as Hugging Face's `imagefolder` reads them (`load_dataset("imagefolder", data_dir=...)`, diffusers'
`--train_data_dir`): named splits from split folders and file names, class from the immediate parent folder, caption
from a sidecar .txt; or caption and label from the rows of `metadata.jsonl` / `metadata.csv` / `metadata.parquet`
files, which are then the data set."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from genforge.core.config import DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import BadDataError, DataSource, draw_caption, split_members
from genforge.data.images import read_image
from genforge.data.splits import DEFAULT_SPLIT, has_named_splits, infer_splits, is_split_folder

ADM_RESIZE = ("ADM center crop: box-halve while the short side >= 2 x data.image_size, bicubic resize of the "
              "short side to data.image_size, center crop")

EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


def scan_images(root: Path, extensions: tuple[str, ...] = EXTENSIONS) -> list[str]:
    """Relative paths (forward slashes) of every file under `root` with one of `extensions` (images by default),
    hidden entries skipped, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel = Path(dirpath).relative_to(root)
        found += [(rel / f).as_posix() for f in filenames
                  if not f.startswith(".") and f.lower().endswith(extensions)]
    return sorted(found)


def split_of(relpath: str, seed: int, val_fraction: float, test_fraction: float = 0.0) -> str:
    """"train", "val" or "test" from a hash of the path alone: stable under additions and listing order."""
    digest = hashlib.sha1(f"{seed}:{relpath}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return "val" if u < val_fraction else "test" if u < val_fraction + test_fraction else "train"


METADATA_NAMES = ("metadata.jsonl", "metadata.csv", "metadata.parquet")  # Hugging Face imagefolder's metadata files
FILE_COLUMN = "file_name"  # the image a metadata row describes, relative to the metadata file's folder
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # a folder written by datasets' save_to_disk holds one


def is_saved_dataset(path: str | Path | None) -> bool:
    """Whether `path` is a folder written by `datasets`' `save_to_disk` (a Dataset: state.json + dataset_info.json
    beside its .arrow files; a DatasetDict: dataset_dict.json and a folder per split)."""
    root = Path(path) if path else None
    return root is not None and root.is_dir() and ((root / "dataset_dict.json").is_file() or (
        (root / "state.json").is_file() and (root / "dataset_info.json").is_file()))


def columns_error(path: Path | str, column: str, field_name: str, columns: list[str]) -> BadDataError:
    """The error for a table (a metadata file, a parquet file) without the column `field_name` names."""
    shown = ", ".join(repr(c) for c in columns) or "none"
    return BadDataError(f"{path} has no column {column!r} ({field_name}); its columns: {shown}")


def file_columns(image_column: str, field_name: str = "image") -> tuple[str, ...]:
    """The metadata columns that may name a row's file, as `datasets` maps them to its columns: `file_name` (or
    `<field>_file_name`) is the column `field_name` ("image"; a video folder's "video"), `<name>_file_name` the
    column <name>; the first one a table has is read."""
    base = field_name if image_column == "image" else image_column
    return (FILE_COLUMN, f"{base}_file_name") if base == field_name else (f"{base}_file_name",)


def read_table(path: Path) -> tuple[list[str], list[dict[str, Any] | str]]:
    """The columns and rows of a metadata.jsonl (one JSON object a line; blank lines skipped), metadata.csv (a header
    row) or metadata.parquet. A jsonl line that is not a JSON object comes back as the reason it cannot be used."""
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        return list(table.schema.names), table.to_pylist()
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))  # quoted fields may span lines
        return list(reader.fieldnames or []), list(reader)
    rows: list[dict[str, Any] | str] = []
    for line in filter(str.strip, text.splitlines()):
        try:
            row = json.loads(line)
        except ValueError as err:
            row = f"not JSON ({err})"
        rows.append(row if isinstance(row, (dict, str)) else f"a JSON {type(row).__name__}, not an object")
    return list(dict.fromkeys(c for row in rows if isinstance(row, dict) for c in row)), rows


@dataclass
class FolderMetadata:
    """What the metadata files of a split say: caption (a string or a list of them) and raw label by image path, and
    the rows that cannot be used, as (key, reason) — a row's key is `<metadata file>@<row>` (rows from 0)."""

    captions: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, Any] = field(default_factory=dict)
    described: set[str] = field(default_factory=set)  # the images a usable row names
    named: set[str] = field(default_factory=set)  # the images any row names, usable or not
    bad: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the samples in row order: an image, or an unusable row's key


def row_file(table: str, row: dict[str, Any] | str, column: str) -> tuple[str | None, str]:
    """The path (relative to the folder) of the file a row of the metadata file `table` names in `column`, or None
    and the reason it names none: as `datasets`, the name is relative to the metadata file's folder and may not
    leave it."""
    name = row.get(column) if isinstance(row, dict) else None
    if isinstance(row, str) or not isinstance(name, str) or not name:
        return None, row if isinstance(row, str) else f"no {column}"
    rel = posixpath.normpath(name)
    if "://" in name or posixpath.isabs(rel) or rel == ".." or rel.startswith("../"):
        return None, f"{column} {name!r} is outside its metadata file's folder"
    return posixpath.normpath(posixpath.join(posixpath.dirname(table), rel)), ""


def read_metadata(root: Path, tables: list[str], files: list[str], columns: tuple[str, ...], caption_column: str,
                  label_column: str | None, kind: str = "image") -> FolderMetadata:
    """The rows of the metadata files `tables` (paths under `root`, any depth, as Hugging Face's imagefolder finds
    them). A row's file is the first of `columns` the file has (`file_columns`), relative to its metadata file's
    folder; its caption is column `caption_column` (a row or a file without one has no caption), its label column
    `label_column`. Rows naming a file that is not one of `files`, second rows for an image and rows without a label
    are unusable (`bad`); a metadata file without a file column or `label_column` is a BadDataError naming it."""
    folders = [posixpath.dirname(f) for f in tables]
    if len(set(folders)) < len(folders):
        twice = next(f for f in folders if folders.count(f) > 1)
        raise BadDataError(f"{root / twice}: more than one of {' / '.join(METADATA_NAMES)}; keep one")
    known, meta, first_row = set(files), FolderMetadata(), {}
    for table in tables:
        try:
            names, rows = read_table(root / table)
        except (OSError, UnicodeDecodeError, csv.Error, pa.ArrowException) as err:
            raise BadDataError(f"cannot read {root / table} ({type(err).__name__}: {err})") from None
        file_column = next((c for c in columns if c in names), None)
        if file_column is None:
            raise columns_error(root / table, columns[0], f"the {kind} of each row" if columns[0] == FILE_COLUMN
                                else "data.image_column", names)
        if label_column is not None and label_column not in names:
            raise columns_error(root / table, label_column, "data.label_column", names)
        for index, row in enumerate(rows):
            key = f"{table}@{index}"
            rel, why = row_file(table, row, file_column)
            if rel is None:
                meta.bad[key] = why
            elif rel in first_row:
                meta.bad[key] = f"a second row for {rel} (the first is {first_row[rel]})"
            elif rel not in known:
                missing = "does not exist" if not (root / rel).is_file() else f"is not an {kind} file"
                meta.bad[key] = f"{file_column} {row[file_column]!r}: {rel} {missing}"
            elif label_column is not None and row.get(label_column) in (None, ""):
                meta.bad[key] = f"no {label_column} value"
            if rel is not None:
                first_row.setdefault(rel, key)
                meta.named.add(rel)
            if key in meta.bad:
                meta.order.append(key)
                continue
            meta.order.append(rel)
            meta.described.add(rel)
            caption = row.get(caption_column)
            if caption not in (None, "", []):
                meta.captions[rel] = caption if isinstance(caption, (str, list)) else json.dumps(caption)
            if label_column is not None:
                meta.labels[rel] = row[label_column]
    return meta


def label_indices(values: dict[str, Any], column: str) -> tuple[dict[str, int], list[str], int]:
    """Metadata labels as class indices: integers (or strings of digits, as CSV holds them) are the indices
    themselves; otherwise the distinct values, sorted by name, are classes 0..K-1. Returns the indices by image,
    the class names ([] for integer labels) and the number of classes."""
    if all(isinstance(v, int) and not isinstance(v, bool) or isinstance(v, str) and v.isdigit()
           for v in values.values()):
        indices = {rel: int(v) for rel, v in values.items()}
        return indices, [], max(indices.values(), default=-1) + 1
    names = sorted({str(v) for v in values.values()})
    if any(isinstance(v, (dict, list)) for v in values.values()):
        raise BadDataError(f"metadata column {column!r} (data.label_column) holds lists or objects; a label is an "
                           "integer or a class name")
    index = {name: i for i, name in enumerate(names)}
    return {rel: index[str(v)] for rel, v in values.items()}, names, len(names)


def folder_labels(root: Path, files: list[str]) -> dict[str, str] | None:
    """Class names by file as `datasets` infers them without metadata: the immediate parent folder, when every file
    sits at one depth, there are two or more such folders and none is a split folder (`train/x.png`); else None."""
    parents = {f: posixpath.basename(posixpath.dirname(f)) for f in files}
    names = set(parents.values())
    if len(names) < 2 or len({f.count("/") for f in files}) != 1 or any(map(is_split_folder, names)):
        return None
    return parents


def empty_class_folders(root: Path, files: list[str], classes: set[str]) -> set[str]:
    """The folders beside the class folders that hold no images: classes too (a class with no images yet; `genforge
    data shapes` writes every class folder), which `datasets` would leave out."""
    grand = {posixpath.dirname(posixpath.dirname(f)) for f in files}
    return {e.name for g in grand for e in os.scandir(root / g)
            if e.is_dir() and not e.name.startswith(".") and e.name not in classes}


def folder_splits(root: Path, extensions: tuple[str, ...]) -> tuple[list[str], list[str], dict[str, list[str]], bool]:
    """The files (`extensions`) and metadata files under `root`, their named splits (`infer_splits`) and whether
    the folder names any."""
    files = scan_images(root, extensions)
    tables = [f for f in scan_images(root, METADATA_NAMES) if posixpath.basename(f) in METADATA_NAMES]
    listing = sorted(files + tables)
    splits = infer_splits(listing)
    return files, tables, splits, has_named_splits(splits, listing)


def readable_name(folder: str) -> str:
    """A class folder's name as words: separators to spaces, a leading number dropped when words follow."""
    words = folder.replace("_", " ").replace("-", " ").split()
    return " ".join(words[1:] if len(words) > 1 and words[0].isdigit() else words)


class ImageFolderDataset(Dataset):
    """Images under `root` (any depth), ADM-style resized and center-cropped to `image_size`, read as Hugging Face's
    `imagefolder` reads a folder (`load_dataset("imagefolder", data_dir=root)`).

    Splits: split folders and files named by split (`infer_splits`) are named splits; `data_split` (data.split) is
    the one that trains ("train", "val", "test": its shares by `val_fraction` / `test_fraction`), and a named split
    is read whole (`split_members`). Without metadata files, labels come from the immediate parent folders
    (`folder_labels`: every image at one depth, two or more folders; sorted names -> 0..K-1, empty sibling folders
    included, so a folder written by `write_shapes_folder` keeps the shapes labels), and captions from a sidecar
    `<stem>.txt`. With metadata files (`read_metadata`), the split's rows are the data set: each image's caption comes
    from its row (a list of captions: one drawn per sample by its aug_seed; the sidecar only where the row has
    none) and, with `label_column`, its label (`label_indices`); no label is taken from folders; images no row names
    are left out (counted in `left_out`), and unusable rows stay in the listing as unreadable samples, skipped and
    reported when met. A subclass reads other files (`extensions`, `field`, `load`): videos (genforge.data.video).
    """

    extensions: tuple[str, ...] = EXTENSIONS
    field = "image"  # the sample's key of the decoded tensor

    def __init__(self, root: str | Path, image_size: int, split: str = "train", val_fraction: float = 0.0,
                 flip: bool = False, seed: int = 0, max_image_pixels: int | None = None,
                 test_fraction: float = 0.0, caption_column: str = "text", label_column: str | None = None,
                 image_column: str = "image", data_split: str = DEFAULT_SPLIT) -> None:
        if not 0.0 <= val_fraction <= 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be in [0, 1]")
        self.root, self.image_size, self.flip = Path(root), image_size, flip
        self.max_image_pixels = max_image_pixels
        searched = ", ".join(self.extensions)
        if not self.root.is_dir():
            raise FileNotFoundError(f"{self.field} folder {self.root} does not exist (looking for {searched} files)")
        files, tables, splits, _ = folder_splits(self.root, self.extensions)
        if not files:
            raise ValueError(f"{self.field} folder {self.root} holds no {self.field}s ({searched}, any depth)")
        members, share = split_members(splits, data_split, split, f"{self.field} folder {self.root}")
        member_set = set(members)
        split_files = [f for f in files if f in member_set]
        split_tables = [f for f in tables if f in member_set]
        in_splits = {f for ms in splits.values() for f in ms}
        self.outside = [f for f in files if f not in in_splits]  # in no split: not read, as in `datasets`
        self.left_out: list[str] = []  # images of the split that no metadata row names
        self.captions: dict[str, Any] = {}
        self.unusable: dict[str, str] = {}  # key -> reason: skipped and reported when met
        indices: dict[str, int] | None = None
        self.class_names: list[str] = []
        if any(f in in_splits for f in tables):  # metadata: its rows are the data set, no labels from folders
            meta = read_metadata(self.root, split_tables, files, file_columns(image_column, self.field),
                                 caption_column, label_column, self.field)
            self.captions, self.unusable = meta.captions, meta.bad
            self.left_out = [f for f in split_files if f not in meta.named]
            listed = meta.order  # as `datasets` lists them: metadata files by path, rows in order
            if label_column is not None:
                indices, self.class_names, self.num_classes = label_indices(meta.labels, label_column)
        else:
            if label_column is not None:
                raise BadDataError(f"data.label_column={label_column!r} names a column of metadata.jsonl / .csv / "
                                   f".parquet, but {self.field} folder {self.root} has none")
            listed = split_files
            parents = folder_labels(self.root, [f for f in files if f in in_splits])
            if parents is not None:
                names = set(parents.values())
                self.class_names = sorted(names | empty_class_folders(self.root, list(parents), names))
                index = {name: i for i, name in enumerate(self.class_names)}
                indices = {f: index[name] for f, name in parents.items()}
        if label_column is None:
            self.num_classes = len(self.class_names)
        if share != "all":
            listed = [f for f in listed if split_of(f, seed, val_fraction, test_fraction) == share]
        if not listed:
            raise ValueError(f"{self.field} folder {self.root}: the {split!r} split is empty (data.split="
                             f"{data_split!r}, val_fraction={val_fraction}, seed={seed})")
        self.files = listed
        self.labels = [indices.get(f) for f in listed] if indices is not None else None

    def __len__(self) -> int:
        return len(self.files)

    def notes(self) -> list[str]:
        """The images this data set does not read, as `datasets` does not: those no metadata row names, and those
        in no split of a folder with named splits."""
        said = []
        for files, what in ((self.left_out, "no metadata row names"), (self.outside, "are in no split")):
            if files:
                shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
                said.append(f"left out {len(files)} {self.field}(s) of {self.root} that {what} ({shown}), as "
                            "Hugging Face datasets does")
        return said

    def load(self, path: Path, aug_seed: int | None) -> dict[str, torch.Tensor]:
        """The sample fields of the file: {`field`: the file decoded, resized, cropped and (by `aug_seed`'s coin)
        flipped, [3, H, W] in [-1, 1]} (a subclass may add fields: a clip's frame mask)."""
        return {self.field: read_image(path, self.image_size, self.flip, aug_seed, self.max_image_pixels)}

    def __getitem__(self, item: int | tuple[int, int]) -> dict:
        index, aug_seed = item if isinstance(item, tuple) else (item, None)
        rel = self.files[index]
        if rel in self.unusable:  # a metadata row that names no image
            return {"key": rel, "bad": self.unusable[rel]}
        path = self.root / rel
        try:
            fields = self.load(path, aug_seed)
            caption_path = path.with_suffix(".txt")
            # a caption that is not UTF-8 keeps its image: undecodable bytes become U+FFFD
            caption = draw_caption(self.captions.get(rel), aug_seed) or (
                caption_path.read_bytes().decode("utf-8", errors="replace").strip()
                if caption_path.is_file() else None)
        except Exception as err:  # any decoder or caption error: skip and report, never kill the worker
            return {"key": rel, "bad": f"{type(err).__name__}: {err}"}
        sample = {**fields, "key": rel}
        if self.labels is not None and self.labels[index] is not None:
            sample["label"] = self.labels[index]
        if caption is not None:
            sample["text"] = caption
        return sample


def folder_listing(root: str | Path, extensions: tuple[str, ...] = EXTENSIONS) -> str:
    """sha256 of the names, sizes and mtimes of the files under `root` and of its metadata files (a changed folder
    is new data)."""
    digest = hashlib.sha256()
    for name in scan_images(Path(root), extensions + METADATA_NAMES):
        stat = (Path(root) / name).stat()
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def check_folder(path: str) -> None:
    """data.path must be a folder: ValueError when it is a file (an archive, a single image), FileNotFoundError
    when it does not exist."""
    if Path(path).is_file():
        raise ValueError(f"data.path={path!r} is a file; it must be a folder (of class sub-folders, or of the files "
                         "themselves)")
    if not Path(path).is_dir():
        raise FileNotFoundError(f"data.path: folder {path!r} does not exist")


class FolderSource(DataSource):
    """`data.source: folder`: an image folder, split into train/val by a hash of each path (data.val_fraction)."""

    name = "folder"
    path_help = "an image folder"
    resize = ADM_RESIZE
    reads = ("image_column", "caption_column", "label_column")
    named_splits = True
    extensions = EXTENSIONS

    def resolved(self, cfg: DataConfig) -> DataSource:
        """A folder written by `datasets`' save_to_disk is read by data.source=arrow."""
        return DATA_SOURCES.get("arrow") if self.field == "image" and is_saved_dataset(cfg.path) else self

    def build(self, cfg: DataConfig, split: str, flip: bool, world_size: int | None) -> ImageFolderDataset:
        check_folder(cfg.path)
        return ImageFolderDataset(cfg.path, cfg.image_size, split=split, val_fraction=cfg.val_fraction, flip=flip,
                                  seed=cfg.split_seed, max_image_pixels=cfg.max_image_pixels,
                                  test_fraction=cfg.test_fraction, caption_column=cfg.caption_column,
                                  label_column=cfg.label_column, image_column=cfg.image_column, data_split=cfg.split)

    def split_names(self, cfg: DataConfig) -> list[str]:
        """The folder's named splits ([] for none, and for a folder not there: building it says so)."""
        if not Path(cfg.path).is_dir():
            return []
        splits, named = folder_splits(Path(cfg.path), self.extensions)[2:]
        return list(splits) if named else []

    def notes(self, dataset: ImageFolderDataset) -> list[str]:
        return dataset.notes()

    def class_names(self, cfg: DataConfig) -> list[str] | None:
        """The class sub-folders' (or metadata label names') as words: "_" and "-" become spaces and a leading
        number is dropped ("03_red_circle" -> "red circle"; "7" stays "7"); None for integer metadata labels."""
        folders = self.build(cfg, "all", False, None).class_names
        return [readable_name(name) for name in folders] or None

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        return {"path": str(Path(cfg.path).resolve()), "files": folder_listing(cfg.path)}


DATA_SOURCES.register("folder", FolderSource())
