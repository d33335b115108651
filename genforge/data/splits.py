"""Named splits as Hugging Face `datasets` infers them from a folder's files (datasets/data_files.py,
`_get_data_files_patterns`), tried in this order, the first rule that matches a file deciding for the whole folder:

1. the hub's sharded layout `data/<split>-NNNNN-of-NNNNN.<ext>`: any split name (`train`, `test`, `extra`, ...);
2. a split keyword as a folder name at any depth (`train/`, `val_2/`, `my-test/`): train, validation, test;
3. a split keyword in the file name (`train-0.parquet`, `test.png`, `x_val_1.jpg`): train, validation, test;
4. otherwise every file is in `train`.

The keywords: train = train, training; validation = validation, valid, dev, val; test = test, testing, eval,
evaluation; a keyword is delimited by one of `-._ ` or a digit (datasets' NON_WORDS_CHARS). Files that no split of
the matching rule takes are not in the data set (as in `datasets`); a file may be in two splits when both match.
"""

from __future__ import annotations

import posixpath
import re

SPLIT_KEYWORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "dev", "val"),
                  "test": ("test", "testing", "eval", "evaluation")}
HELDOUT_SPLITS = ("test", "validation")  # the held-out split of a data set with splits: test, else validation
DEFAULT_SPLIT = "train"
_SEP = "[-._ 0-9]"
_SHARDED = re.compile(r"data/(?P<split>[^/]+)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]*")
_SPLIT_NAME = re.compile(r"\w+(\.\w+)*")
_IN_DIR = {split: re.compile(rf"(.*{_SEP})?({'|'.join(words)})({_SEP}.*)?") for split, words in SPLIT_KEYWORDS.items()}
_IN_NAME = {split: re.compile(rf"(.*{_SEP})?({'|'.join(words)}){_SEP}.*") for split, words in SPLIT_KEYWORDS.items()}


def infer_splits(files: list[str]) -> dict[str, list[str]]:
    """The named splits of a folder whose files are `files` (relative posix paths), as `datasets` names them:
    {split: its files, in the order given}, train, validation, test first, other names sorted. A folder matching no
    rule is {"train": files}."""
    sharded: dict[str, list[str]] = {}
    for path in files:
        match = _SHARDED.fullmatch(path)
        if match and _SPLIT_NAME.fullmatch(match["split"]):
            sharded.setdefault(match["split"], []).append(path)
    if sharded:
        return _ordered(sharded)
    for rule in (_in_dir, _in_name):
        found = {split: [path for path in files if rule(path, split)] for split in SPLIT_KEYWORDS}
        found = {split: members for split, members in found.items() if members}
        if found:
            return found
    return {DEFAULT_SPLIT: list(files)}


def has_named_splits(splits: dict[str, list[str]], files: list[str]) -> bool:
    """Whether `infer_splits` found split names, rather than putting every file in train."""
    return list(splits) != [DEFAULT_SPLIT] or len(splits[DEFAULT_SPLIT]) != len(files)


def is_split_folder(name: str) -> bool:
    """Whether a folder called `name` names a split (rule 2)."""
    return any(pattern.fullmatch(name) for pattern in _IN_DIR.values())


def _in_dir(path: str, split: str) -> bool:
    return any(_IN_DIR[split].fullmatch(part) for part in path.split("/")[:-1])


def _in_name(path: str, split: str) -> bool:
    return _IN_NAME[split].fullmatch(posixpath.basename(path)) is not None


def _ordered(splits: dict[str, list[str]]) -> dict[str, list[str]]:
    known = [s for s in SPLIT_KEYWORDS if s in splits]
    return {s: splits[s] for s in known + sorted(set(splits) - set(known))}
