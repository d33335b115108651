"""The commands of `genforge`: each parses, validates, calls. Bad input or config exits with code 2."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import torch
import torch.distributed as dist
import typer

from genforge.app.api import Run, default_device, load_run, resolve_precision, sampling_options
from genforge.app.config import (MAX_EVAL_SAMPLES, MAX_GRID_SAMPLES, MAX_SAMPLES, RunConfig, list_presets, load_config,
                                 to_yaml)
from genforge.app.datasets import write_moving_shapes, write_shapes
from genforge.app.encode import TextEncoderConfig, encode_dataset
from genforge.app.errors import BAD_INPUT, RUN_FAILED, CheckpointReadError, ConfigError, Preempted
from genforge.app.export import EXPORT_RECORD, export_run, export_targets
from genforge.app.importer import import_run
from genforge.app.outputs import (MANIFEST, PREVIEW_WRITERS, Progress, console, manifest_summary, rank_and_world,
                                  status_on_stderr, write_eval_results, write_per_caption, write_samples)
from genforge.app.runs import (build_task, check_data_size, count_parameters, flag, load_any_codec, make_trainer,
                               missing_inputs, resume_changes, sample_options)
from genforge.cli.sampling_flags import SamplingCommand, with_sampling_flags

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Train generative vision models: tokenizers and generators, one engine.")
data_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Built-in data sets.")
app.add_typer(data_app, name="data")


@app.callback()
def _status_on_stderr() -> None:
    # every command: status lines (genforge.core.status) go to stderr, whatever logging an embedding program set up
    status_on_stderr()


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"genforge: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def train(
    config: Annotated[Optional[str], typer.Argument(help="preset name or YAML file (default: unet-shapes)")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override, e.g. --set train.lr=3e-4")] = None,
    run_dir: Annotated[Optional[Path], typer.Option(help="run directory (default: runs/<name>)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the resolved config and parameter count")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="start over in a new run directory")] = False,
) -> None:
    """Train; the same command again resumes from the latest checkpoint."""
    try:
        cfg = load_config(config, set_ or [])
    except ConfigError as err:
        _fail(str(err))
    target = run_dir or Path("runs") / cfg.name
    if dry_run:
        _dry_run(cfg, target, fresh)
        return
    _check_writable(target, "--run-dir", keep=False)  # the trainer creates it once the run is accepted
    try:
        with _enough_memory("building the model"):
            trainer = make_trainer(cfg, target, fresh=fresh)
    except (ValueError, FileNotFoundError) as err:
        _fail(str(err))
    try:
        with _enough_memory("training"):
            out = trainer.fit()
    except BAD_INPUT as err:
        _fail(str(err))
    except Preempted as stop:
        _fail(str(stop), code=stop.exit_code)
    except RUN_FAILED as err:
        _fail(str(err), code=1)
    except OSError as err:  # e.g. the disk filled up while writing metrics.jsonl or a preview
        _fail(f"could not write the run in {target}: {err}", code=1)
    if dist.is_initialized():  # every rank finished: leave the process group before the interpreter exits (its
        # threads torn down at exit can abort a finished run with SIGABRT)
        dist.destroy_process_group()
    if trainer.accelerator.is_main_process:
        samples = sorted(p for p in (out / "samples").glob("step-*.*") if p.suffix != ".txt")  # not the captions
        typer.echo(f"run directory: {out}")
        if samples:
            typer.echo(f"samples: {samples[-1]}")


def _dry_run(cfg: RunConfig, target: Path, fresh: bool) -> None:
    """Print the resolved config, the parameter count and where the run goes (and what a resume there would change);
    exit 2 for what training would refuse."""
    resumes = "" if fresh or not (target / "checkpoints" / "latest").is_file() else " (resumes the run there)"
    missing = missing_inputs(cfg)
    # a pipeline stage whose inputs earlier stages make: the config is valid, the model unknown
    parameters = "not counted until these inputs exist: " + "; ".join(missing) if missing else ""
    try:
        changes = resume_changes(cfg, target) if resumes else []
        if not missing:
            counts = count_parameters(build_task(cfg, device="meta"))
            parameters = ", ".join(f"{k} {v:,}" for k, v in counts.items())
            check_data_size(cfg)
    except FileNotFoundError as err:  # the data is not there (yet): the config itself is valid
        parameters = f"not counted until the data exists: {err}"
    except ValueError as err:
        _fail(str(err))
    typer.echo(to_yaml(cfg).rstrip())
    typer.echo(f"# parameters: {parameters}")
    typer.echo(f"# run directory: {target}{resumes}")
    for change in changes or ():
        typer.echo(f"# changed on resume: {change}")


def _unwritable(folder: Path, keep: bool = True) -> str | None:
    """Why `folder` cannot be created or written (a file, under a file, read-only, /proc), None when it can. Not
    `keep`: the folders this check created are removed again (a run refused later leaves no empty directory)."""
    if folder.is_symlink() and not folder.exists() or folder.exists() and not folder.is_dir():
        return "something other than a folder is there" + (" (a link to nowhere)" if folder.is_symlink() else "")
    created = [path for path in (folder, *folder.parents) if not path.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".tmp-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        return str(err.strerror or err)
    finally:
        for path in created if not keep else ():  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()
    return None


def _check_writable(folder: Path, option: str, keep: bool = True) -> None:
    """Exit 2 naming `option` and `folder` when it cannot be created or written (`_unwritable`)."""
    why = _unwritable(folder, keep)
    if why is not None:
        _fail(f"{option} {folder}: cannot write there ({why})")


@contextlib.contextmanager
def _enough_memory(doing: str) -> Iterator[None]:
    """Exit 1 saying what ran out instead of a traceback when torch cannot allocate what `doing` needs (a model of
    absurd width, a batch that cannot fit)."""
    try:
        yield
    except RuntimeError as err:  # the CPU allocator raises a plain RuntimeError, CUDA torch.OutOfMemoryError
        text = str(err)
        if not (isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in text):
            raise
        why = text.split("can't allocate memory: ")[-1].splitlines()[0]
        _fail(f"out of memory {doing} ({why}); lower the model's sizes (model.*), train.batch_size or "
              "data.image_size", code=1)


def _check_finite(**values: float | None) -> None:
    """Exit 2 naming the option of a NaN or infinite number (typer's min/max let inf through)."""
    for name, value in values.items():
        if value is not None and not math.isfinite(value):
            _fail(f"--{name.replace('_', '-')} {value}: must be a finite number")


def _open_run(run_dir: Path, compile_blocks: bool = False) -> Run:
    """The run's EMA model on the best device; `compile_blocks`: its blocks compiled (--compile)."""
    try:
        with _enough_memory("loading the run"):
            run = load_run(run_dir)
    except (ConfigError, ValueError, CheckpointReadError) as err:
        _fail(str(err))
    if compile_blocks:
        run.task.compile_blocks()
    return run


COMPILE_HELP = ("torch.compile the network's blocks (inductor) before sampling: pays on GPUs for many samples; "
                "the first batch compiles")
PRECISION_HELP = "no, bf16 or fp16 (fp16: CUDA only): autocast of the network (default: the run's train.precision)"


def _precision(given: str | None, trained: str, device: str) -> str:
    """The precision to run the network in: --precision, else the run's train.precision (exit 2 naming --precision
    for a name this device cannot run)."""
    try:
        return resolve_precision(given, trained, device, spell=flag)
    except ValueError as err:
        _fail(str(err))


@app.command(cls=SamplingCommand)
@with_sampling_flags("sample")
def sample(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="a run directory with a checkpoint")],
    n: Annotated[Optional[int], typer.Option("--n", "-n", min=1, max=MAX_GRID_SAMPLES,
                                             help="number of samples (default: 16, or one per line of --prompts; "
                                                  "-n under torchrun)")]
    = None,
    out: Annotated[Optional[Path], typer.Option(help="grid to write: .png (images), .gif or .mp4 (clips); or a "
                                                  "folder (no suffix): one file per caption, named after it "
                                                  "(default: RUN_DIR/samples/sample-...)")] = None,
    format_: Annotated[Optional[str], typer.Option("--format", help="with --out FOLDER: the files' type, png, gif "
                                                                     "or mp4 (default: png for images, gif for "
                                                                     "clips)")] = None,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    precision: Annotated[Optional[str], typer.Option(help=PRECISION_HELP)] = None,
    compile_: Annotated[bool, typer.Option("--compile/--no-compile", help=COMPILE_HELP)] = False,
    given: dict[str, Any] | None = None,
) -> None:
    """Write a grid of samples from the run's EMA weights.

    A PNG grid (a GIF or MP4 of clips for video models), and the prompts, one per cell, beside it; with --out FOLDER
    (a path without a suffix), one file per sample, named after its caption. Under torchrun
    the processes split the samples (the grid is the same) and rank 0 writes it. Each family has sampling options
    of its own: `genforge sample RUN_DIR --help` lists those of the run's family."""
    given = given or {}
    _check_finite(**{k: v for k, v in given.items() if isinstance(v, float)})
    if out is not None:  # before sampling: a wrong --out should not cost the samples
        if out.suffix and out.suffix.lower() not in PREVIEW_WRITERS:
            _fail(f"--out {out}: no writer for {out.suffix!r} files; allowed: {', '.join(PREVIEW_WRITERS)}")
        _check_writable(out.parent if out.suffix else out, "--out")
    suffix = None
    if format_ is not None:
        suffix = "." + format_.lower().lstrip(".")
        if suffix not in PREVIEW_WRITERS:
            _fail(f"--format {format_}: allowed: {', '.join(s.lstrip('.') for s in PREVIEW_WRITERS)}")
        if out is None or out.suffix:
            _fail(f"--format {format_}: it sets the type of the files of --out FOLDER (a path without a suffix); "
                  "a grid's type is its --out suffix")
    try:
        _join_process_group()
        _sample(run_dir, n, out, seed, precision, compile_, given, suffix)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _sample(run_dir: Path, n: int | None, out: Path | None, seed: int, precision: str | None, compile_: bool,
            given: dict[str, Any], suffix: str | None = None) -> None:
    """`genforge sample` once its options are read, on every rank of a process group (rank 0 writes)."""
    run = _open_run(run_dir, compile_)
    if out is None:  # the default grid goes into the run: before sampling, as for --out
        _check_writable(run_dir / "samples", "--out (default: RUN_DIR/samples/)")
    precision = _precision(precision, run.config.train.precision, run.device)
    try:
        options = sampling_options(run.config, "sample", flag, **given)
    except ValueError as err:
        _fail(str(err))
    read_files = [Path(given[o.name]) for o in sample_options("sample") if o.read and o.name in given]
    for source in [p for p in read_files if p.is_file() and out is not None]:
        if out.with_suffix(".txt").resolve() == source.resolve():  # the captions are written beside the output
            _fail(f"--out {out}: its captions file {out.with_suffix('.txt')} would overwrite {source}; choose "
                  "another --out")
    rank, world = rank_and_world()
    bar = Progress("sampling", "samples", enabled=rank == 0, processes=world)
    try:  # on a terminal, also the sampler's bar over its steps
        images, cond = run.generate(n, seed, options, precision, report=bar.report, progress=bar.on_terminal)
    except ValueError as err:
        _fail(str(err))
    n = len(images)
    bar.finish(f"sampled {n} samples")
    if rank != 0:
        return
    shown = options.model_copy(update={k: None for k, v in options if isinstance(v, torch.Tensor)})  # not --image
    settings = run.task.sampler_settings(run.task.resolve(shown))
    if out is not None and not out.suffix:
        try:
            files = write_per_caption(run.task, cond, images, out, suffix)
        except ValueError as err:
            _fail(str(err))
        except OSError as err:
            _fail(f"--out {out}: cannot write it ({err.strerror or err})")
        typer.echo(f"wrote {n} samples ({json.dumps(settings)}) to {out}/, one file per caption: "
                   f"{', '.join(f.name for f in files[:3])}{', ...' if len(files) > 3 else ''}")
        return
    try:
        default = run_dir / "samples" / f"sample-step{run.step:06d}-seed{seed}"
        path = write_samples(run.task, cond, images, out or default)
    except ValueError as err:  # an --out suffix no writer has, outputs it cannot show, a preview without its data
        _fail(str(err))
    except OSError as err:
        _fail(f"--out {out or default}: cannot write it ({err.strerror or err})")
    typer.echo(f"wrote {n} samples ({json.dumps(settings)}) to {path}")
    if "text" in cond:
        typer.echo(f"prompts, one per cell in reading order: {path.with_suffix('.txt')}")


