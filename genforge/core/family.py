"""How a family plugs in: its spec (config class, task builder, presets folder, exporters), what its builder is
handed (`BuildContext`), and `register_family`, which a family's package calls when it is imported."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from genforge.core.config import DataConfig, FamilyConfig
from genforge.core.errors import ConfigError
from genforge.core.export import Exporter, Importer
from genforge.core.registry import FAMILIES
from genforge.core.task import FamilyTraits, HeldOut, Task, resolve_named


@dataclass(frozen=True)
class BuildContext:
    """What a family's builder gets besides its config: the run's data section, what the data set says about
    itself (a genforge.data.base.DataInfo), the frozen codecs of its input runs by config field
    (`FamilyConfig.input_runs`), each as (codec module, core.codec.CodecInfo), the run's held-out data (previews,
    reconstructions, default prompts) and the data section of the pixels behind the run's data (itself, or for a
    cache the section it was encoded from), and the run's I3D file (eval.i3d_weights, which metric fvd reads too), for
    a loss on I3D features. The application layer resolves all of it; a family never reads data."""

    data: DataConfig
    info: Any
    codecs: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    heldout: HeldOut | None = None
    pixel_data: DataConfig | None = None
    i3d_weights: str | None = None

    @property
    def pixels(self) -> DataConfig:
        """`pixel_data`, else the run's data section."""
        return self.pixel_data or self.data


@dataclass(frozen=True)
class FamilySpec:
    """A family: its config class (whose `family` Literal is the name), the builder of its Task, and the folder of
    its presets (*.yaml, listed by `genforge presets`), its exporters by target format (`genforge export RUN
    --to TARGET`, genforge.core.export), and its codec loaders by diffusers class (a generator's `codec: diffusers`
    folder, read as this family's codec). The builder, exporters and loaders may be named "package.module:attribute",
    so that validating a config or listing presets does not import the family's model code and its heavy
    dependencies (diffusers, vector-quantize-pytorch) until a task is built or exported."""

    name: str
    config: type[FamilyConfig]
    build: Callable[[Any, BuildContext], Any] | str  # (its config, BuildContext) -> core.task.Task
    presets: Path | None = None
    aliases: tuple[str, ...] = ()  # former names: a config or run that says one means this family
    exporters: dict[str, Exporter | str] = field(default_factory=dict, hash=False)  # target -> exporter
    # a diffusers model class whose save_pretrained folders this family's codec reads -> loader(folder) -> codec
    codec_loaders: dict[str, Callable[[Path], Any] | str] = field(default_factory=dict, hash=False)
    # a source format (a diffusers class name, or e.g. "dit-checkpoint") -> importer (`genforge import`)
    importers: dict[str, Importer | str] = field(default_factory=dict, hash=False)
    traits: FamilyTraits = FamilyTraits()  # roles, metrics, sampling options, blocks, capabilities

    def build_task(self, config: Any, ctx: BuildContext) -> Task:
        """The family's task of `config` (its model section), with the family's traits."""
        task = self.builder()(config, ctx)
        task.traits = self.traits
        return task

    def builder(self) -> Callable[[Any, BuildContext], Any]:
        """The builder, imported on first use when it is named by a string."""
        return resolve_named(self.build)

    def exporter(self, target: str) -> Exporter:
        """The exporter to `target` (imported on first use when named by a string); ConfigError naming the
        families that export there when this one does not."""
        if target not in self.exporters:
            others = [name for name, spec in FAMILIES.items() if target in spec.exporters]
            raise ConfigError(f"model.family={self.name} runs do not export to {target!r}; the families that do: "
                              f"{', '.join(others) or 'none'}")
        return resolve_named(self.exporters[target])

    def codec_loader(self, class_name: str) -> Callable[[Path], Any]:
        """The loader of diffusers `class_name` folders (imported on first use when named by a string)."""
        return resolve_named(self.codec_loaders[class_name])

    def importer(self, source_format: str) -> Importer:
        """The importer of `source_format` (imported on first use when named by a string)."""
        return resolve_named(self.importers[source_format])


def register_family(config: type[FamilyConfig], build: Callable[[Any, BuildContext], Any] | str,
                    presets: Path | None = None, aliases: tuple[str, ...] = (),
                    exporters: dict[str, Exporter | str] | None = None,
                    codec_loaders: dict[str, Callable[[Path], Any] | str] | None = None,
                    importers: dict[str, Importer | str] | None = None,
                    traits: FamilyTraits = FamilyTraits()) -> FamilySpec:
    """Register a family under the name its config's `family` field defaults to; `aliases` are former names that
    configs and run directories may still use (`canonical_family`); `exporters` maps a target format
    ("diffusers") to the family's exporter (genforge.core.export.Exporter); `codec_loaders` maps a diffusers model
    class ("AutoencoderKL") to a function that reads a save_pretrained folder of it into the family's frozen codec;
    `importers` maps a source format to the function that reads it into a run (genforge.core.export.Importer);
    `traits` is everything else the family is (roles, default metrics, sampling options, block types, what it
    previews, capabilities), declared here once."""
    name = config.model_fields["family"].default
    if not isinstance(name, str):
        raise ValueError(f"{config.__name__}.family needs a default: the family's name")
    return FAMILIES.register(name, FamilySpec(name, config, build, presets, tuple(aliases), dict(exporters or {}),
                                              dict(codec_loaders or {}), dict(importers or {}), traits))


def export_targets() -> list[str]:
    """Every target format some registered family exports to, in registration order."""
    return list(dict.fromkeys(target for _, spec in FAMILIES.items() for target in spec.exporters))


def diffusers_codec_loader(class_name: str) -> Callable[[Path], Any]:
    """The loader of a diffusers model class some family reads as its codec; ConfigError listing the classes that
    load when none reads `class_name`."""
    for _, spec in FAMILIES.items():
        if class_name in spec.codec_loaders:
            return spec.codec_loader(class_name)
    raise ConfigError(f"a diffusers {class_name} is not a codec genforge reads; it reads "
                      f"{', '.join(import_formats('codec_loaders'))}")


def importer_of(source_format: str) -> Importer:
    """The importer some family registers for `source_format`; ConfigError listing the formats that import."""
    for _, spec in FAMILIES.items():
        if source_format in spec.importers:
            return spec.importer(source_format)
    raise ConfigError(f"{source_format} is not a format genforge imports; it imports "
                      f"{', '.join(import_formats('importers'))}")


def import_formats(kind: str = "importers") -> list[str]:
    """The source formats the registered families import (`kind` "importers") or read as codecs
    ("codec_loaders")."""
    return [name for _, spec in FAMILIES.items() for name in getattr(spec, kind)]


def canonical_family(name: str) -> str:
    """The registered family a `model.family` value means: itself, or the family that lists it as an alias."""
    if name in FAMILIES:
        return name
    for family, spec in FAMILIES.items():
        if name in spec.aliases:
            return family
    return name
