"""The Python API: `train` a config, `load_run` a run directory, then `Run.sample` and `Run.evaluate` it.

`genforge sample` and `genforge eval` are built on the same functions (`sampling_options`, `resolve_precision`,
`Run.generate`, `Run.score`): the CLI parses its flags into these keyword arguments, and its messages spell the
options as flags (`spell=flag`) where the API's name the keywords.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence, Union

import av
import numpy as np
import torch
from PIL import Image
from pydantic import ValidationError
from torch import Tensor

from genforge.app import runs
from genforge.app.ema import SynthesizedEma, load_ema_weights, synthesize_ema, write_synthesized
from genforge.app.config import RunConfig, config_from_dict, load_config
from genforge.core.config import ConfigError, SampleOptions
from genforge.core.precision import check_precision
from genforge.core.registry import FAMILIES
from genforge.core.task import Batch, Task
from genforge.data.images import center_crop_resize, load_rgb, to_pil, to_tensor
from genforge.data.video import read_frames, resize_crop_frames
from genforge.engine.checkpoint import CheckpointReadError
from genforge.eval.fid_files import check_input, check_npz_path, fid_of, input_stats, save_npz
from genforge.eval.metrics import feature_network
from genforge.eval.run import evaluate_task, write_eval_results
from genforge.sampling import Report, generate

ImageInput = Union[Image.Image, str, Path, Tensor]  # a PIL image, an image file, or a tensor [k, C, H, W] in [-1, 1]
Spell = Callable[[str], str]  # how an option's keyword name appears in messages (the CLI: as its flag)


def default_device() -> str:
    """"cuda" when a GPU is available, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def read_image(value: ImageInput, size: int, name: str = "image") -> Tensor:
    """An image as [k, 3, size, size] in [-1, 1]: a file or PIL image resized and center-cropped like training
    images; a tensor ([C, H, W] or [k, C, H, W] in [-1, 1]) as it is. ValueError naming `name` when unreadable."""
    if isinstance(value, Tensor):
        if value.dim() not in (3, 4):
            raise ValueError(f"{name}: a tensor [k, C, H, W] in [-1, 1], got shape {tuple(value.shape)}")
        return (value[None] if value.dim() == 3 else value).float()
    try:
        image = value.convert("RGB") if isinstance(value, Image.Image) else load_rgb(value)
        return to_tensor(np.asarray(center_crop_resize(image, size)))[None]
    except (OSError, ValueError) as err:
        raise ValueError(f"{name} {value}: cannot read it as an image ({err})") from None


MAX_VIDEO_FRAMES = 1024  # frames read of a video an option names (a clip to prime with, not a film)


def read_video(value: str | Path | Tensor, size: int, name: str = "video") -> Tensor:
    """A clip as [k, 3, T, size, size] in [-1, 1]: a video file's first frames (at most MAX_VIDEO_FRAMES) resized
    and center-cropped like training clips; a tensor ([C, T, H, W] or [k, C, T, H, W] in [-1, 1]) as it is.
    ValueError naming `name` when unreadable."""
    if isinstance(value, Tensor):
        if value.dim() not in (4, 5):
            raise ValueError(f"{name}: a tensor [k, C, T, H, W] in [-1, 1], got shape {tuple(value.shape)}")
        return (value[None] if value.dim() == 4 else value).float()
    try:
        return resize_crop_frames(read_frames(value, MAX_VIDEO_FRAMES), size)[None]
    except (OSError, ValueError, av.error.FFmpegError) as err:
        raise ValueError(f"{name} {value}: cannot read it as a video ({err})") from None


def read_lines(value: str | Path | Sequence[str], name: str = "prompts") -> list[str]:
    """Prompts: the non-empty lines of a text file, or of a list of strings. ValueError naming `name` when the file
    is unreadable or no prompt is left."""
    lines = value
    if isinstance(value, (str, Path)):
        try:
            lines = Path(value).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{name} {value}: cannot read it ({err})") from None
    prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        raise ValueError(f"{name} {value}: no prompts (one per line)")
    return prompts


