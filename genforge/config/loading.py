"""Typed configs: presets shipped as YAML, user YAML files and `--set key=value` overrides, all validated
by the same pydantic models before any model or data is built."""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from genforge.config.run import RunConfig



DEFAULT_PRESET = "dit-shapes"


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field, the value and what is allowed."""


def _preset_dir():
    return resources.files("genforge.config") / "presets"


def list_presets() -> dict[str, str]:
    """Preset name -> its one-line description."""
    presets = {}
    for entry in sorted(_preset_dir().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            raw = yaml.safe_load(entry.read_text()) or {}
            presets[entry.name[: -len(".yaml")]] = raw.get("description", "")
    return presets


def _read_source(source: str | None) -> tuple[dict[str, Any], str]:
    """Raw dict and default run name from a preset name or a YAML path (None: the default preset)."""
    source = source or DEFAULT_PRESET
    path = Path(source)
    if source.endswith((".yaml", ".yml")) or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file {source!r} does not exist")
        text, name = path.read_text(), path.stem
    else:
        entry = _preset_dir() / f"{source}.yaml"
        if not entry.is_file():
            raise ConfigError(f"unknown preset {source!r}; presets: {', '.join(list_presets())}")
        text, name = entry.read_text(), source
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(raw).__name__}")
    raw.setdefault("name", name)
    return raw, name


def parse_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (values parsed as YAML scalars/lists) to a copy of `raw`."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set train.lr=3e-4")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return raw


def _allowed_keys(loc: tuple[Any, ...]) -> list[str] | None:
    """Field names of the config section at `loc` (the parent of an unknown key)."""
    model: type[BaseModel] | None = RunConfig
    for part in loc:
        if model is None:
            return None
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:  # a discriminator tag in the location: pick that family's class
            from genforge.families import FAMILY_CONFIGS

            tagged = [c for c in FAMILY_CONFIGS if c.model_fields["family"].default == part]
            model = tagged[0] if tagged else None
            continue
        annotation = field.annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if model is None:
            for arg in getattr(annotation, "__args__", ()):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    model = arg
    return sorted(model.model_fields) if model else None


def format_validation_error(err: ValidationError) -> str:
    """One line per problem: `field: what is wrong (got value)`."""
    from genforge.families import FAMILY_CONFIGS

    tags = {c.model_fields["family"].default for c in FAMILY_CONFIGS}
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        shown = [str(p) for i, p in enumerate(loc) if not (i == 1 and loc[0] == "model" and p in tags)]
        field = ".".join(shown) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            msg = "unknown key" + (f"; allowed keys here: {', '.join(allowed)}" if allowed else "")
        elif e["type"] == "missing" and loc == ("model",):
            msg = f"required: a model section with `family` (one of {', '.join(sorted(tags))})"
        elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            family = e["input"].get("family") if isinstance(e["input"], dict) else None
            lines.append(f"{field}.family: {family!r} is not a family; allowed: {', '.join(sorted(tags))}")
            continue
        line = f"{field}: {msg}" if field != "config" else msg
        if e["type"] not in ("missing", "extra_forbidden", "value_error") and "input" in e:
            line += f" (got {e['input']!r})"
        elif e["type"] == "extra_forbidden":
            line += f" (got {field.split('.')[-1]}={e['input']!r})"
        lines.append(line)
    return "invalid config:\n  " + "\n  ".join(lines)


def load_config(source: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Preset name or YAML path (None: the default preset) + overrides -> a validated RunConfig."""
    raw, _ = _read_source(source)
    raw = parse_overrides(raw, overrides or [])
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def to_yaml(config: RunConfig) -> str:
    """The resolved config as YAML (round-trips through load_config)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
