"""The package's imports run one way, down the layers of docs/architecture.md: every import (module level or inside a
function; `if TYPE_CHECKING:` blocks aside, they never run) goes to a lower layer or stays inside its own package,
no family imports another, the engine never imports a family, and there is no import cycle."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import genforge

ROOT = Path(genforge.__file__).parent
# lowest first; packages on one line are peers and must not import each other
LAYERS = [
    ("genforge.core",),
    ("genforge.nn",),
    ("genforge.diffusion", "genforge.text"),
    ("genforge.data",),
    ("genforge.sampling",),  # drawing samples: `genforge sample`, the API and evaluation
    ("genforge.eval",),
    ("genforge.tokenizers",),  # what the tokenizer families share; the stand-in codecs
    ("genforge.masked",),  # what the masked-token generators share
    ("genforge.families",),
    ("genforge.engine",),
    ("genforge.app",),
    ("genforge.cli",),
    ("genforge.__main__",),
]
FORBIDDEN = {("genforge.engine", "genforge.families"), ("genforge.engine", "genforge.tokenizers"),
             ("genforge.engine", "genforge.masked")}


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """(imported genforge module, line, inside a function) for every import statement of a module."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for n in ast.walk(node)}
    inner = {id(n) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(node) if n is not node}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("genforge"):
                found.append((target, node.lineno, id(node) in inner))
    return found


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the package that is its unit: a family's folder, or the layer's package)."""
    if module == "genforge":
        return -1, "genforge"
    for index, packages in enumerate(LAYERS):
        for package in packages:
            if module == package or module.startswith(package + "."):
                if package == "genforge.families" and module != package:
                    return index, ".".join(module.split(".")[:3])  # each family is its own unit
                return index, package
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: place it")


def violations() -> tuple[list[str], list[str], dict[str, set[str]]]:
    known = modules()
    wrong, inner, graph = [], [], {name: set() for name in known}
    for name, path in known.items():
        level, unit = layer_of(name)
        for target, line, in_function in imports(name, path, known):
            graph[name].add(target)
            where = f"{path.relative_to(ROOT.parent)}:{line} imports {target}"
            if in_function:
                inner.append(where)
            target_level, target_unit = layer_of(target)
            upward = target_level > level or (target_level == level and target_unit != unit)
            if upward or any(name.startswith(a) and target.startswith(b) for a, b in FORBIDDEN):
                wrong.append(where)
    return wrong, inner, graph


def test_every_import_runs_down_the_layers():
    wrong, _, _ = violations()
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_no_genforge_import_hides_in_a_function():
    _, inner, _ = violations()
    assert not inner, "imports of genforge placed inside functions:\n" + "\n".join(inner)


def test_the_cli_talks_to_the_application_layer_only():
    """The command line parses, validates and calls the application layer (genforge.app), never a lower layer, so a
    change below the application layer does not reach the CLI."""
    known = modules()
    below = [f"{known[name].relative_to(ROOT.parent)}:{line} imports {target}" for name in known
             if name.startswith("genforge.cli") for target, line, _ in imports(name, known[name], known)
             if not target.startswith(("genforge.app", "genforge.cli"))]
    assert not below, "the CLI imports below the application layer:\n" + "\n".join(below)


def test_no_import_cycle():
    _, _, graph = violations()
    graphlib.TopologicalSorter(graph).static_order()  # raises CycleError naming the members


def test_the_checker_catches_what_it_should(tmp_path):
    """The rules on made-up edges: down is fine, up or sideways is not."""
    assert layer_of("genforge.families.diffusion.task") == (8, "genforge.families.diffusion")
    assert layer_of("genforge.eval.run")[0] < layer_of("genforge.engine.trainer")[0]
    for source, target in [("genforge.core.task", "genforge.data.loader"), ("genforge.text.base", "genforge.diffusion"),
                           ("genforge.families.diffusion.task", "genforge.families.maskgit.masking")]:
        (level, unit), (target_level, target_unit) = layer_of(source), layer_of(target)
        assert target_level > level or (target_level == level and target_unit != unit)
