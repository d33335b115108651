"""The run config: `RunConfig` = a family's `model` section (a union over the registered families, discriminated
by `family`) + data + train + eval + log, validated as a whole; presets (each family's `presets/*.yaml`), user YAML
files and `--set key=value` overrides, all validated by the same pydantic models before any model or data is built.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, Field, SerializeAsAny, ValidationError, create_model, model_validator

import genforge.app.plugins  # noqa: F401  (fills the registries RunConfig is assembled from)
from genforge.app.migrations import SCHEMA_VERSION, migrate
from genforge.core.config import (ConfigError, DataConfig, EvalConfig, FamilyConfig, LogConfig, OnResume,
                                  StrictModel, TrainConfig)
from genforge.core.registry import FAMILIES, METRICS
from genforge.data.base import source_of
from genforge.eval.metrics import check_metrics

DEFAULT_PRESET = "unet-shapes"

__all__ = ["ConfigError", "DEFAULT_PRESET", "RunConfig", "format_validation_error", "list_presets", "load_config",
           "parse_overrides", "preset_files", "to_yaml"]


class RunConfig(StrictModel):
    """A complete, validated training run. `RunConfig.model_validate` checks `model` against the families registered
    at the time (`run_config_type`)."""

    schema_version: int = Field(SCHEMA_VERSION, description="the config schema this mapping is written in; older "
                                                            "ones are migrated on load (genforge.app.migrations)")
    name: Annotated[str, OnResume.CHANGE] = Field(
        "run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="default run directory name")
    description: Annotated[str, OnResume.CHANGE] = ""
    model: SerializeAsAny[FamilyConfig]
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    log: LogConfig = LogConfig()

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> "RunConfig":
        if cls is RunConfig:  # the union of the families registered now
            return run_config_type().model_validate(obj, **kwargs)
        return super().model_validate(obj, **kwargs)

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, obj: Any) -> Any:
        """A mapping of an older schema (or none: version 0) in today's spelling (genforge.app.migrations)."""
        return migrate(obj) if isinstance(obj, dict) else obj

    @model_validator(mode="after")
    def _cross_checks(self) -> "RunConfig":
        source_of(self.data)  # a registered source (its own checks ran with the data section's)
        if self.train.sharding == "fsdp" and self.model.no_sharding:
            raise ValueError(f"train.sharding=fsdp: model.family={self.model.family} {self.model.no_sharding}; train it "
                             "with train.sharding=none (DDP)")
        if self.train.compile and self.model.no_compile:
            raise ValueError(f"train.compile=true: model.family={self.model.family} {self.model.no_compile}; train it "
                             "with train.compile=false")
        if self.train.sample_frames is not None and "frames" not in self.model.sample_options.model_fields:
            raise ValueError(f"train.sample_frames: a {self.model.family} model does not make clips of a chosen "
                             "length (a video generator such as phenaki does)")
        if self.eval.metrics is None:
            self.eval.metrics = list(self.model.default_metrics)
        try:
            check_metrics(self.eval.metrics, self.model.roles)
        except ValueError as err:
            raise ValueError(f"eval.metrics: {err} (model.family={self.model.family})") from None
        if self.train.keep_best is not None:
            if not self.eval.every:
                raise ValueError("train.keep_best needs evaluation during training: set eval.every > 0")
            metrics = [METRICS.get(m) for m in self.eval.metrics]
            known = {name for metric in metrics for name in metric.results}
            lower = {name for metric in metrics for name in metric.lower_is_better}
            if self.eval.val_loss_batches:
                known.add("val_loss")
                lower.add("val_loss")
            if self.train.keep_best not in known:
                raise ValueError(f"train.keep_best={self.train.keep_best!r} is not an evaluation result of "
                                 f"eval.metrics={self.eval.metrics} (val_loss: with eval.val_loss_batches > 0); "
                                 f"allowed: {', '.join(sorted(known))}")
            if self.train.keep_best in lower and self.train.keep_best_mode != "min":
                raise ValueError(f"train.keep_best={self.train.keep_best}: lower is better; set "
                                 "train.keep_best_mode=min")
        self.model.check_data(self.data)
        return self


_TYPES: dict[tuple[type[FamilyConfig], ...], type[RunConfig]] = {}


def family_configs() -> tuple[type[FamilyConfig], ...]:
    """The config classes of the registered families."""
    return tuple(spec.config for _, spec in FAMILIES.items())


def run_config_type() -> type[RunConfig]:
    """RunConfig with `model` typed as the union of the registered families' configs (made once per set)."""
    configs = family_configs()
    if configs not in _TYPES:
        union = Annotated[Union[configs], Field(discriminator="family")] if len(configs) > 1 else configs[0]
        _TYPES[configs] = create_model("RunConfig", __base__=RunConfig, model=(union, ...))
    return _TYPES[configs]


def preset_files() -> dict[str, Path]:
    """Preset name -> its YAML file, from every registered family's presets folder, sorted by name."""
    found: dict[str, Path] = {}
    for _, spec in FAMILIES.items():
        for path in sorted(spec.presets.glob("*.yaml")) if spec.presets and spec.presets.is_dir() else ():
            if path.stem in found:
                raise ValueError(f"preset {path.stem!r} is in both {found[path.stem]} and {path}")
            found[path.stem] = path
    return dict(sorted(found.items()))


def list_presets() -> dict[str, str]:
    """Preset name -> its one-line description."""
    return {name: (yaml.safe_load(path.read_text()) or {}).get("description", "")
            for name, path in preset_files().items()}


def _read_source(source: str | None) -> tuple[dict[str, Any], str]:
    """Raw dict and default run name from a preset name or a YAML path (None: the default preset)."""
    source = source or DEFAULT_PRESET
    path = Path(source)
    if source.endswith((".yaml", ".yml")) or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file {source!r} does not exist")
        text, name = path.read_text(), path.stem
    else:
        entry = preset_files().get(source)
        if entry is None:
            raise ConfigError(f"unknown preset {source!r}; presets: {', '.join(preset_files())}")
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
        node: Any = raw
        parts = key.strip().split(".")
        for i, part in enumerate(parts):
            if isinstance(node, list):  # an index into a list of sections, e.g. model.stages.1.unet.dim
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"--set {item!r}: {'.'.join(parts[:i])} is a list of {len(node)}; "
                                      f"{part!r} is not an index in 0..{len(node) - 1}")
                part = int(part)
            elif not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {parts[i - 1]!r} is a value, not a section")
            if i == len(parts) - 1:
                node[part] = value
            elif isinstance(node, dict):
                node = node.setdefault(part, {})
            else:
                node = node[part]
    return raw


def _allowed_keys(loc: tuple[Any, ...]) -> list[str] | None:
    """Field names of the config section at `loc` (the parent of an unknown key)."""
    model: type[BaseModel] | None = run_config_type()
    for part in loc:
        if model is None:
            return None
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:  # a discriminator tag in the location: pick that family's class
            model = FAMILIES.get(part).config if part in FAMILIES else None
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
    tags = set(FAMILIES)
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
    return config_from_dict(raw, overrides)


def config_from_dict(raw: dict[str, Any], overrides: list[str] | None = None) -> RunConfig:
    """A config mapping (e.g. a RunConfig's `model_dump(mode="json")`) + overrides -> a validated RunConfig."""
    raw = parse_overrides(raw, overrides or [])
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def to_yaml(config: RunConfig) -> str:
    """The resolved config as YAML (round-trips through load_config)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
