"""Post-hoc EMA as EDM2 defines it (Karras et al. 2024, "Analyzing and Improving the Training Dynamics of Diffusion
Models", §3 and App. C.1-C.2; NVlabs/edm2 training/phema.py): power-function EMAs, their snapshots, and the least
squares synthesis of the EMA of any width from the snapshots.

A power-function EMA of exponent γ averages the weights θ_1..θ_t of t updates with β_t = (1 − 1/t)^(γ+1), so update
k has the weight ((k^(γ+1) − (k−1)^(γ+1)) / t^(γ+1)): exactly the profile p_t(τ) = (γ+1) τ^γ / t^(γ+1) on [0, t]
integrated over the k-th unit interval (θ held over (k−1, k]). Its relative width is
σ_rel = sqrt((γ+1) / ((γ+2)^2 (γ+3))) (eq. 3's std over t). Snapshots of averages of several γ at several t span a
space of profiles; the profile of another (t, γ) is projected onto it by least squares with the closed-form inner
products of two power profiles (`p_dot_p`), and the same combination of the snapshots' weights is that EMA.

Snapshots are files RUN/ema_snapshots/step-NNNNNN.safetensors: every tracked average's whole weights, named
`<index>/<name>` (the index into train.ema.sigma_rels), and in the header the step, the σ_rel and γ of each index, and
per phase of the task the updates t its averages hold and the names of the weights it trains. Each is written to a
temporary name, fsynced and renamed into place: a kill leaves the previous ones.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from genforge.core.files import TMP_PREFIX, fsync_dir
from genforge.core.status import console
from genforge.engine.checkpoint import CheckpointReadError, read_json, step_dir_name

SNAPSHOTS = "ema_snapshots"  # the folder of a run that holds them
SYNTHESIZED = "ema_synthesized"  # the folder of a run that holds the EMAs `genforge ema` synthesised
SELECTED = "selected"  # in it: which one `sample`, `eval` and `export` use (genforge.app.ema)
SNAPSHOT_FILE = re.compile(r"^step-(\d{6,})\.safetensors$")


def sigma_rel_to_gamma(sigma_rel: float) -> float:
    """The exponent γ of the power-function EMA of relative width `sigma_rel` (EDM2's std_to_exp): the largest real
    root of γ^3 + 7γ^2 + (16 − σ^-2)γ + (12 − σ^-2) = 0, i.e. of (γ+2)^2 (γ+3) σ^2 = γ + 1. ValueError outside
    (0, sqrt(1/12)), where γ would not be positive."""
    if not 0.0 < sigma_rel < (1 / 12) ** 0.5:
        raise ValueError(f"sigma_rel={sigma_rel} must be in (0, {(1 / 12) ** 0.5:.4f})")
    s = np.float64(sigma_rel) ** -2
    return float(np.roots([1.0, 7.0, 16.0 - s, 12.0 - s]).real.max())


def gamma_to_sigma_rel(gamma: float) -> float:
    """The relative width of the power-function EMA of exponent `gamma`: sqrt((γ+1) / ((γ+2)^2 (γ+3)))."""
    return float(np.sqrt((gamma + 1) / ((gamma + 2) ** 2 * (gamma + 3))))


def power_beta(t: int, gamma: float) -> float:
    """β_t = (1 − 1/t)^(γ+1), the decay of a power-function EMA's t-th update (t ≥ 1; the first copies)."""
    return (1.0 - 1.0 / t) ** (gamma + 1.0)


def p_dot_p(t_a: np.ndarray, gamma_a: np.ndarray, t_b: np.ndarray, gamma_b: np.ndarray) -> np.ndarray:
    """∫ p_a(τ) p_b(τ) dτ of the power profiles p(τ) = (γ+1) τ^γ / t^(γ+1) on [0, t] (EDM2's p_dot_p):
    (γ_a+1)(γ_b+1) / (γ_a+γ_b+1) · (t_a/t_b)^(γ_b if t_a < t_b else −γ_a) / max(t_a, t_b); broadcasts."""
    t_ratio = t_a / t_b
    t_exp = np.where(t_a < t_b, gamma_b, -gamma_a)
    t_max = np.maximum(t_a, t_b)
    num = (gamma_a + 1) * (gamma_b + 1) * t_ratio ** t_exp
    den = (gamma_a + gamma_b + 1) * t_max
    return num / den


def solve_posthoc_coefficients(in_t: Iterable[float], in_gamma: Iterable[float], out_t: float,
                               out_gamma: float) -> np.ndarray:
    """The coefficients x [n] of the snapshots (their t and γ) whose combination Σ x_i p_i is closest in L2 to the
    profile of (out_t, out_gamma) (EDM2's solve_posthoc_coefficients: A x = b, A_ij = <p_i, p_j>, b_i = <p_i, p_out>,
    by least squares)."""
    t = np.asarray(list(in_t), dtype=np.float64)
    g = np.asarray(list(in_gamma), dtype=np.float64)
    a = p_dot_p(t[:, None], g[:, None], t[None, :], g[None, :])  # [n, n]
    b = p_dot_p(t, g, np.float64(out_t), np.float64(out_gamma))  # [n]
    return np.linalg.lstsq(a, b, rcond=None)[0]


@dataclass(frozen=True)
class Snapshot:
    """One snapshot file: its `step`, the σ_rel and γ of each tracked average (by index), and per phase the updates
    `t` its averages hold and the names of the weights it trains."""

    path: Path
    step: int
    sigma_rels: tuple[float, ...]
    gammas: tuple[float, ...]
    phases: dict[str, tuple[int, tuple[str, ...]]]

    def tensors(self, device: str = "cpu") -> dict[str, Tensor]:
        """Its weights, `<index>/<name>`."""
        try:
            with safe_open(str(self.path), framework="pt", device=device) as f:
                return {name: f.get_tensor(name) for name in f.keys()}
        except (OSError, SafetensorError) as err:
            raise CheckpointReadError(f"{self.path} is not a readable snapshot ({err})") from err


class SnapshotDir:
    """The `ema_snapshots/` folder of a run: atomic writes, the list of snapshots, dropping those of an abandoned
    continuation (after a resume or a rollback to an earlier checkpoint)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def write(self, step: int, tensors: dict[str, Tensor], sigma_rels: tuple[float, ...], gammas: tuple[float, ...],
              phases: dict[str, tuple[int, list[str]]]) -> Path:
        """Write the snapshot of `step` (`tensors`: `<index>/<name>`, whole) atomically; returns its path."""
        metadata = {"step": str(step), "sigma_rels": json.dumps(list(sigma_rels)), "gammas": json.dumps(list(gammas)),
                    "phases": json.dumps({p: {"t": t, "names": list(names)} for p, (t, names) in phases.items()})}
        return save_atomically(self.root / f"{step_dir_name(step)}.safetensors", tensors, metadata)

    def snapshots(self, up_to: int | None = None) -> list[Snapshot]:
        """The snapshots, oldest first (those of steps up to `up_to`, when given); a file whose header is not a
        snapshot's is a CheckpointReadError naming it."""
        if not self.root.is_dir():
            return []
        found = []
        for path in sorted(self.root.iterdir()):
            match = SNAPSHOT_FILE.match(path.name)
            if match is None or (up_to is not None and int(match.group(1)) > up_to):
                continue
            found.append(read_snapshot(path))
        return sorted(found, key=lambda s: s.step)

    def drop_after(self, step: int) -> list[Path]:
        """Remove the snapshots of steps after `step` (and temporary files a kill left): a run going on from `step`
        writes its own. Returns what was removed."""
        if not self.root.is_dir():
            return []
        doomed = [p for p in self.root.iterdir() if p.name.startswith(TMP_PREFIX) or (
            SNAPSHOT_FILE.match(p.name) and int(SNAPSHOT_FILE.match(p.name).group(1)) > step)]
        for path in doomed:
            path.unlink()
        if doomed:
            fsync_dir(self.root)
        return doomed


def save_atomically(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str]) -> Path:
    """Write `tensors` (with the header `metadata`) as the safetensors file `path`: to a temporary name, fsynced,
    renamed into place; a kill leaves the old file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def read_snapshot(path: Path) -> Snapshot:
    """The header of a snapshot file (no tensor is read); CheckpointReadError naming it when it is not one."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        phases = {p: (int(v["t"]), tuple(v["names"])) for p, v in json.loads(meta["phases"]).items()}
        return Snapshot(Path(path), int(meta["step"]), tuple(json.loads(meta["sigma_rels"])),
                        tuple(json.loads(meta["gammas"])), phases)
    except (OSError, SafetensorError, KeyError, ValueError, TypeError) as err:
        raise CheckpointReadError(f"{path} is not a readable EMA snapshot ({type(err).__name__}: {err})") from err