@app.command("eval", cls=SamplingCommand)
@with_sampling_flags("eval")
def evaluate(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="a run directory with a checkpoint")],
    metrics: Annotated[Optional[str], typer.Option(help="comma-separated, e.g. judge,fid,kid,is,prdc")] = None,
    n: Annotated[Optional[int], typer.Option("--n", "-n", min=1, max=MAX_EVAL_SAMPLES,
                                             help="number of generated samples (-n under torchrun, whose parser "
                                                  "takes --n for its own)")]
    = None,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    ref: Annotated[Optional[str], typer.Option(help="real images for fid/kid/prdc: an image folder or a statistics "
                                                    "file (.safetensors, .npz); default: eval.ref, else the "
                                                    "held-out split of the run's data")] = None,
    is_weights: Annotated[Optional[str], typer.Option(help="file with the Inception-v3 logits layer (fc.weight "
                                                           "[1008, 2048]) for metric is; default: eval.is_weights")]
    = None,
    i3d_weights: Annotated[Optional[str], typer.Option(help="TorchScript I3D (StyleGAN-V's i3d_torchscript.pt) for "
                                                            "metric fvd; default: eval.i3d_weights")] = None,
    precision: Annotated[Optional[str], typer.Option(help=PRECISION_HELP)] = None,
    compile_: Annotated[bool, typer.Option("--compile/--no-compile", help=COMPILE_HELP)] = False,
    given: dict[str, Any] | None = None,
) -> None:
    """Score the run's EMA model; writes RUN_DIR/eval/<step>.json.

    Under torchrun rank 0 writes it (the processes split the samples: the scores are those of one process).
    Sampling options of the run's family that apply to evaluation are listed by `genforge eval RUN_DIR --help`."""
    given = given or {}
    _check_finite(**{k: v for k, v in given.items() if isinstance(v, float)})
    _join_process_group()
    try:
        run = _open_run(run_dir, compile_)
        precision = _precision(precision, run.config.train.precision, run.device)
        rank, world = rank_and_world()
        # before computing: where the results go (rank 0 writes them); the scores are printed either way
        cannot_write = _unwritable(run_dir / "eval") if rank == 0 else None
        if cannot_write is not None:
            console().warning(f"{run_dir / 'eval'}: cannot write there ({cannot_write}); the scores will be printed, "
                              "not written")
        bar = Progress("evaluating", "samples", enabled=rank == 0, processes=world)
        try:
            options = sampling_options(run.config, "eval", flag, **given)
            results = run.score(metrics, n, seed, options, precision, ref, is_weights, i3d_weights, report=bar.report)
        except (ValueError, FileNotFoundError) as err:  # FileNotFoundError: a feature network's weights, --ref
            _fail(str(err))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    scores = ", ".join(f"{k} {v:.4g}" for k, v in results.items() if isinstance(v, float))
    bar.finish(f"evaluated {results.get('n', n or run.config.eval.n)} samples", scores)
    if not results:  # ranks other than 0
        return
    for key, value in results.items():
        if isinstance(value, list):  # e.g. judge_kind_by_frame (a value per frame); a histogram stays in the JSON
            value = " ".join(f"{v:.4g}" for v in value) if len(value) <= 16 else f"{len(value)} values, in the JSON"
        typer.echo(f"{key:>16}: {value:.4f}" if isinstance(value, float) else f"{key:>16}: {value}")
    try:
        if cannot_write is not None:
            raise OSError(cannot_write)
        out = write_eval_results(run_dir, run.step, results)
    except OSError as err:
        _fail(f"{run_dir / 'eval'}: cannot write there ({err.strerror or err}); the scores above were not written")
    typer.echo(f"wrote {out}")


