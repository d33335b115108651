"""`genforge ema RUN`: post-hoc EMA (EDM2, Karras et al. 2024, §3): the power-function EMA of any width σ_rel,
synthesised after training from the snapshots a `train.ema.kind: power` run wrote (genforge.engine.phema), and
which EMA weights `sample`, `eval` and `export` then use.

RUN/ema_synthesized/sigma_rel-0.0800.safetensors   a synthesised EMA (the weights of the model's EMA module; in its
                                                   header σ_rel, γ, the snapshot step it is the EMA at, the
                                                   checkpoint it goes with, the coefficients)
RUN/ema_synthesized/selected                        {"file", "checkpoint", "sigma_rel"}: the one `load_run` uses
                                                   in place of the checkpoint's EMA while the run's newest usable
                                                   checkpoint is that checkpoint (`--trained` removes it)

The checkpoint's own EMA (ema.safetensors) is never changed: removing the selection is the way back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from torch import Tensor

from genforge.app.runs import LoadedRun
from genforge.core.config import MAX_SIGMA_REL, ConfigError
from genforge.core.files import write_atomically
from genforge.core.registry import METRICS
from genforge.engine.phema import (SELECTED, SNAPSHOTS, SYNTHESIZED, Snapshot, SnapshotDir, save_atomically,
                                   sigma_rel_to_gamma, synthesize)


@dataclass
class SynthesizedEma:
    """An EMA synthesised from a run's snapshots: its width and exponent, the snapshot step it is the EMA at, the
    checkpoint it goes with, how many snapshots it was made of, the weights (names of the model's EMA module) and,
    once written, the file."""

    sigma_rel: float
    gamma: float
    step: int
    checkpoint: str
    snapshots: int
    weights: dict[str, Tensor]
    coefficients: dict[str, list[float]]
    path: Path | None = None

    def describe(self) -> str:
        return (f"sigma_rel {self.sigma_rel:g} (gamma {self.gamma:.3f}) at step {self.step}, from {self.snapshots} "
                f"snapshots")


def check_sigma_rel(sigma_rel: float, name: str = "sigma_rel") -> None:
    """ConfigError naming `name` when `sigma_rel` is not a width a power-function EMA can have."""
    if not 0.0 < sigma_rel < MAX_SIGMA_REL:
        raise ConfigError(f"{name} {sigma_rel}: must be in (0, {MAX_SIGMA_REL:.4f}) (the relative width of a "
                          "power-function EMA; EDM2 uses 0.05 to 0.2)")


def run_snapshots(run_dir: Path, up_to: int) -> list[Snapshot]:
    """The run's EMA snapshots of steps up to `up_to` (its checkpoint's); ConfigError when there are none."""
    found = SnapshotDir(Path(run_dir) / SNAPSHOTS).snapshots(up_to)
    if not found:
        raise ConfigError(f"{run_dir} has no EMA snapshots up to step {up_to} in {Path(run_dir) / SNAPSHOTS} (a run "
                          "trained with train.ema.kind=power writes them every train.ema.snapshot_every steps)")
    return found


def synthesize_ema(run: LoadedRun, run_dir: Path, sigma_rel: float) -> SynthesizedEma:
    """The EMA of width `sigma_rel` of the opened run `run` (its checkpoint says up to which step the snapshots
    count), by EDM2's least squares over its snapshots (genforge.engine.phema.synthesize). ConfigError for a width
    out of range or a run without snapshots."""
    check_sigma_rel(sigma_rel)
    snapshots = run_snapshots(run_dir, run.step)
    weights, coefficients = synthesize(snapshots, sigma_rel)
    expected = set(dict(run.task.ema_module().named_parameters()))
    if set(weights) != expected:
        raise ConfigError(f"the snapshots in {Path(run_dir) / SNAPSHOTS} hold other weights than the model of "
                          f"{run_dir} (e.g. {sorted(set(weights) ^ expected)[:3]}): was its model section edited?")
    return SynthesizedEma(sigma_rel, sigma_rel_to_gamma(sigma_rel), snapshots[-1].step, Path(run.checkpoint).name,
                          len(snapshots), weights, coefficients)


def load_ema_weights(run: LoadedRun, weights: dict[str, Tensor]) -> None:
    """Put `weights` (the EMA module's parameters) into the opened run's model, on its device."""
    params = dict(run.task.ema_module().named_parameters())
    for name, value in weights.items():
        params[name].data.copy_(value.to(params[name].device, params[name].dtype))


def write_synthesized(run_dir: Path, ema: SynthesizedEma, select: bool = True) -> Path:
    """Write `ema` into RUN/ema_synthesized/ (atomically) and, with `select`, make it the EMA that `sample`, `eval`
    and `export` use; returns the file."""
    folder = Path(run_dir) / SYNTHESIZED
    metadata = {"sigma_rel": str(ema.sigma_rel), "gamma": str(ema.gamma), "step": str(ema.step),
                "checkpoint": ema.checkpoint, "snapshots": str(ema.snapshots),
                "coefficients": json.dumps(ema.coefficients)}
    ema.path = save_atomically(folder / f"sigma_rel-{ema.sigma_rel:.4f}.safetensors", ema.weights, metadata)
    if select:
        record = {"file": ema.path.name, "checkpoint": ema.checkpoint, "sigma_rel": ema.sigma_rel, "step": ema.step}
        write_atomically(folder / SELECTED, json.dumps(record) + "\n")
    return ema.path


def select_trained_ema(run_dir: Path) -> bool:
    """Make the checkpoints' own EMA the one `sample`, `eval` and `export` use again; whether a synthesised one was
    selected."""
    marker = Path(run_dir) / SYNTHESIZED / SELECTED
    if not marker.is_file():
        return False
    marker.unlink()
    return True


def score_widths(run: LoadedRun, run_dir: Path, sigma_rels: Sequence[float], metric: str,
                 score: Any) -> list[tuple[SynthesizedEma, float, dict[str, Any]]]:
    """Each width's synthesised EMA put into the run's model and scored by `score(metric)` (e.g. a Run's `score`
    with its options bound): (the EMA, its headline value, every result), in the order given. The run's model keeps
    the last width's weights."""
    check_metric(metric)
    headline = headline_result(metric)
    scored = []
    for sigma_rel in sigma_rels:
        ema = synthesize_ema(run, run_dir, sigma_rel)
        load_ema_weights(run, ema.weights)
        results = score(metric)
        scored.append((ema, float(results[headline]), results))
    return scored


def best_width(metric: str, scored: list[tuple[SynthesizedEma, float, dict[str, Any]]]
               ) -> tuple[SynthesizedEma, float, dict[str, Any]]:
    """The best of `score_widths`' results by the metric's headline (smallest when the metric says lower is
    better, e.g. fid)."""
    spec = METRICS.get(metric)
    lower = spec.results[0] in spec.lower_is_better
    return (min if lower else max)(scored, key=lambda item: item[1])


def check_metric(metric: str) -> None:
    """ConfigError naming the metrics when `metric` is not one (before a sweep opens the run)."""
    if metric not in METRICS:
        raise ConfigError(f"metric {metric!r}: allowed {', '.join(METRICS)}")


def headline_result(metric: str) -> str:
    """The result of `metric` a sweep compares widths by (its first), e.g. "judge_accuracy"."""
    return METRICS.get(metric).results[0]


def write_sweep(run_dir: Path, metric: str, n: int, seed: int,
                scored: list[tuple[SynthesizedEma, float, dict[str, Any]]]) -> tuple[Path, SynthesizedEma, float]:
    """RUN/ema_synthesized/sweep-<metric>.json (atomically): every width's results and the best by `best_width`.
    Returns the file, the best width and its value; OSError when it cannot be written."""
    best, value, _ = best_width(metric, scored)
    record = {"metric": metric, "result": headline_result(metric), "n": n, "seed": seed, "step": best.step,
              "checkpoint": best.checkpoint,
              "widths": [{"sigma_rel": s.sigma_rel, "gamma": s.gamma, "value": v, "results": r} for s, v, r in scored],
              "best": best.sigma_rel}
    out = Path(run_dir) / SYNTHESIZED / f"sweep-{metric}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, json.dumps(record, indent=1, default=str) + "\n")
    return out, best, value


def headline(metric: str) -> str:
    """The result a sweep compares widths by, and which way: "judge_accuracy (higher is better)"."""
    spec = METRICS.get(metric)
    return f"{spec.results[0]} ({'lower' if spec.results[0] in spec.lower_is_better else 'higher'} is better)"