def synthesize(snapshots: list[Snapshot], sigma_rel: float) -> tuple[dict[str, Tensor], dict[str, list[float]]]:
    """The power-function EMA of width `sigma_rel` at the last snapshot's step, combined from every average of every
    snapshot by `solve_posthoc_coefficients`, each phase with its own update counts t (snapshots before a phase's
    first update are left out of its solution); weights no phase trains (or of a phase not yet updated) are the
    last snapshot's. Accumulated in float64, returned in float32, and the coefficients by phase (snapshot-major)."""
    if not snapshots:
        raise ValueError("no snapshots to synthesise from")
    gamma = sigma_rel_to_gamma(sigma_rel)
    last = snapshots[-1]
    plans: dict[str, tuple[list[tuple[int, int]], np.ndarray]] = {}  # phase -> [(snapshot, index)], coefficients
    for phase, (out_t, _) in last.phases.items():
        terms = [(s, i) for s, snap in enumerate(snapshots) if snap.phases.get(phase, (0, ()))[0] >= 1
                 for i in range(len(snap.gammas))]
        if out_t >= 1 and terms:
            coefficients = solve_posthoc_coefficients([snapshots[s].phases[phase][0] for s, _ in terms],
                                                      [snapshots[s].gammas[i] for s, i in terms], out_t, gamma)
            plans[phase] = (terms, coefficients)
    out: dict[str, Tensor] = {k[2:]: v.double() for k, v in last.tensors().items() if k.startswith("0/")}
    phase_names = {phase: last.phases[phase][1] for phase in plans}
    for name in (n for names in phase_names.values() for n in names):
        out[name].zero_()
    for s, snap in enumerate(snapshots):  # one snapshot's tensors in memory at a time
        uses = [(phase, i, float(x)) for phase, (terms, coefficients) in plans.items()
                for (t, i), x in zip(terms, coefficients) if t == s]
        tensors = snap.tensors() if uses else {}
        for phase, i, x in uses:
            for name in phase_names[phase]:
                out[name].add_(tensors[f"{i}/{name}"].double(), alpha=x)
    weights = {name: t.float() for name, t in out.items()}
    return weights, {phase: coefficients.tolist() for phase, (_, coefficients) in plans.items()}