def _join_process_group() -> None:
    """Under torchrun / accelerate launch (WORLD_SIZE > 1): join the process group, so that `sample` and `eval` split
    the samples and `encode` the data set over the processes (gloo on CPUs, NCCL on GPUs, one GPU per local
    rank)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


@app.command()
def encode(
    tokenizer: Annotated[Path, typer.Argument(help="run directory of a trained tokenizer or image embedder (a run "
                                                   "whose family has a codec), or a diffusers AutoencoderKL or "
                                                   "VQModel folder")],
    out: Annotated[Path, typer.Option(help="cache folder to write (must not exist, or be empty)")],
    data: Annotated[Optional[str], typer.Option(help="preset or YAML whose data section is encoded (default: the "
                                                     "tokenizer run's config.yaml; required for a diffusers "
                                                     "folder)")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="data override, e.g. data.shapes.n=5000")] = None,
    flip: Annotated[Optional[bool], typer.Option("--flip/--no-flip", help="also store the flipped images' codes "
                                                                          "(default: data.flip)")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="images per encoder call")] = 64,
    shard_size: Annotated[int, typer.Option(min=1, help="samples per shard")] = 10_000,
    text_encoder: Annotated[Optional[str], typer.Option(help="also store the captions' embeddings by this frozen "
                                                             "text encoder: minilm, t5 or clip (docs/text.md); "
                                                             "none: no caption embeddings (a clip run stores its "
                                                             "own text tower's by default)")]
    = None,
    text_encoder_path: Annotated[Optional[str], typer.Option(help="its checkpoint directory (t5, clip; minilm: "
                                                                  "default the packaged one)")] = None,
    text_max_length: Annotated[int, typer.Option(min=1, max=512, help="tokens per caption")] = 32,
    precision: Annotated[Optional[str], typer.Option(help="no, bf16 or fp16 (fp16: CUDA only): autocast of the "
                                                          "encoder (default: the tokenizer run's train.precision)")]
    = None,
) -> None:
    """Encode a data set once with a tokenizer.

    Latents or token ids as webdataset shards + cache.json (and, with
    --text-encoder, the captions' text embeddings; a clip run, image embeddings and, automatically, its own text
    tower's states of each distinct caption, what the DALL·E 2 prior trains on). Under torchrun the processes encode
    parts of the data set into one cache, the same as one process writes."""
    overrides = set_ or []
    for item in overrides:
        if not item.startswith("data."):
            _fail(f"--set {item!r}: only data.* keys apply to encode")
    if text_encoder in (None, "none") and text_encoder_path is not None:
        _fail("--text-encoder-path applies to --text-encoder")
    device = default_device()
    _join_process_group()
    rank = rank_and_world()[0]
    try:
        text = None
        if text_encoder not in (None, "none"):
            text = TextEncoderConfig(kind=text_encoder, path=text_encoder_path, max_length=text_max_length)
        codec, info = load_any_codec(tokenizer, device)
        run_config = None if info.source == "diffusers" else load_config(str(tokenizer / "config.yaml"))
        if run_config is None and data is None:
            _fail(f"--data: {tokenizer} is a diffusers folder, which names no data set; give a preset or YAML "
                  "whose data section to encode, e.g. --data dit-shapes")
        precision = _precision(precision, run_config.train.precision if run_config else "no", device)
        cfg = load_config(data or str(tokenizer / "config.yaml"), overrides)
        manifest = encode_dataset(codec, info, cfg.data, out, flip=cfg.data.flip if flip is None else flip,
                                  batch_size=batch_size, shard_size=shard_size, device=device, progress=True,
                                  text=text, codec_text=text_encoder != "none", precision=precision)
    except (ValueError, FileNotFoundError, CheckpointReadError) as err:  # ConfigError, CacheError: ValueErrors
        _fail(str(err))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank != 0:
        return
    if manifest.skipped:
        typer.echo(f"genforge: skipped {len(manifest.skipped)} unreadable images (listed in {MANIFEST})", err=True)
    typer.echo(f"wrote {manifest_summary(manifest)} to {out}")
    typer.echo(f"manifest: {out / MANIFEST}")


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="a run directory with a checkpoint")],
    out: Annotated[Path, typer.Argument(help="folder to write (must not exist, or be empty)")],
    to: Annotated[str, typer.Option("--to", help="target format: diffusers")],
    ema: Annotated[bool, typer.Option("--ema/--no-ema", help="the EMA weights (default) or the live ones")] = True,
) -> None:
    """Export a run's model to another library's format.

    `--to diffusers` writes save_pretrained folders in safetensors (a DiTPipeline, or
    DiTTransformer2DModel / UNet2DModel + scheduler, AutoencoderKL, VQModel) and OUT/genforge-export.json; a model
    that does not map exits 2 naming why (docs/interoperability.md)."""
    targets = export_targets()
    if to not in targets:
        _fail(f"--to {to!r}: allowed {', '.join(targets)}")
    _check_writable(out, "OUT", keep=False)  # the exporter creates it once the run is accepted
    try:
        exported = export_run(run_dir, out, to, ema=ema)
    except (ValueError, FileNotFoundError, CheckpointReadError) as err:  # ConfigError, ExportError: ValueErrors
        _fail(str(err))
    except OSError as err:
        _fail(f"OUT {out}: cannot write it ({err.strerror or err})", code=1)
    for folder, cls in exported.folders.items():
        typer.echo(f"wrote {cls}: {out / folder}")
    for note in exported.notes:
        typer.echo(f"note: {note}")
    typer.echo(f"record: {out / EXPORT_RECORD}")


@app.command("import")
def import_(
    source: Annotated[Path, typer.Argument(help="a facebookresearch/DiT checkpoint (.pt state dict or .safetensors), "
                                                "a diffusers DiTTransformer2DModel folder or a DiTPipeline folder")],
    out: Annotated[Path, typer.Option(help="run directory to write (must not exist, or be empty)")],
    vae: Annotated[Optional[Path], typer.Option(help="a latent model's codec: a diffusers AutoencoderKL folder (e.g. "
                                                     "sd-vae-ft-ema); a DiTPipeline brings its own")] = None,
    num_heads: Annotated[Optional[int], typer.Option(min=1, help="attention heads, where the size is not one of the "
                                                                "DiT zoo's (the weights do not tell it)")] = None,
) -> None:
    """Import weights trained elsewhere as a run directory.

    A run directory that `genforge sample`, `eval` and `load_run` open, and
    `train.init_from` fine-tunes (docs/interoperability.md). Checkpoints are read with torch.load(weights_only=True):
    a file holding pickled objects is refused."""
    _check_writable(out, "--out", keep=False)
    try:
        imported = import_run(source, out, vae=vae, num_heads=num_heads)
    except (ValueError, FileNotFoundError, CheckpointReadError) as err:  # ConfigError: a ValueError
        _fail(str(err))
    except OSError as err:
        _fail(f"--out {out}: cannot write it ({err.strerror or err})", code=1)
    model = imported.config.model
    typer.echo(f"imported {imported.source_format} from {source}: {model.family} {model.backbone.kind} "
               f"(size {model.backbone.size}, {imported.config.data.image_size}px, {model.num_classes or 0} classes)")
    for note in imported.notes:
        typer.echo(f"note: {note}")
    typer.echo(f"wrote {imported.checkpoint}")
    typer.echo(f"sample it: genforge sample {out} --label 0 --out samples.png")


@app.command()
def presets() -> None:
    """List the built-in presets: name, family, description."""
    for name, description in list_presets().items():
        typer.echo(f"{name:<22} {load_config(name).model.family:<8} {description}")


@data_app.command("shapes")
def data_shapes(
    out: Annotated[Path, typer.Option(help="folder to write")],
    n: Annotated[int, typer.Option(min=1, max=MAX_SAMPLES, help="number of images")] = 1000,
    image_size: Annotated[int, typer.Option(min=16, help="pixels")] = 64,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    shards: Annotated[bool, typer.Option("--shards", help="write webdataset shards (.png, .txt, .cls) instead "
                                                          "of a folder")] = False,
    parquet: Annotated[bool, typer.Option("--parquet", help="write parquet files as a Hugging Face dataset saves "
                                                            "them (image, text, label)")] = False,
    shard_size: Annotated[int, typer.Option(min=1, help="records per shard (with --shards) or rows per file "
                                                        "(with --parquet)")] = 1000,
) -> None:
    """Write the built-in shapes data set as an image folder (class sub-folders, .txt captions), with --shards as
    webdataset shards, or with --parquet as parquet files."""
    if shards and parquet:
        _fail("--shards and --parquet: choose one")
    layout = "parquet" if parquet else "shards" if shards else "folder"
    for line in write_shapes(out, n, image_size, seed=seed, layout=layout, shard_size=shard_size):
        typer.echo(line)


@data_app.command("moving_shapes")
def data_moving_shapes(
    out: Annotated[Path, typer.Option(help="folder to write")],
    n: Annotated[int, typer.Option(min=1, max=MAX_SAMPLES, help="number of clips")] = 200,
    image_size: Annotated[int, typer.Option(min=16, help="pixels")] = 64,
    frames: Annotated[int, typer.Option(min=1, help="frames per clip")] = 17,
    fmt: Annotated[str, typer.Option("--format", help="gif or mp4")] = "gif",
    fps: Annotated[float, typer.Option(min=0.1, help="frame rate of the files")] = 8.0,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    shards: Annotated[bool, typer.Option("--shards", help="write webdataset shards (.mp4 or .gif, .txt, .cls, "
                                                          ".json) instead of a folder")] = False,
    shard_size: Annotated[int, typer.Option(min=1, help="records per shard (with --shards)")] = 1000,
    paths: Annotated[str, typer.Option(help="inside or from_centre (data.shapes.paths)")] = "inside",
) -> None:
    """Write the built-in moving shapes as a folder of GIFs or MP4s (class sub-folders of the shapes classes, .txt
    captions "a red circle moving left"), readable with data.source=video_folder, or with --shards as webdataset
    shards for data.source=video_shards."""
    try:
        lines = write_moving_shapes(out, n, image_size, frames, fmt=fmt, fps=fps, seed=seed, shards=shards,
                                    shard_size=shard_size, paths=paths)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    for line in lines:
        typer.echo(line)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
