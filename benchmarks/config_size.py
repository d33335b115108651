"""How much config a reader has to hold: the pydantic classes reachable from the run config of every registered
family, and their fields.

    python benchmarks/config_size.py            # totals
    python benchmarks/config_size.py --classes  # one line per class: its fields

A class is counted once however many sections use it; a field is one entry of a class's `model_fields`.
"""

from __future__ import annotations

import argparse
import typing
from typing import Any, Iterator

from pydantic import BaseModel

from genforge.app.config import run_config_type


def models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic classes an annotation names, through Optional, unions, lists, dicts and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from models_in(arg)


def reachable(root: type[BaseModel]) -> list[type[BaseModel]]:
    """Every pydantic class reachable from `root` through its fields, `root` first."""
    seen: dict[type[BaseModel], None] = {}
    todo = [root]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen[cls] = None
        todo.extend(model for field in cls.model_fields.values() for model in models_in(field.annotation))
    return list(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", action="store_true", help="list every class with its number of fields")
    args = parser.parse_args()
    classes = reachable(run_config_type())
    if args.classes:
        for cls in sorted(classes, key=lambda c: f"{c.__module__}.{c.__qualname__}"):
            print(f"{len(cls.model_fields):4d}  {cls.__module__}.{cls.__qualname__}")
    print(f"config classes: {len(classes)}  fields: {sum(len(cls.model_fields) for cls in classes)}")


if __name__ == "__main__":
    main()
