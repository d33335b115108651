"""File I/O every layer uses: atomic writes, fsync, content hashes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

TMP_PREFIX = ".tmp-"  # temporary names: a reader never lists them, start-up removes what a kill left

def cache_root(cache_dir: str | Path | None = None) -> Path:
    """genforge's cache folder (judge, reference statistics): `cache_dir`, else $GENFORGE_CACHE, else
    ~/.cache/genforge."""
    return Path(cache_dir or os.environ.get("GENFORGE_CACHE", "~/.cache/genforge")).expanduser()


_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in chunks; remembered per (path, size, mtime) for the rest of the process."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        with open(path, "rb") as f:
            _HASHES[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _HASHES[key]


def files_sha256(paths: list[Path]) -> str:
    """One sha256 over several files: their names and contents' sha256, in the order given."""
    return hashlib.sha256("".join(f"{p.name}:{file_sha256(p)}\n" for p in paths).encode()).hexdigest()


def folder_sha256(folder: Path) -> str:
    """One sha256 over every file under `folder` but hidden ones: their paths relative to it and their contents'
    sha256, in sorted order (what a model folder is, e.g. a diffusers `save_pretrained` folder)."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    return hashlib.sha256("".join(f"{p.relative_to(folder).as_posix()}:{file_sha256(p)}\n"
                                  for p in files).encode()).hexdigest()


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under `root` (before renaming it into place)."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for path in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        fsync_dir(path)


def fsync_dir(path: Path) -> None:
    """fsync a folder, so the renames inside it are on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to a temporary name, fsync, and rename onto `path`: readers see the old or the new file."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