def read_run(value: str | Path | runs.LoadedRun | Task, name: str = "run") -> Task:
    """The task of another run an option names (`read: run`, e.g. dalle2_decoder's --prior): a run directory, opened
    with its EMA weights on the default device, or a run or task already open (the Python API). ValueError naming
    `name` when it is not a usable run."""
    if isinstance(value, runs.LoadedRun):
        return value.task
    if isinstance(value, Task):
        return value
    try:
        return runs.load_run(Path(value), default_device()).task
    except (ConfigError, CheckpointReadError) as err:
        raise ValueError(f"{name} {value}: {err}") from None


def _validated(model: type[SampleOptions], given: dict[str, Any], spell: Spell) -> SampleOptions:
    """`given` validated by `model`; ValueError naming the first bad option, its value and why."""
    try:
        return model.model_validate(given)
    except ValidationError as err:
        error = err.errors()[0]
        name = str(error["loc"][0])
        raise ValueError(f"{spell(name)} {given.get(name)!r}: {error['msg']}") from None


def _check_names(config: RunConfig, given: dict[str, Any], command: str, spell: Spell
                 ) -> dict[str, runs.SamplingOption]:
    """The options named in `given`; ValueError naming one that is unknown to `command`, belongs to other families,
    or asks for prompts of a model that is not text-conditioned."""
    family = config.model.family
    known = {option.name: option for option in runs.sample_options(command)}
    for name in given:
        option = known.get(name)
        if option is None:
            ours = [spell(o.name) for o in known.values() if family in o.families and not o.common]
            raise ValueError(f"{spell(name)}: no such {command} option; those of {family!r} models: "
                             f"{', '.join(ours) or 'none'}")
        if family not in option.families:
            raise ValueError(f"{spell(name)} does not apply to a {family!r} model (it is an option of "
                             f"{', '.join(option.families)} models)")
    if "prompt" in given and "prompts" in given:
        raise ValueError(f"{spell('prompt')} and {spell('prompts')}: give one of them")
    if {"prompt", "prompts", "negative_prompt"} & set(given) and not config.model.takes_prompts():
        raise ValueError(f"{spell('prompt')}/{spell('prompts')}/{spell('negative_prompt')}: this "
                         f"{family!r} model is not text-conditioned")
    return {name: known[name] for name in given}


def _read(kind: str, value: Any, config: RunConfig, name: str) -> Any:
    """What a `read` option's value names: an image or clip tensor, a list of lines, a run's task."""
    if kind == "image":
        return read_image(value, config.data.image_size, name)
    if kind == "video":
        return read_video(value, config.data.image_size, name)
    if kind == "lines":
        return read_lines(value, name)
    return read_run(value, name)


def sampling_options(config: RunConfig, command: str = "sample", spell: Spell = str, **given: Any) -> SampleOptions:
    """The run's family's options object (its traits' `sample_options`, the common options included) of the
    keyword arguments `given` (None: not given), validated, with the files `read: image` / `video` / `lines`
    options name read (a tensor, a list of prompts; a PIL image, a tensor or a list given instead is taken as it
    is) and the runs `read: run` options name opened (`read_run`). The task fills in the config's defaults
    (`Task.resolve`). ValueError naming the option (spelled by `spell`) when it is unknown, belongs to other
    families, or its value is bad."""
    given = {k: v for k, v in given.items() if v is not None}
    options = _check_names(config, given, command, spell)
    loaded = {k: v for k, v in given.items() if options[k].read and not isinstance(v, (str, Path))}
    family_options = FAMILIES.get(config.model.family).traits.sample_options
    checked = _validated(family_options, {k: v for k, v in given.items() if k not in loaded}, spell)
    read = {k: _read(options[k].read, loaded.get(k, getattr(checked, k)), config, spell(k))
            for k in given if options[k].read}
    return checked.model_copy(update=read)


def resolve_precision(given: str | None, trained: str, device: str | torch.device, spell: Spell = str) -> str:
    """The autocast precision to run a network in: `given` ("no", "bf16", "fp16"), else the run's train.precision
    (`trained`); ValueError naming it when `device` cannot run it."""
    precision = given or trained
    setting = f"{spell('precision')} {precision}" + ("" if given else " (the default: the run's train.precision)")
    check_precision(precision, device, setting)
    return precision


def to_pil_images(samples: Tensor) -> list[Image.Image] | list[list[Image.Image]]:
    """Samples in [-1, 1] as PIL images: [n, C, H, W] -> n images; clips [n, C, T, H, W] -> n lists of T frames."""
    if samples.dim() == 5:
        return [[to_pil(frame) for frame in clip.unbind(1)] for clip in samples]
    return [to_pil(image) for image in samples]


