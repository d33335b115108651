"""Building a run's task, and opening a finished (or running) run directory for sampling, evaluation and encoding.

The composition root: a config's family is looked up in the registry, the runs it is built from (a frozen
tokenizer, `FamilyConfig.input_runs`) are loaded here and handed to the family's builder with the data section and
what the data set says about itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml
from pydantic.fields import FieldInfo
from torch import nn

from genforge.core.status import console
from genforge.app.config import RunConfig, load_config, to_yaml
from genforge.core.codec import CODE_KINDS, CodecInfo, InputRun, check_references, codec_kind
from genforge.core.config import ConfigChange, ConfigError, SampleOptions, config_changes
from genforge.core.family import BuildContext, canonical_family, diffusers_codec_loader
from genforge.core.files import folder_sha256
from genforge.core.registry import FAMILIES
from genforge.core.task import Task
from genforge.data.base import DataInfo
from genforge.data.cache import check_cache
from genforge.data.loader import HeldOutData, build_dataset, check_enough_samples, image_data, scan_data_info
from genforge.engine.checkpoint import (TRAINER_STATE, CheckpointDir, CheckpointReadError, load_tensors,
                                        read_trainer_state)
from genforge.engine.phema import selected_ema
from genforge.engine.verify import expected_tensors, newest_usable, read_weights, verify_checkpoint, weights_hash
from genforge.engine.trainer import Trainer, TrainingRun
from genforge.nn.frozen import Frozen

# which families' runs make each kind of codes, from the roles they declare (genforge.eval.metrics)
MAKES_CODES = {"latent": lambda roles: "tokenizer" in roles and "discrete" not in roles,
               "tokens": lambda roles: "discrete" in roles, "image_embed": lambda roles: "embedder" in roles}


def codec_families() -> list[str]:
    """The families whose runs hand out a codec (tokenizers and image embedders)."""
    return [name for name, spec in FAMILIES.items() if any(makes(spec.traits.roles) for makes in MAKES_CODES.values())]


def runs_making(kind: str) -> str:
    """'a klvae run', 'a vqgan, dvae or cvivit run', ...: runs whose codec makes `kind` codes, for messages."""
    names = [name for name, spec in FAMILIES.items() if MAKES_CODES[kind](spec.traits.roles)]
    return "a " + (" or ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " or " + names[-1]) + " run"


@dataclass
class LoadedRun:
    config: RunConfig
    task: Task
    step: int
    checkpoint: Path
    synthesized_ema: Path | None  # the EMA file `genforge ema` synthesised, when it replaced the trained EMA


def build_task(cfg: RunConfig, info: DataInfo | None = None, device: torch.device | str | None = None) -> Task:
    """The task of `cfg` on data described by `info` (default: scanned from `cfg.data`, only as far as the model
    needs, e.g. its classes), with its input runs' codecs loaded; built on `device` (default: the current one)."""
    info = info or scan_data_info(cfg.data)
    with torch.device(device) if device is not None else torch.device(torch.get_default_device()):
        codecs = {field: load_input_codec(run, field, cfg.model.family, info, cfg.data.path)
                  for field, run in cfg.model.input_runs().items()}
        ctx = BuildContext(cfg.data, info, codecs, heldout=HeldOutData(cfg.data), pixel_data=image_data(cfg.data),
                           i3d_weights=cfg.eval.i3d_weights)
        task = FAMILIES.get(cfg.model.family).build_task(cfg.model, ctx)
    task.input_references = {field: codec_reference(codec_info) for field, (_, codec_info) in codecs.items()
                             if codec_info.source == "diffusers"}
    if cfg.model.grad_checkpointing:
        task.checkpoint_activations()
    return task


def missing_inputs(cfg: RunConfig) -> list[str]:
    """Inputs of `cfg` that earlier pipeline stages write and that do not exist yet: a cache folder, a
    tokenizer run (`model.input_runs()`), as "field=path (what writes it)"."""
    missing = []
    if cfg.data.source == "cache" and not (Path(cfg.data.path) / "cache.json").is_file():
        missing.append(f"data.path={cfg.data.path} (written by `genforge encode`)")
    for field, run in cfg.model.input_runs().items():
        if run.source == "run" and not (Path(run.path) / "checkpoints" / "latest").is_file():
            missing.append(f"{field}={run.path} (a trained run)")
    return missing


def run_family(run_dir: Path | str) -> str | None:
    """The family of the run in `run_dir` (its config.yaml's model.family, a former name resolved), None when it is
    not a readable run directory. Reads nothing but that one key: the CLI asks it before parsing its options."""
    try:
        raw = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
        family = canonical_family(str(raw["model"]["family"]))
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return family if family in FAMILIES else None