def selected_ema(run_dir: Path, checkpoint: Path) -> Path | None:
    """The synthesised EMA file selected for the run (RUN/ema_synthesized/selected, genforge.app.ema) if it goes
    with `checkpoint`; a selection made at another checkpoint (training went on since) is named in a warning and not
    used. CheckpointReadError when the selection is unreadable or names a file that is not there."""
    marker = Path(run_dir) / SYNTHESIZED / SELECTED
    if not marker.is_file():
        return None
    record = read_json(marker)
    if not isinstance(record, dict) or not isinstance(record.get("file"), str):
        raise CheckpointReadError(f"{marker} is not a selection record (remove it: genforge ema RUN --trained)")
    path = marker.parent / record["file"]
    if record.get("checkpoint") != Path(checkpoint).name:
        console().warning(f"{marker} selects the EMA of sigma_rel {record.get('sigma_rel')} synthesised at "
                          f"{record.get('checkpoint')}, but the newest checkpoint is {Path(checkpoint).name}: using "
                          f"its trained EMA (synthesise again: genforge ema {run_dir} --sigma-rel X)")
        return None
    if not path.is_file():
        raise CheckpointReadError(f"{marker} selects {path}, which is missing (genforge ema RUN --trained: the "
                                  "trained EMA again)")
    return path
