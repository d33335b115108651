"""How much config a reader has to hold: the pydantic classes reachable from the run config of every registered
family, their fields, and the fields written out in the source.

    PYTHONPATH=. python benchmarks/config_size.py            # totals (this checkout's genforge)
    PYTHONPATH=. python benchmarks/config_size.py --classes  # one line per class: fields, declared

A class is counted once however many sections use it; its fields are the entries of its `model_fields`, and the
declared ones those its own class body writes (not inherited, not generated, e.g. the all-optional copy of the
optimizer settings a phase takes).
"""

from __future__ import annotations

import argparse
import sys
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


def written(classes: list[type[BaseModel]]) -> list[type[BaseModel]]:
    """The classes a reader reads for `classes`: each with its config base classes, those a module defines by
    name (not generated with create_model)."""
    found = {base: None for cls in classes for base in cls.__mro__
             if isinstance(base, type) and issubclass(base, BaseModel) and base is not BaseModel}
    return [cls for cls in found if getattr(sys.modules[cls.__module__], cls.__qualname__, None) is cls]


def declared(cls: type[BaseModel]) -> int:
    """The fields the class body of `cls` writes itself."""
    return sum(name in cls.model_fields for name in vars(cls).get("__annotations__", {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", action="store_true", help="list every class: its fields, those it declares")
    args = parser.parse_args()
    sections = reachable(run_config_type())
    source = written(sections)
    if args.classes:
        for cls in sorted(set(sections) | set(source), key=lambda c: f"{c.__module__}.{c.__qualname__}"):
            fields = len(cls.model_fields) if cls in sections else "-"
            print(f"{fields:>4} {declared(cls) if cls in source else '-':>4}  {cls.__module__}.{cls.__qualname__}")
    print(f"sections: {len(sections)} classes, {sum(len(cls.model_fields) for cls in sections)} fields; as written: "
          f"{len(source)} classes, {sum(declared(cls) for cls in source)} fields declared")


if __name__ == "__main__":
    main()
