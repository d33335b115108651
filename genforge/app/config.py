"""The run config: `RunConfig` = a family's `model` section (a union over the registered families, discriminated
by `family`) + data + train + eval + log, validated as a whole; presets (each family's `presets/*.yaml`), user YAML
files and `--set key=value` overrides, all validated by the same pydantic models before any model or data is built.
"""

from __future__ import annotations

import copy
import typing
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, Field, SerializeAsAny, ValidationError, create_model, model_validator

import genforge.app.plugins  # noqa: F401  (fills the registries RunConfig is assembled from)
from genforge.app.migrations import SCHEMA_VERSION, migrate
from genforge.core.config import (MAX_EVAL_SAMPLES, MAX_GRID_SAMPLES, MAX_SAMPLES, ConfigError, DataConfig,
                                  EvalConfig, FamilyConfig, LogConfig, OnResume, PhaseConfig, StrictModel,
                                  TrainConfig)
from genforge.core.registry import DATA_SOURCES, FAMILIES, METRICS
from genforge.data.base import source_of
from genforge.eval.metrics import check_metrics

DEFAULT_PRESET = "unet-shapes"

__all__ = ["ConfigError", "DEFAULT_PRESET", "MAX_EVAL_SAMPLES", "MAX_GRID_SAMPLES", "MAX_SAMPLES", "RunConfig",
           "format_validation_error", "list_presets", "load_config", "parse_overrides", "preset_files", "to_yaml"]


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
        traits = FAMILIES.get(self.model.family).traits
        if self.train.sharding == "fsdp" and traits.no_sharding:
            raise ValueError(f"train.sharding=fsdp: model.family={self.model.family} {traits.no_sharding}; train it "
                             "with train.sharding=none (DDP)")
        if self.train.compile and traits.no_compile:
            raise ValueError(f"train.compile=true: model.family={self.model.family} {traits.no_compile}; train it "
                             "with train.compile=false")
        if self.train.sample_frames is not None and "frames" not in traits.sample_options.model_fields:
            raise ValueError(f"train.sample_frames: a {self.model.family} model does not make clips of a chosen "
                             "length (a video generator such as phenaki does)")
        if self.eval.metrics is None:
            self.eval.metrics = list(traits.metrics)
        if self.train.grad_clip is None:  # the family's (its seed trainer's), written into config.yaml as resolved
            self.train.grad_clip = traits.grad_clip
            phases = dict(self.train.phases)
            for phase, clip in traits.phase_grad_clip:
                settings = phases.get(phase) or PhaseConfig()
                if settings.grad_clip is None:
                    phases[phase] = settings.model_copy(update={"grad_clip": clip})
            self.train.phases = phases
        try:
            check_metrics(self.eval.metrics, traits.roles)
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
        self.model.check_eval(self.eval)
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


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config classes an annotation names, through Optional, unions, lists, dicts and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _tag(section: type[BaseModel]) -> Any:
    """The value a discriminated union knows `section` by: its `family` or `kind`."""
    field = section.model_fields.get("family") or section.model_fields.get("kind")
    return field.default if field is not None else None


def _walk(loc: tuple[Any, ...]) -> tuple[list[str], list[type[BaseModel]]]:
    """The parts of an error location that a config spells (the tags pydantic adds for a union's member left out),
    and the config classes the location may end in."""
    shown: list[str] = []
    sections: list[type[BaseModel]] = [run_config_type()]
    for part in loc:
        tagged = [section for section in sections if len(sections) > 1 and _tag(section) == part]
        if tagged:
            sections = tagged
        elif len(sections) == 1 and part in sections[0].model_fields:
            shown.append(str(part))
            sections = _models_in(sections[0].model_fields[part].annotation)
        else:  # a list index or a dict key: the same sections below it
            shown.append(str(part))
    return shown, sections


def format_validation_error(err: ValidationError) -> str:
    """One line per problem: `field: what is wrong (got value)`."""
    families = ", ".join(sorted(FAMILIES))
    lines = []
    for e in err.errors():
        shown, sections = _walk(tuple(e["loc"]))
        field = ".".join(shown) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            _, parents = _walk(tuple(e["loc"])[:-1])
            allowed = sorted(parents[0].model_fields) if len(parents) == 1 else None
            msg = "unknown key" + (f"; allowed keys here: {', '.join(allowed)}" if allowed else "")
        elif e["type"] == "missing" and shown == ["model"]:
            msg = f"required: a model section with `family` (one of {families})"
        elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            key = "family" if shown == ["model"] else "kind"
            value = e["input"].get(key) if isinstance(e["input"], dict) else None
            allowed = families if key == "family" else ", ".join(sorted(str(_tag(s)) for s in sections))
            lines.append(f"{field}.{key}: {value!r} is not a {key}; allowed: {allowed}")
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
    """A config mapping (e.g. a RunConfig's `model_dump(mode="json")`) + overrides -> a validated RunConfig.
    Overrides may be spelled in any schema (a command line outlives versions): unless they set `schema_version`,
    the merged mapping runs every migration step (each leaves today's spelling as it is)."""
    raw = parse_overrides(raw, overrides or [])
    if overrides and not any(item.partition("=")[0].strip() == "schema_version" for item in overrides):
        raw.pop("schema_version", None)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def to_yaml(config: RunConfig) -> str:
    """The resolved config as YAML, `schema_version` first (round-trips through load_config); the data section
    without the fields its source does not read (`DataSource.unread`: at their defaults)."""
    dump = config.model_dump(mode="json")
    unread = DATA_SOURCES.get(config.data.source).unread() if config.data.source in DATA_SOURCES else ()
    dump["data"] = {k: v for k, v in dump["data"].items() if k not in unread}
    return yaml.safe_dump(dump, sort_keys=False)
