"""Image folders: recursive, class from the first-level sub-folder, caption from a sidecar .txt; or, as Hugging Face's
`imagefolder` reads them (diffusers' `--train_data_dir`), caption and label from the rows of `metadata.jsonl` /
`metadata.csv` files."""

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

import torch
from torch.utils.data import Dataset

from genforge.core.config import DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import BadDataError, DataSource
from genforge.data.images import read_image

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


METADATA_NAMES = ("metadata.jsonl", "metadata.csv")  # Hugging Face imagefolder's metadata files
FILE_COLUMN = "file_name"  # the image a metadata row describes, relative to the metadata file's folder


def columns_error(path: Path | str, column: str, field_name: str, columns: list[str]) -> BadDataError:
    """The error for a table (a metadata file, a parquet file) without the column `field_name` names."""
    shown = ", ".join(repr(c) for c in columns) or "none"
    return BadDataError(f"{path} has no column {column!r} ({field_name}); its columns: {shown}")


def read_table(path: Path) -> tuple[list[str], list[dict[str, Any] | str]]:
    """The columns and rows of a metadata.jsonl (one JSON object a line; blank lines skipped) or metadata.csv (a
    header row). A jsonl line that is not a JSON object comes back as the reason it cannot be used."""
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
    """What the metadata files of a folder say: caption and raw label by image path, and the rows and images that
    cannot be used, as (key, reason) — a row's key is `<metadata file>@<row>` (rows from 0), an image's its path."""

    captions: dict[str, str] = field(default_factory=dict)
    labels: dict[str, Any] = field(default_factory=dict)
    described: set[str] = field(default_factory=set)  # the images a usable row names
    bad: dict[str, str] = field(default_factory=dict)


def read_metadata(root: Path, files: list[str], caption_column: str, label_column: str | None,
                  kind: str = "image") -> FolderMetadata | None:
    """The metadata.jsonl / metadata.csv files under `root` (any depth, as Hugging Face's imagefolder finds them),
    None when there are none. A row's `file_name` is relative to its metadata file's folder; its caption is column
    `caption_column` (a row or a file without one has no caption), its label column `label_column`. Rows naming a
    file that is not one of `files`, second rows for an image, rows without a label, and images no row names are
    unusable (`bad`); a metadata file without `file_name` or `label_column` is a BadDataError naming it."""
    tables = [f for f in scan_images(root, METADATA_NAMES) if posixpath.basename(f) in METADATA_NAMES]
    if not tables:
        return None
    folders = [posixpath.dirname(f) for f in tables]
    if len(set(folders)) < len(folders):
        twice = next(f for f in folders if folders.count(f) > 1)
        raise BadDataError(f"{root / twice}: both metadata.jsonl and metadata.csv; keep one")
    known, meta, first_row = set(files), FolderMetadata(), {}
    for table in tables:
        try:
            columns, rows = read_table(root / table)
        except (OSError, UnicodeDecodeError, csv.Error) as err:
            raise BadDataError(f"cannot read {root / table} ({type(err).__name__}: {err})") from None
        for column, field_name in ((FILE_COLUMN, "the image of each row"), (label_column, "data.label_column")):
            if column is not None and column not in columns:
                raise columns_error(root / table, column, field_name, columns)
        for index, row in enumerate(rows):
            key = f"{table}@{index}"
            name = row.get(FILE_COLUMN) if isinstance(row, dict) else None
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(table), name)) \
                if isinstance(name, str) and name else None
            if isinstance(row, str) or rel is None:
                meta.bad[key] = row if isinstance(row, str) else f"no {FILE_COLUMN}"
            elif rel.startswith("../") or posixpath.isabs(rel):
                meta.bad[key] = f"{FILE_COLUMN} {name!r} is outside {root}"
            elif rel in first_row:
                meta.bad[key] = f"a second row for {rel} (the first is {first_row[rel]})"
            elif rel not in known:
                missing = "does not exist" if not (root / rel).is_file() else f"is not an {kind} file"
                meta.bad[key] = f"{FILE_COLUMN} {name!r}: {rel} {missing}"
            elif label_column is not None and row.get(label_column) in (None, ""):
                meta.bad[key] = f"no {label_column} value"
            if rel is not None:
                first_row.setdefault(rel, key)
            if key in meta.bad:
                continue
            meta.described.add(rel)
            caption = row.get(caption_column)
            if caption not in (None, ""):
                meta.captions[rel] = (caption if isinstance(caption, str) else json.dumps(caption)).strip()
            if label_column is not None:
                meta.labels[rel] = row[label_column]
    meta.bad.update({f: f"its row {first_row[f]} cannot be used" if f in first_row else
                     f"no row in any {' / '.join(METADATA_NAMES)}" for f in files if f not in meta.described})
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


def readable_name(folder: str) -> str:
    """A class folder's name as words: separators to spaces, a leading number dropped when words follow."""
    words = folder.replace("_", " ").replace("-", " ").split()
    return " ".join(words[1:] if len(words) > 1 and words[0].isdigit() else words)