def flag(name: str) -> str:
    """The command-line flag of an option or keyword: start_stage -> --start-stage."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class SamplingOption:
    """A sampling option: its field name, the pydantic field, and the families that have it (every family: a common
    option, a field of SampleOptions)."""

    name: str
    field: FieldInfo
    families: tuple[str, ...]

    @property
    def flag(self) -> str:
        """Its command-line flag: start_stage -> --start-stage."""
        return flag(self.name)

    @property
    def common(self) -> bool:
        """Whether every family takes it (a field of SampleOptions)."""
        return self.name in SampleOptions.model_fields

    @property
    def read(self) -> str | None:
        """"image", "video", "lines" or "run" when the value names a file or run the CLI reads (SampleOptions)."""
        return (self.field.json_schema_extra or {}).get("read")

    @property
    def for_eval(self) -> bool:
        """Whether `genforge eval` takes it too."""
        return bool((self.field.json_schema_extra or {}).get("eval"))


def sample_options(command: str | None = None) -> list[SamplingOption]:
    """Every sampling option, once each: the common ones (SampleOptions), then those the registered families add
    (their traits' sample_options) in registration order; `command` "eval": those evaluation takes too
    (`SamplingOption.for_eval`)."""
    every = tuple(name for name, _ in FAMILIES.items())
    found = {name: SamplingOption(name, field, every) for name, field in SampleOptions.model_fields.items()}
    for family, spec in FAMILIES.items():
        for name, field in spec.traits.sample_options.model_fields.items():
            known = found.get(name)
            if known is None or not known.common:
                found[name] = SamplingOption(name, field, (known.families if known else ()) + (family,))
    return [option for option in found.values() if command != "eval" or option.for_eval]


def family_sample_options(command: str | None = None) -> list[SamplingOption]:
    """The sampling options the families add to the common ones (`sample_options` less SampleOptions' fields)."""
    return [option for option in sample_options(command) if not option.common]


def count_parameters(task: Task) -> dict[str, int]:
    """Trainable parameters per phase and in total."""
    counts = {phase: sum(p.numel() for p in task.parameters_for(phase)) for phase in task.phases}
    counts["total"] = sum(p.numel() for p in task.parameters())
    return counts


def load_run(run_dir: Path, device: torch.device | str = "cpu", ema: bool = True,
             synthesized: bool = True) -> LoadedRun:
    """Config + task with the EMA (or live) weights of the newest checkpoint that verifies, safetensors only. A
    damaged newer checkpoint is named in a warning on stderr and skipped, never moved or changed (a reader); a
    CheckpointReadError names the files when none is usable. On the meta device only the structure is built
    (nothing is read but the config, the checkpoint's JSON and safetensors headers). The EMA is the one `genforge
    ema` synthesised and selected for that checkpoint when there is one (and `synthesized`; said on stderr), else
    the checkpoint's."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    cfg = load_config(str(config_path))
    ckpts = CheckpointDir(run_dir / "checkpoints")
    tasks: dict[str, Task] = {}  # by data_info: built once

    def task_of(ckpt: Path) -> Task:
        data_info = read_trainer_state(ckpt)["data_info"]
        key = json.dumps(data_info, sort_keys=True)
        if key not in tasks:
            try:  # a finished run is sampled, not trained: its data cache is neither needed nor re-checked (a
                # generator keeps the codec weights it trained with in its own checkpoint)
                info = replace(DataInfo(**data_info), encoder_hash=None)
            except TypeError as err:
                raise CheckpointReadError(f"{ckpt / TRAINER_STATE}: data_info is not readable ({err})") from None
            tasks[key] = build_task(cfg, info, device)
        return tasks[key]

    def verify(ckpt: Path) -> None:
        verify_checkpoint(ckpt)  # before anything of it is used
        task = task_of(ckpt)
        shadow = {n: (tuple(p.shape), torch.float32) for n, p in task.ema_module().named_parameters()}
        try:
            verify_checkpoint(ckpt, expected_tensors(task.state_dict()), expected_ema=shadow if ema else None,
                              ema_may_lack=set(shadow))
        except CheckpointReadError as err:
            raise CheckpointReadError(f"{err} (it does not match the model of {config_path}: was its model "
                                      "section edited?)") from None

    ckpt, rejected = newest_usable(ckpts, verify)
    if ckpt is None:
        raise ConfigError(f"{run_dir} has no checkpoint yet (checkpoints/latest is missing)")
    for path, why in rejected:
        console().warning(f"skipping {path.name}: {why}; using {ckpt.name}")
    state = read_trainer_state(ckpt)
    task = task_of(ckpt)
    check_references(state["inputs"], task.input_references, ckpt)
    if torch.device(device).type != "meta":
        missing, unexpected = task.load_state_dict(read_weights(ckpt, "model", str(device)), strict=False)
        if missing or unexpected:
            raise ConfigError(f"the weights of {ckpt} do not match the model of {config_path} (missing "
                              f"{missing[:3]}, unexpected {unexpected[:3]}): was its model section edited?")
        if ema:
            shadow = read_weights(ckpt, "ema", str(device))
            missing, unexpected = task.ema_module().load_state_dict(shadow, strict=False)
            if unexpected or len(shadow) == 0:
                raise ConfigError(f"the EMA weights of {ckpt} do not match this model ({unexpected[:3]})")
    chosen = selected_ema(run_dir, ckpt) if ema and synthesized else None
    if chosen is not None and torch.device(device).type != "meta":
        _load_synthesized_ema(task, chosen, str(device))
    task.load_state_from_checkpoint(state["family_state"])
    task.eval()
    return LoadedRun(cfg, task, int(state["step"]), ckpt, chosen)


def _load_synthesized_ema(task: Task, path: Path, device: str) -> None:
    """Put the EMA weights `genforge ema` synthesised (`path`) into the task's EMA module, and say so on stderr."""
    weights = load_tensors(path, device)
    params = dict(task.ema_module().named_parameters())
    if set(weights) != set(params):
        raise ConfigError(f"{path} holds other weights than this model's EMA (e.g. "
                          f"{sorted(set(weights) ^ set(params))[:3]}); select the trained EMA: genforge ema RUN "
                          "--trained")
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
    console().info(f"EMA weights: {path} (synthesised by genforge ema; the trained EMA: genforge ema "
                   f"{path.parent.parent} --trained)")


def load_codec(run_dir: Path | str, device: torch.device | str = "cpu") -> tuple[nn.Module, CodecInfo]:
    """The frozen codec of a tokenizer run (EMA weights of its latest checkpoint) and where it comes from.
    Raises ConfigError when `run_dir` is not a run, has no checkpoint, or is not a tokenizer."""
    run_dir = Path(run_dir).resolve()
    run = load_run(run_dir, device, synthesized=False)  # the checkpoint's EMA, whose hash a cache records
    codec = run.task.codec()
    family = run.config.model.family
    if codec is None:
        raise ConfigError(f"{run_dir} is a {family!r} run, not a tokenizer (its task has no codec); "
                          f"give the run directory of a tokenizer ({', '.join(codec_families())})")
    kind = codec_kind(codec)
    if kind is None:
        raise ConfigError(f"{run_dir}: family {family!r} hands out a codec that is neither a LatentCodec, a "
                          "TokenCodec nor an ImageEmbedder (genforge.core.codec)")
    codec.eval().requires_grad_(False)
    channels = {"latent": lambda: codec.latent_channels, "image_embed": lambda: codec.embed_dim}.get(kind, lambda: 0)
    info = CodecInfo(kind=kind, run_dir=str(run_dir), family=family, step=run.step, checkpoint=str(run.checkpoint),
                     encoder_hash=weights_hash(run.checkpoint), channels=int(channels()),
                     codebook_size=int(codec.codebook_size) if kind == "tokens" else 0,
                     downsample=int(getattr(codec, "downsample", 0)), image_size=run.config.data.image_size)
    return codec, info


def load_diffusers_codec(folder: Path | str, device: torch.device | str = "cpu") -> tuple[nn.Module, CodecInfo]:
    """The frozen codec of a diffusers model folder (save_pretrained: an AutoencoderKL or a VQModel, read by the
    family that registers its class, `FamilySpec.codec_loaders`) and where it comes from: `encoder_hash` is the
    folder's content hash (core.files.folder_sha256). ConfigError when it is not such a folder."""
    folder = Path(folder).resolve()
    try:
        class_name = json.loads((folder / "config.json").read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError) as err:
        reason = "it does not exist" if not folder.exists() else f"no readable config.json ({err})"
        raise ConfigError(f"{folder} is not a diffusers model folder: {reason}") from None
    try:
        with torch.device(device):
            codec = diffusers_codec_loader(str(class_name))(folder)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{folder} ({class_name}): {err}") from None
    codec.to(device).eval().requires_grad_(False)
    kind = codec_kind(codec)
    config = json.loads((folder / "config.json").read_text())
    info = CodecInfo(kind=kind, run_dir=str(folder), family=f"diffusers {class_name}", step=0,
                     checkpoint=str(folder), encoder_hash=folder_sha256(folder),
                     channels=int(codec.latent_channels) if kind == "latent" else 0,
                     codebook_size=int(codec.codebook_size) if kind == "tokens" else 0,
                     downsample=int(codec.downsample), image_size=int(config.get("sample_size") or 0),
                     source="diffusers")
    return codec, info


def codec_reference(info: CodecInfo) -> dict[str, str]:
    """What a checkpoint keeps of a codec it refers to instead of copying (Task.input_references)."""
    return {"path": info.run_dir, "sha256": info.encoder_hash, "class": info.family.removeprefix("diffusers ")}


def load_any_codec(path: Path | str, device: torch.device | str = "cpu") -> tuple[nn.Module, CodecInfo]:
    """The frozen codec of a tokenizer run (a folder with config.yaml) or of a diffusers model folder (config.json),
    what `genforge encode` takes."""
    if not (Path(path) / "config.yaml").is_file() and (Path(path) / "config.json").is_file():
        return load_diffusers_codec(path, device)
    return load_codec(path, device)


def load_input_codec(run: InputRun, field: str, family: str, data: DataInfo,
                     cache_path: str | None) -> tuple[nn.Module, CodecInfo]:
    """The frozen codec a generator of `family` is built on, from the config field `field`: a tokenizer run's (a
    submodule: the generator's checkpoints keep a copy) or a diffusers folder's (held outside the module tree as
    `Frozen`: the checkpoints refer to it). It must make `run.kind` codes, and when the data is a cache, be the
    codec that wrote it. Errors name the field."""
    try:
        if run.source == "diffusers":
            codec, info = load_diffusers_codec(run.path, device=torch.get_default_device())
        else:
            codec, info = load_codec(run.path, device=torch.get_default_device())
    except (ConfigError, CheckpointReadError) as err:
        keep = (f"; a run built on a diffusers folder refers to it instead of copying its weights: keep it in place, "
                f"or point {field} at where it is now") if run.source == "diffusers" else ""
        raise ConfigError(f"{field}: {err}{keep}") from None
    if info.kind != run.kind:
        use = runs_making(run.kind) + (", or a diffusers AutoencoderKL folder" if run.kind == "latent" else
                                       ", or a diffusers VQModel folder" if run.kind == "tokens" else "")
        raise ValueError(f"{field}={run.path} is a {info.family!r} tokenizer of {CODE_KINDS[info.kind]}; "
                         f"model.family={family} models {CODE_KINDS[run.kind]} (use {use})")
    check_cache(data, info, cache_path)
    return (Frozen(codec) if run.source == "diffusers" else codec), info


def training_run(cfg: RunConfig) -> TrainingRun:
    """What the trainer gets of `cfg`: its sections, the task builder, and the resolved config to write."""
    return TrainingRun(cfg.data, cfg.train, cfg.eval, cfg.log, build_task=lambda info: build_task(cfg, info),
                       config_yaml=to_yaml(cfg), config_dict=cfg.model_dump(mode="json"),
                       changes_from=lambda run_dir: resume_changes(cfg, run_dir))


def resume_changes(cfg: RunConfig, run_dir: Path) -> list[ConfigChange] | None:
    """The changes of `cfg` from the config.yaml of the run in `run_dir` that a resume applies (None when it has no
    config.yaml, read through the migrations of genforge.app.migrations). ConfigError (exit 2) listing every field
    that may not change on resume (the fields' OnResume markers, genforge.core.config.config_changes) with its old
    and new value."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    try:
        saved = load_config(str(path))
    except ConfigError as err:
        raise ConfigError(f"{path}, the config of the run being resumed, does not load: {err}") from None
    changes = config_changes(saved, cfg)
    refused = [c for c in changes if not c.allowed]
    if refused:
        listed = "".join(f"\n  {c}" for c in refused)
        raise ConfigError(f"{run_dir} was trained with another config; resuming it may not change:{listed}\nSet "
                          f"them back as in {path}, or train a new run (--fresh, or another --run-dir). What a "
                          "resume may change: docs/fault-tolerance.md")
    return changes


def check_data_size(cfg: RunConfig) -> None:
    """BadDataError when the training data holds fewer samples than train.batch_size, where the source can count
    them without reading them (a folder lists its files; a stream of shards cannot tell)."""
    check_enough_samples(build_dataset(cfg.data, "train"), cfg.data, cfg.train.batch_size)


def make_trainer(cfg: RunConfig, run_dir: Path, fresh: bool = False) -> Trainer:
    """The trainer of `cfg` into `run_dir` (resuming from its latest checkpoint; `fresh`: a new run directory)."""
    return Trainer(training_run(cfg), run_dir, fresh)
