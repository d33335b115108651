"""Exporting a trained run to another library's format: what a family's exporter returns, and the error it raises
for what does not map.

A family declares its exporters by target name when it registers (`register_family(..., exporters={"diffusers":
"package.module:function"})`); the application layer loads the run (EMA weights by default) and calls the
exporter with the run's task, its model config and the output folder (genforge.app.export). The exporter writes
safetensors only and says, in `Exported.notes`, what did not map or differs numerically.
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
