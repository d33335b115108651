"""The default recipe lever by lever: steps, images and minutes of training until the judge reaches 0.95 and 0.99.

Each row is a run trained with evaluation during training (`--set eval.every=N --set eval.n=M`: the judge of the
EMA weights every N steps, written to RUN/eval/<step>.json). The table reads those curves and prices each step by
the run's own training step, timed here quietly with the real Trainer (benchmarks/common.py, `time_trainer`:
`--probe-steps` steps after 2, on `--threads` threads) on a fresh trainer built from the run's config.yaml, so that
whatever else shared the CPU while the runs trained does not enter the minutes. A threshold the curve never
reaches is shown as "-". docs/diffusion.md "The default recipe, lever by lever" has the runs' commands.

    python benchmarks/lever_table.py runs/levers/base runs/levers/cosine ... [--threads 1] [--probe-steps 30]
    python benchmarks/lever_table.py RUN ... --no-probe     # price steps by each run's logged samples/s instead
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from common import ModelSpec, bench_trainer, run_table_args, time_trainer

THRESHOLDS = (0.95, 0.99)


@dataclass
class Curve:
    """A run's judge (the requested kind and colour) at each evaluated step, and its batch size."""

    name: str
    batch: int
    points: list[tuple[int, float]]  # (step, judge), ascending steps

    def first_step(self, threshold: float) -> int | None:
        """The first evaluated step at or above `threshold`."""
        return next((step for step, judge in self.points if judge >= threshold), None)


def read_curve(run: Path) -> Curve:
    """The judge curve of `run` from RUN/eval/*.json and its batch size from RUN/config.yaml."""
    points = []
    for path in (run / "eval").glob("*.json"):
        result = json.loads(path.read_text())
        if "judge_accuracy" in result:
            points.append((int(result["step"]), float(result["judge_accuracy"])))
    if not points:
        print(f"lever_table: {run} has no judge evaluations in {run / 'eval'} (train it with --set eval.every=N "
              "--set eval.metrics=[judge])", file=sys.stderr)
        sys.exit(2)
    batch = int(yaml.safe_load((run / "config.yaml").read_text())["train"]["batch_size"])
    return Curve(run.name, batch, sorted(points))


def logged_step_seconds(run: Path, batch: int) -> float:
    """Median seconds per step from the samples/s of RUN/metrics.jsonl (what the run measured while it trained)."""
    rates = [row["samples_per_s"] for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if "samples_per_s" in row]
    return batch / statistics.median(rates)


def probed_step_seconds(run: Path, steps: int) -> float:
    """Median seconds of the real Trainer's step of RUN's config, on a fresh trainer, `steps` steps after 2."""
    spec = ModelSpec(run.name, str(run / "config.yaml"), ())
    with bench_trainer(spec, spec.config().train.batch_size, "fp32") as trainer:
        return time_trainer(trainer, steps, 2).median_s


def cells(curve: Curve, step_s: float) -> list[str]:
    reached = [curve.first_step(t) for t in THRESHOLDS]
    steps = [str(s) if s is not None else "-" for s in reached]
    images = [f"{s * curve.batch:,}" if s is not None else "-" for s in reached]
    minutes = [f"{s * step_s / 60:.1f}" if s is not None else "-" for s in reached]
    last_step, last_judge = curve.points[-1]
    trace = " ".join(f"{judge:.2f}" for _, judge in curve.points)
    return [curve.name, *steps, *images, f"{step_s * 1000:.0f}", *minutes, f"{last_judge:.3f} @ {last_step}", trace]


HEADER = ["run", "steps to 0.95", "steps to 0.99", "images to 0.95", "images to 0.99", "ms/step",
          "minutes to 0.95", "minutes to 0.99", "last judge", "judge at each evaluation"]


def main(argv: list[str] | None = None) -> None:
    args = run_table_args(__doc__, "lever_table", 30, argv)
    rows = []
    for run in args.runs:
        curve = read_curve(run)
        step_s = (logged_step_seconds(run, curve.batch) if args.no_probe
                  else probed_step_seconds(run, args.probe_steps))
        rows.append(cells(curve, step_s))
        print(f"{run.name}: {step_s * 1000:.0f} ms/step", file=sys.stderr, flush=True)
    print("| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER))
    print("\n".join("| " + " | ".join(row) + " |" for row in rows))


if __name__ == "__main__":
    main()
