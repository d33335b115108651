"""The video tokenizer's and generator's levers as one table: for each run, what it changes from the first run,
its training steps, minutes (priced by a quiet probe of the run's own step, as benchmarks/lever_table.py does, so
whatever shared the CPU while the runs trained does not enter them), and every evaluation in RUN/eval/<step>.json
(`genforge eval RUN --metrics ...`, or the run's own `eval.every`): PSNR, the shapes judge on the reconstructions
or the generated clips (per frame, kind, colour), the motion check (direction right, clips that do not move).

    python benchmarks/video_levers.py runs/tok/base runs/tok/conv32 ...     # the first run is the reference row
    python benchmarks/video_levers.py RUN ... --no-probe                     # price steps by the logged samples/s
    python benchmarks/video_levers.py RUN ... --curve                        # every evaluation, not the last only

docs/cvivit.md ("The tokenizer, lever by lever") and docs/phenaki.md have the runs' commands and tables.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from common import run_table_args
from lever_table import logged_step_seconds, probed_step_seconds

COLUMNS = {  # header -> the result key of genforge eval
    "PSNR": "psnr",
    "judge": "judge_accuracy",
    "kind": "judge_kind_accuracy",
    "colour": "judge_colour_accuracy",
    "direction": "direction_accuracy",
    "still": "direction_still",
}
IGNORED = {"description"}  # config keys a row's "change" does not list


def flat(tree: dict, prefix: str = "") -> dict[str, object]:
    """{"model": {"dim": 128}} -> {"model.dim": 128}."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if key in IGNORED:
            continue
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_of(run: Path) -> dict[str, object]:
    return flat(yaml.safe_load((run / "config.yaml").read_text()))


def change(run: Path, reference: dict[str, object]) -> str:
    """The keys of RUN's config that differ from the reference run's, as `key=value` (paths of runs left out)."""
    mine = config_of(run)
    keys = sorted(k for k in set(mine) | set(reference) if mine.get(k) != reference.get(k)
                  and not k.startswith(("train.run_dir", "model.tokens.tokenizer")))
    return ", ".join(f"{k}={mine.get(k)}" for k in keys) or "(reference)"


def evaluations(run: Path) -> list[dict]:
    """RUN/eval/*.json by step (the same step evaluated again: the later file's keys added to the earlier's)."""
    by_step: dict[int, dict] = {}
    for path in sorted((run / "eval").glob("*.json"), key=lambda p: p.stat().st_mtime):
        result = json.loads(path.read_text())
        by_step.setdefault(int(result["step"]), {}).update(result)
    return [by_step[s] for s in sorted(by_step)]


def cell(result: dict, key: str) -> str:
    value = result.get(key)
    if value is None:
        return "-"
    return f"{value:.2f}" if key == "psnr" else f"{value:.3f}"


def main(argv: list[str] | None = None) -> None:
    args = run_table_args(__doc__, "video_levers", 20, argv, lambda parser: parser.add_argument(
        "--curve", action="store_true", help="a row for every evaluation of a run"))
    reference = config_of(args.runs[0])
    header = ["run", "change", "step", "ms/step", "minutes", *COLUMNS]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for run in args.runs:
        results = evaluations(run)
        if not results:
            print(f"video_levers: {run} has no evaluations in {run / 'eval'} (genforge eval {run} --metrics ...)",
                  file=sys.stderr)
            continue
        batch = int(config_of(run)["train.batch_size"])
        step_s = logged_step_seconds(run, batch) if args.no_probe else probed_step_seconds(run, args.probe_steps)
        for result in results if args.curve else results[-1:]:
            step = int(result["step"])
            row = [run.name, change(run, reference), str(step), f"{step_s * 1000:.0f}", f"{step * step_s / 60:.1f}",
                   *(cell(result, key) for key in COLUMNS.values())]
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
