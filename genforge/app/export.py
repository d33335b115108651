"""`genforge export RUN --to diffusers OUT`: a trained run's model in another library's format, written by the exporter
its family declares (genforge.core.export). The weights are the EMA ones by default, from either checkpoint layout
(one file, or the shards of train.sharding; `load_run` reads both); everything is written as safetensors, plus
OUT/genforge-export.json, the record of what was exported from where and what did not map."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from genforge.app.runs import LoadedRun, load_run, run_family
from genforge.core.config import ConfigError
from genforge.core.export import Exported
from genforge.core.family import export_targets
from genforge.core.registry import FAMILIES

__all__ = ["EXPORT_RECORD", "export_run", "export_targets"]

EXPORT_RECORD = "genforge-export.json"


def export_run(run_dir: Path, out: Path, target: str, ema: bool = True) -> Exported:
    """Export the newest usable checkpoint of `run_dir` (EMA weights unless `ema` is False) to `target` in `out`
    (missing or empty). ConfigError (exit 2) for a run that is not one, a family without that target, or a model
    that does not map (ExportError, naming why)."""
    run_dir, out = Path(run_dir), Path(out)
    family = run_family(run_dir)
    if family is None:
        raise ConfigError(f"{run_dir} is not a run directory (no readable config.yaml with a known model.family)")
    FAMILIES.get(family).exporter(target)  # refuse before reading any weights
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"OUT {out}: exists and is not an empty folder (export writes a new one)")
    return export_loaded(load_run(run_dir, "cpu", ema=ema), out, target, "ema" if ema else "live", run_dir)


def export_loaded(run: LoadedRun, out: Path, target: str, weights: str = "ema",
                  run_dir: Path | None = None) -> Exported:
    """Export an opened run (its task as loaded, `weights` says which) to `target` in `out`, and write the record
    (which names the synthesised EMA file when `genforge ema` chose the EMA weights)."""
    exporter = FAMILIES.get(run.config.model.family).exporter(target)
    with torch.no_grad():
        exported = exporter(run.task, run.config.model, out)
    record = {"target": target, "run": str(Path(run_dir).resolve()) if run_dir else None,
              "family": run.config.model.family, "step": run.step, "checkpoint": str(Path(run.checkpoint).absolute()),
              "weights": weights, "folders": exported.folders, "notes": exported.notes, "details": exported.details}
    if weights == "ema" and run.synthesized_ema is not None:
        record["weights"] = "ema synthesised post hoc"
        record["ema_file"] = str(Path(run.synthesized_ema).absolute())
    (out / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return exported
