"""Image folders: recursive, class from the first-level sub-folder, caption from a sidecar .txt."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from genforge.core.config import DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import DataSource
from genforge.data.images import center_crop_resize, flip_drawn, load_rgb, to_tensor

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


def readable_name(folder: str) -> str:
    """A class folder's name as words: separators to spaces, a leading number dropped when words follow."""
    words = folder.replace("_", " ").replace("-", " ").split()
    return " ".join(words[1:] if len(words) > 1 and words[0].isdigit() else words)


class ImageFolderDataset(Dataset):
    """Images under `root` (any depth), ADM-style resized and center-cropped to `image_size`.

    Labels come from the first-level sub-folders (sorted names -> 0..K-1, empty ones included, so a
    folder written by `write_shapes_folder` keeps the shapes labels); images directly in `root` are
    unlabelled. Captions come from a sidecar `<stem>.txt`. A subclass reads other files (`extensions`, `field`,
    `load`): videos (genforge.data.video).
    """

    extensions: tuple[str, ...] = EXTENSIONS
    field = "image"  # the sample's key of the decoded tensor

    def __init__(self, root: str | Path, image_size: int, split: str = "train", val_fraction: float = 0.0,
                 flip: bool = False, seed: int = 0, max_image_pixels: int | None = None,
                 test_fraction: float = 0.0) -> None:
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
        in_root = [f for f in files if "/" not in f]
        if in_root and len(in_root) < len(files):
            raise ValueError(f"{self.root}: {self.field}s both in class sub-folders and directly in the folder "
                             f"({', '.join(in_root[:5])}{', ...' if len(in_root) > 5 else ''}); "
                             "move them into a sub-folder or remove them")
        self.class_names: list[str] = [] if in_root else sorted(
            e.name for e in os.scandir(self.root) if e.is_dir() and not e.name.startswith("."))
        self.num_classes = len(self.class_names)
        if split != "all":
            files = [f for f in files if split_of(f, seed, val_fraction, test_fraction) == split]
            if not files:
                raise ValueError(f"{self.field} folder {self.root}: the {split!r} split is empty "
                                 f"(val_fraction={val_fraction}, seed={seed})")
        self.files = files
        class_index = {name: i for i, name in enumerate(self.class_names)}
        self.labels = [class_index[f.split("/", 1)[0]] for f in files] if self.num_classes else None

    def __len__(self) -> int:
        return len(self.files)

    def load(self, path: Path, aug_seed: int | None) -> dict[str, torch.Tensor]:
        """The sample fields of the file: {`field`: the file decoded, resized, cropped and (by `aug_seed`'s coin)
        flipped, [3, H, W] in [-1, 1]} (a subclass may add fields: a clip's frame mask)."""
        image = np.asarray(center_crop_resize(load_rgb(path, self.max_image_pixels), self.image_size))
        if self.flip and flip_drawn(aug_seed):
            image = image[:, ::-1]
        return {self.field: to_tensor(image)}

    def __getitem__(self, item: int | tuple[int, int]) -> dict:
        index, aug_seed = item if isinstance(item, tuple) else (item, None)
        rel = self.files[index]
        path = self.root / rel
        try:
            fields = self.load(path, aug_seed)
            caption_path = path.with_suffix(".txt")
            # a caption that is not UTF-8 keeps its image: undecodable bytes become U+FFFD
            caption = caption_path.read_bytes().decode("utf-8", errors="replace").strip() \
                if caption_path.is_file() else None
        except Exception as err:  # any decoder or caption error: skip and report, never kill the worker
            return {"key": rel, "bad": f"{type(err).__name__}: {err}"}
        sample = {**fields, "key": rel}
        if self.labels is not None:
            sample["label"] = self.labels[index]
        if caption is not None:
            sample["text"] = caption
        return sample


def folder_listing(root: str | Path, extensions: tuple[str, ...] = EXTENSIONS) -> str:
    """sha256 of the names, sizes and mtimes of the files under `root` (a changed folder is new data)."""
    digest = hashlib.sha256()
    for name in scan_images(Path(root), extensions):
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

    def build(self, cfg: DataConfig, split: str, flip: bool, world_size: int | None) -> ImageFolderDataset:
        check_folder(cfg.path)
        return ImageFolderDataset(cfg.path, cfg.image_size, split=split, val_fraction=cfg.val_fraction, flip=flip,
                                  seed=cfg.split_seed, max_image_pixels=cfg.max_image_pixels,
                                  test_fraction=cfg.test_fraction)

    def class_names(self, cfg: DataConfig) -> list[str] | None:
        """The class sub-folders' names as words: "_" and "-" become spaces and a leading number is dropped
        ("03_red_circle" -> "red circle"; "7" stays "7")."""
        folders = self.build(cfg, "all", False, None).class_names
        return [readable_name(name) for name in folders] or None

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        return {"path": str(Path(cfg.path).resolve()), "files": folder_listing(cfg.path)}


DATA_SOURCES.register("folder", FolderSource())
