"""Exporting a trained run to another library's format and importing weights from one: what a family's exporter
and importer return, and the error raised for what does not map.

A family declares its exporters by target name when it registers (`register_family(..., exporters={"diffusers":
"package.module:function"})`); the application layer loads the run (EMA weights by default) and calls the
exporter with the run's task, its model config and the output folder (genforge.app.export). The exporter writes
safetensors only and says, in `Exported.notes`, what did not map or differs numerically. An importer
(`importers={"dit-checkpoint": ...}`) reads a checkpoint file or model folder into an `Imported`: the `model`
section of a genforge config and the weights of the task's `ema_module()`; genforge.app.importer writes the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from genforge.core.config import FamilyConfig
from genforge.core.errors import ConfigError


class ExportError(ConfigError):
    """A run (family, backbone, objective, quantizer, ...) that does not map to the target format; the message
    names what and why (the CLI exits with code 2)."""


@dataclass
class Exported:
    """What an exporter wrote into its output folder: `folders` maps each folder it wrote (relative; "." the
    folder itself) to the class that loads it (e.g. {"transformer": "DiTTransformer2DModel"}); `notes` say what
    did not map and the known numerical differences; `details` are facts a user of the export needs (the null
    class, the run's sampling defaults)."""

    folders: dict[str, str]
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


# (the run's task, its model config, the output folder, empty and existing) -> what it wrote
Exporter = Callable[[Any, FamilyConfig, Path], Exported]


@dataclass
class Imported:
    """What an importer read: `model`, the model section of the run's config (family included); `weights`, the
    averaged module's weights (`Task.ema_module()`) under genforge's names; `codes`, "latent" when the model works
    on a codec's latents (the run then needs one), None for pixels; `input_size`, the side of its input (latents or
    pixels); `num_classes`; `notes`, what differs from the source."""

    model: dict[str, Any]
    weights: dict[str, Any]
    codes: str | None
    input_size: int
    num_classes: int
    notes: list[str] = field(default_factory=list)


# (a checkpoint file or model folder, options such as num_heads) -> what it holds
Importer = Callable[..., Imported]