@dataclass(repr=False)
class Run(runs.LoadedRun):
    """A trained run opened for sampling and evaluation: `config` (RunConfig), `task` (the model, EMA weights by
    default, in eval mode), `step` and `checkpoint` (the newest checkpoint that verifies), on `device`."""

    path: Path
    device: str

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, family={self.family!r}, step={self.step}, device={self.device!r})"

    @property
    def family(self) -> str:
        """The model family, e.g. "diffusion", "maskgit"."""
        return self.config.model.family

    def generate(self, n: int | None, seed: int, options: SampleOptions, precision: str = "no",
                 report: Report | None = None, progress: bool = False) -> tuple[Tensor, Batch]:
        """`n` samples (default 16, or one per prompt of options.prompts) drawn with `options` (as `sampling_options`
        makes them) under the resolved `precision`, and their conditions: float32 on the CPU in [-1, 1]. In a
        process group every rank calls it and gets all `n` (genforge.sampling.generate)."""
        n = n or (len(options.prompts) if options.prompts else 16)
        return generate(self.task, n, seed, self.device, precision=precision, report=report, options=options,
                        progress=progress)

    def score(self, metrics: str | Sequence[str] | None, n: int | None, seed: int, options: SampleOptions,
              precision: str = "no", ref: str | None = None, is_weights: str | None = None,
              i3d_weights: str | None = None, report: Report | None = None) -> dict[str, Any]:
        """The `metrics` (names, or comma-separated; default eval.metrics) on `n` (default eval.n) samples drawn with
        `options`, or a tokenizer's reconstructions; `ref`, `is_weights`, `i3d_weights` replace the run's eval
        settings. Results include the sampler settings and "autocast" (the precision); {} on ranks other than 0."""
        names = metrics.split(",") if isinstance(metrics, str) else list(metrics or self.config.eval.metrics)
        settings = {"ref": ref, "is_weights": is_weights, "i3d_weights": i3d_weights}
        eval_cfg = self.config.eval.model_copy(update={k: v for k, v in settings.items() if v is not None})
        results = evaluate_task(self.task, self.config.data, eval_cfg, names, n or self.config.eval.n, seed,
                                self.device, precision=precision, report=report, options=options)
        if results:
            results["autocast"] = precision  # not "precision": prdc's result
        return results

    def sample(self, n: int | None = None, seed: int = 0, *, precision: str | None = None,
               output: Literal["tensor", "pil"] = "tensor", **options: Any
               ) -> Tensor | list[Image.Image] | list[list[Image.Image]]:
        """`n` samples (default 16, or one per prompt of `prompts`), reproducible from `seed` and the same as
        `genforge sample` draws with these options. `output="tensor"`: float32 on the CPU in [-1, 1], [n, C, H, W]
        (clips [n, C, T, H, W]); "pil": a list of n images (clips: lists of frames). `options`: the fields of the
        family's sampling options (`genforge sample RUN --help`): steps, sampler, cfg_scale, label, prompt, prompts
        (a file or a list), negative_prompt, and the family's own (e.g. image, frames); ValueError naming an option
        that is bad or not the family's."""
        if output not in ("tensor", "pil"):
            raise ValueError(f"output {output!r}: allowed 'tensor', 'pil'")
        checked = sampling_options(self.config, **options)
        precision = resolve_precision(precision, self.config.train.precision, self.device)
        samples, _ = self.generate(n, seed, checked, precision)
        return samples if output == "tensor" else to_pil_images(samples)

    def evaluate(self, metrics: str | Sequence[str] | None = None, n: int | None = None, seed: int = 0, *,
                 precision: str | None = None, ref: str | None = None, is_weights: str | None = None,
                 i3d_weights: str | None = None, write: bool = False, **options: Any) -> dict[str, Any]:
        """Scores of the run, as `genforge eval` computes them (see `score`); `write`: also written to
        run_dir/eval/<step>.json as `genforge eval` does. `options`: the sampling options evaluation takes (steps,
        sampler, cfg_scale and those `genforge eval RUN --help` lists)."""
        checked = sampling_options(self.config, "eval", **options)
        precision = resolve_precision(precision, self.config.train.precision, self.device)
        results = self.score(metrics, n, seed, checked, precision, ref, is_weights, i3d_weights)
        if write and results:
            write_eval_results(self.path, self.step, results)
        return results

    def synthesize_ema(self, sigma_rel: float, write: bool = False) -> SynthesizedEma:
        """Put the power-function EMA of width `sigma_rel`, synthesised from the run's snapshots (post-hoc EMA,
        EDM2; a train.ema.kind=power run; docs/ema.md), into this run's model, so `sample` and `evaluate` use it.
        `write`: also written into RUN/ema_synthesized/ and selected, as `genforge ema RUN --sigma-rel X` does, so
        `genforge sample`, `eval`, `export` and later `load_run`s use it. ConfigError for a width out of range or
        a run without snapshots."""
        ema = synthesize_ema(self, self.path, sigma_rel)
        load_ema_weights(self, ema.weights)
        if write:
            write_synthesized(self.path, ema)
        return ema


