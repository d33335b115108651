"""`genforge import SOURCE --out RUN`: weights trained elsewhere as a genforge run directory that `genforge sample`,
`eval` and the Python API open like any run, and that `train.init_from` fine-tunes.

SOURCE is a checkpoint file (facebookresearch/DiT's `.pt` state dict, read with `weights_only=True`, or
`.safetensors`), a diffusers model folder (`DiTTransformer2DModel`), or a diffusers pipeline folder (`DiTPipeline`:
its transformer/ is imported and its vae/ becomes the codec). The family that registers the source's format reads it
(`FamilySpec.importers`); a latent model's codec is a diffusers AutoencoderKL folder (`--vae`, e.g. the SD VAE),
referred to by path and content hash like any `codec: diffusers`. The run holds one checkpoint, step-000000, whose
model and EMA weights are the imported ones (an official DiT checkpoint holds its EMA weights); trainer_state.json
records where they came from ("imported").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from genforge.app.config import RunConfig, config_from_dict, to_yaml
from genforge.app.runs import build_task, load_diffusers_codec
from genforge.core.config import ConfigError
from genforge.core.export import Imported
from genforge.core.family import importer_of
from genforge.core.files import file_sha256, folder_sha256, write_atomically
from genforge.data.base import DataInfo
from genforge.engine.checkpoint import EMA_PART, MODEL_PART, CheckpointDir, write_trainer_state, write_weights
from genforge.engine.verify import weights_mismatch

FILE_FORMAT = "dit-checkpoint"  # what a checkpoint file is read as (the one file format genforge imports)
PLACEHOLDER_DATA = "data/train"  # an imported run's data.path: the weights come without their data


@dataclass
class ImportedRun:
    """What `import_run` wrote: the run directory, its checkpoint, the format read, and notes for the user."""

    run_dir: Path
    checkpoint: Path
    source_format: str
    config: RunConfig
    notes: list[str] = field(default_factory=list)


def source_format(source: Path) -> tuple[str, Path, Path | None]:
    """(the format to read, the path of the model in it, the codec folder it brings): a file is a
    facebookresearch/DiT checkpoint; a folder with model_index.json a pipeline (its transformer/ and vae/); a folder
    with config.json a model of its `_class_name`."""
    if source.is_file():
        return FILE_FORMAT, source, None
    index = source / "model_index.json"
    try:
        if index.is_file():
            parts = json.loads(index.read_text())
            transformer = parts.get("transformer") or [None, None]
            vae = source / "vae" if (source / "vae" / "config.json").is_file() else None
            return str(transformer[1]), source / "transformer", vae
        if (source / "config.json").is_file():
            return str(json.loads((source / "config.json").read_text()).get("_class_name")), source, None
    except (OSError, ValueError, AttributeError, IndexError) as err:
        raise ConfigError(f"{source}: unreadable model_index.json or config.json ({err})") from None
    what = "does not exist" if not source.exists() else "is neither a checkpoint file nor a diffusers model folder"
    raise ConfigError(f"SOURCE {source} {what}")


def import_run(source: Path | str, out: Path | str, vae: Path | str | None = None,
               num_heads: int | None = None) -> ImportedRun:
    """Import `source` into the new run directory `out` (missing or empty); `vae`: the AutoencoderKL folder of a
    latent model (a pipeline brings its own); `num_heads` where the weights do not tell it. ConfigError (exit 2)
    for a source that does not import, naming why."""
    source, out = Path(source), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: exists and is not an empty folder (import writes a new run)")
    fmt, model_path, bundled = source_format(source)
    imported = importer_of(fmt)(model_path, num_heads=num_heads)
    codec_folder = Path(vae) if vae is not None else bundled
    if imported.codes == "latent" and codec_folder is None:
        raise ConfigError(f"--vae: {source} is a latent model; give the diffusers AutoencoderKL folder it was trained "
                          "with (for facebookresearch/DiT: stabilityai/sd-vae-ft-ema or sd-vae-ft-mse)")
    if imported.codes is None and vae is not None:
        raise ConfigError(f"--vae: {source} models pixels; it has no codec")
    downsample = 1
    if imported.codes == "latent":
        _, info = load_diffusers_codec(codec_folder)
        downsample = info.downsample
    cfg = run_config(imported, codec_folder, imported.input_size * downsample)
    data_info = DataInfo(num_classes=imported.num_classes, channels=3, image_size=cfg.data.image_size)
    task = build_task(cfg, data_info, "cpu")
    load_strictly(task.ema_module(), imported.weights, source)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "config.yaml", to_yaml(cfg))
    record = {"source": str(source.resolve()), "format": fmt, "notes": imported.notes,
              "sha256": file_sha256(source) if source.is_file() else folder_sha256(model_path)}
    checkpoint = write_checkpoint(out, task, data_info, record)
    return ImportedRun(out, checkpoint, fmt, cfg, imported.notes)


def run_config(imported: Imported, codec_folder: Path | None, image_size: int) -> RunConfig:
    """The config of an imported run: the importer's model section (with the codec folder as `model.latent`), an
    image folder as data (its path a placeholder to set before fine-tuning or evaluating: the weights come without
    their data), and the trainer's defaults."""
    model = dict(imported.model)
    if codec_folder is not None:
        model["latent"] = {"codec": "diffusers", "pretrained": str(codec_folder.resolve())}
    raw = {"description": f"imported ({imported.model.get('family')}); set data.path to fine-tune or evaluate",
           "model": model, "data": {"source": "folder", "path": PLACEHOLDER_DATA, "image_size": image_size}}
    return config_from_dict(raw)


def load_strictly(module: torch.nn.Module, weights: dict[str, torch.Tensor], source: Path) -> None:
    """Load every persistent tensor of `module` from `weights` (shapes included); ConfigError naming the keys."""
    mismatch = weights_mismatch(weights, module.state_dict())
    if mismatch:
        raise ConfigError(f"{source}: the weights do not fit the model inferred from them: {mismatch}")
    module.load_state_dict({k: v.float() for k, v in weights.items()})


def write_checkpoint(run_dir: Path, task: torch.nn.Module, data_info: DataInfo, imported: dict) -> Path:
    """checkpoints/step-000000 of the imported weights, written atomically as the trainer writes its own: model and
    EMA weights (the same), trainer_state.json with step 0 and the import's record. It has no optimizer state:
    sampling and evaluation open it; training starts from it through train.init_from."""
    checkpoints = CheckpointDir(run_dir / "checkpoints")
    tmp = checkpoints.staging(0)
    write_weights(tmp, {MODEL_PART: task.state_dict(), EMA_PART: {
        name: p.detach().float() for name, p in task.ema_module().named_parameters() if p.requires_grad}})
    write_trainer_state(tmp, {"step": 0, "family_state": task.state_for_checkpoint(), "data_info": asdict(data_info),
                              "inputs": {f: dict(ref) for f, ref in task.input_references.items()},
                              "imported": imported, "optim_files": []})
    return checkpoints.commit(tmp, 0)