class ImageFolderDataset(Dataset):
    """Images under `root` (any depth), ADM-style resized and center-cropped to `image_size`.

    Labels come from the first-level sub-folders (sorted names -> 0..K-1, empty ones included, so a
    folder written by `write_shapes_folder` keeps the shapes labels); images directly in `root` are
    unlabelled. Captions come from a sidecar `<stem>.txt`. A folder with Hugging Face metadata files
    (`read_metadata`) takes each image's caption from its row (the sidecar only where the row has none) and, with
    `label_column`, its label (`label_indices`); its unusable rows and images without a row stay in the listing as
    unreadable samples, skipped and reported when met. A subclass reads other files (`extensions`, `field`,
    `load`): videos (genforge.data.video).
    """

    extensions: tuple[str, ...] = EXTENSIONS
    field = "image"  # the sample's key of the decoded tensor

    def __init__(self, root: str | Path, image_size: int, split: str = "train", val_fraction: float = 0.0,
                 flip: bool = False, seed: int = 0, max_image_pixels: int | None = None,
                 test_fraction: float = 0.0, caption_column: str = "text", label_column: str | None = None) -> None:
        if split not in ("train", "val", "test", "all"):
            raise ValueError(f"split={split!r}; allowed: train, val, test, all")
        if not 0.0 <= val_fraction <= 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be in [0, 1]")
        self.root, self.image_size, self.flip = Path(root), image_size, flip
        self.max_image_pixels = max_image_pixels
        searched = ", ".join(self.extensions)
        if not self.root.is_dir():
            raise FileNotFoundError(f"{self.field} folder {self.root} does not exist (looking for {searched} files)")
        files = scan_images(self.root, self.extensions)
        if not files:
            raise ValueError(f"{self.field} folder {self.root} holds no {self.field}s ({searched}, any depth)")
        metadata = read_metadata(self.root, files, caption_column, label_column, self.field)
        if label_column is not None and metadata is None:
            raise BadDataError(f"data.label_column={label_column!r} names a column of metadata.jsonl / metadata.csv, "
                               f"but {self.field} folder {self.root} has none")
        self.captions = metadata.captions if metadata else {}
        self.unusable = metadata.bad if metadata else {}  # key -> reason: skipped and reported when met
        in_root = [f for f in files if "/" not in f]
        if label_column is None and in_root and len(in_root) < len(files):
            raise ValueError(f"{self.root}: {self.field}s both in class sub-folders and directly in the folder "
                             f"({', '.join(in_root[:5])}{', ...' if len(in_root) > 5 else ''}); "
                             "move them into a sub-folder or remove them")
        self.class_names: list[str] = [] if in_root else sorted(
            e.name for e in os.scandir(self.root) if e.is_dir() and not e.name.startswith("."))
        self.num_classes = len(self.class_names)
        if label_column is not None:
            indices, self.class_names, self.num_classes = label_indices(metadata.labels, label_column)
        else:
            class_index = {name: i for i, name in enumerate(self.class_names)}
            indices = {f: class_index[f.split("/", 1)[0]] for f in files} if self.num_classes else None
        files = sorted(set(files) | set(self.unusable))
        if split != "all":
            files = [f for f in files if split_of(f, seed, val_fraction, test_fraction) == split]
            if not files:
                raise ValueError(f"{self.field} folder {self.root}: the {split!r} split is empty "
                                 f"(val_fraction={val_fraction}, seed={seed})")
        self.files = files
        self.labels = [indices.get(f) for f in files] if indices is not None else None

    def __len__(self) -> int:
        return len(self.files)

    def load(self, path: Path, aug_seed: int | None) -> dict[str, torch.Tensor]:
        """The sample fields of the file: {`field`: the file decoded, resized, cropped and (by `aug_seed`'s coin)
        flipped, [3, H, W] in [-1, 1]} (a subclass may add fields: a clip's frame mask)."""
        return {self.field: read_image(path, self.image_size, self.flip, aug_seed, self.max_image_pixels)}

    def __getitem__(self, item: int | tuple[int, int]) -> dict:
        index, aug_seed = item if isinstance(item, tuple) else (item, None)
        rel = self.files[index]
        if rel in self.unusable:  # a metadata row that names no image, an image without a row
            return {"key": rel, "bad": self.unusable[rel]}
        path = self.root / rel
        try:
            fields = self.load(path, aug_seed)
            caption_path = path.with_suffix(".txt")
            # a caption that is not UTF-8 keeps its image: undecodable bytes become U+FFFD
            caption = self.captions.get(rel) or (caption_path.read_bytes().decode("utf-8", errors="replace").strip()
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
    column_fields = ("caption_column", "label_column")

    def build(self, cfg: DataConfig, split: str, flip: bool, world_size: int | None) -> ImageFolderDataset:
        check_folder(cfg.path)
        return ImageFolderDataset(cfg.path, cfg.image_size, split=split, val_fraction=cfg.val_fraction, flip=flip,
                                  seed=cfg.split_seed, max_image_pixels=cfg.max_image_pixels,
                                  test_fraction=cfg.test_fraction, caption_column=cfg.caption_column,
                                  label_column=cfg.label_column)

    def class_names(self, cfg: DataConfig) -> list[str] | None:
        """The class sub-folders' (or metadata label names') as words: "_" and "-" become spaces and a leading
        number is dropped ("03_red_circle" -> "red circle"; "7" stays "7"); None for integer metadata labels."""
        folders = self.build(cfg, "all", False, None).class_names
        return [readable_name(name) for name in folders] or None

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        return {"path": str(Path(cfg.path).resolve()), "files": folder_listing(cfg.path)}


DATA_SOURCES.register("folder", FolderSource())