def load_run(path: str | Path, device: str | torch.device | None = None, ema: bool = True) -> Run:
    """Open a run directory: its config and the newest checkpoint that verifies, EMA weights (`ema=False`: the live
    ones), on `device` (default: "cuda" when available, else "cpu"). ConfigError / CheckpointReadError when it is not
    a run or has no usable checkpoint."""
    device = str(device or default_device())
    loaded = runs.load_run(Path(path), device, ema)
    return Run(loaded.config, loaded.task, loaded.step, loaded.checkpoint, loaded.synthesized_ema, Path(path), device)


def train(config: str | Path | RunConfig | None = None, overrides: Sequence[str] = (),
          run_dir: str | Path | None = None, fresh: bool = False) -> Path:
    """Train `config` (a preset name, a YAML file or a RunConfig; None: the default preset) with `overrides`
    ("train.lr=3e-4", ...) into `run_dir` (default runs/<name>), resuming from its latest checkpoint (`fresh`: a new
    run directory beside it). Returns the run directory. ConfigError names a bad setting."""
    if isinstance(config, RunConfig):
        cfg = config_from_dict(config.model_dump(mode="json"), list(overrides))
    else:
        cfg = load_config(None if config is None else str(config), list(overrides))
    return runs.make_trainer(cfg, Path(run_dir) if run_dir else Path("runs") / cfg.name, fresh=fresh).fit()


def fid(a: str | Path, b: str | Path | None = None, *, save_stats: str | Path | None = None,
        device: str | torch.device | None = None, batch_size: int = 50, report: Report | None = None
        ) -> dict[str, Any]:
    """FID between `a` and `b`, each an image folder or a statistics file (.npz with mu and sigma, or genforge's
    .safetensors), with the Inception features StyleGAN2-ADA / EDM / EDM2 compute (NVlabs' resize:
    genforge.nn.features.fid_resize); `genforge fid A B` is this. `save_stats` writes the statistics of `a` (float64
    mu, sigma) to an .npz that pytorch-fid and clean-fid read; with it, `b` may be left out. `report(done, total)`:
    images read so far of the folders'. Returns `a`, `n_a` (images behind its statistics; None: a file that does
    not say), `b`, `n_b`, `features` (the network and resize), `fid` (when `b` is given), `saved` (the .npz).
    FileNotFoundError / ValueError (checked before the network loads) name a missing or empty folder or a file
    without mu and sigma."""
    inputs = [check_input(a, "A")] + ([check_input(b, "B")] if b is not None else [])
    out = check_npz_path(save_stats) if save_stats is not None else None
    if b is None and out is None:
        raise ValueError("give B (an image folder or statistics file to compare A with) or --save-stats OUT.npz")
    device = str(device or default_device())
    net = feature_network(device)
    total = sum(len(given.files or []) for given in inputs)
    stats, before = [], 0
    for given in inputs:
        offset = before  # this folder's progress continues the count of the ones before it
        counted = None if report is None else lambda done, _, offset=offset: report(offset + done, total)
        stats.append(input_stats(net, given, device, batch_size, counted))
        before += len(given.files or [])
    results: dict[str, Any] = {}
    for name, given, stat in zip(("a", "b"), inputs, stats):
        results[name] = f"{given.path} ({given.kind})"
        results[f"n_{name}"] = stat.n
    results["features"] = net.fingerprint()["network"]
    if len(stats) == 2:
        results["fid"] = fid_of(*stats)
    if out is not None:
        results["saved"] = str(save_npz(out, stats[0]))
    return results
