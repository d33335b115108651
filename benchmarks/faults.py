"""Fault-injection sweeps (the fast versions run in `make test`; these are the full counts).

    python benchmarks/faults.py kill-resume --trials 20       # kill -9 at random moments, resume, compare
    python benchmarks/faults.py kill-checkpoint --trials 100  # kill -9 during checkpoint writes
    python benchmarks/faults.py teeth                         # dropping any piece of state breaks the match

Prints one line per trial and a total N/N.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from kill_harness import KILL_RUN, kill_checkpoint_trial, kill_resume_trial, run, train_argv


def kill_resume(trials: int, seed: int, work: Path) -> int:
    reference = work / "reference"
    start = time.monotonic()
    done = run(train_argv(reference, KILL_RUN))
    if done.returncode:
        sys.exit(done.stderr)
    seconds = time.monotonic() - start
    rng, ok = random.Random(seed), 0
    for trial in range(trials):
        result = kill_resume_trial(reference, work / f"trial{trial}", rng, seconds)
        ok += result["ok"]
        print(f"trial {trial:3d}: {'identical' if result['ok'] else 'DIFFERENT'}  {result['how']}"
              + (f"  {result.get('error', '')}" if not result["ok"] else ""), flush=True)
    print(f"kill -9 + resume, bit-identical per-step loss and final weights: {ok}/{trials}")
    return ok == trials


def kill_checkpoint(trials: int, seed: int, work: Path) -> int:
    rng, ok, debris = random.Random(seed), 0, 0
    for trial in range(trials):
        result = kill_checkpoint_trial(work / "run", rng)
        ok += result["ok"]
        debris += bool(result.get("debris"))
        print(f"trial {trial:3d}: latest={result.get('latest')} {'loadable' if result['ok'] else 'TORN'} "
              f"debris={result.get('debris', [])} {result.get('error', '')}", flush=True)
    print(f"kill -9 during checkpoint writes: {ok}/{trials} loadable latest, 0 torn = {ok == trials}; "
          f"{debris} kills left half-written debris, cleaned at the next start")
    return ok == trials


def teeth() -> int:
    import pytest

    here = Path(__file__).resolve().parents[1] / "tests" / "engine" / "test_resume_state.py"
    return pytest.main(["-q", f"{here}::test_resume_needs_every_piece_of_state"]) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", choices=["kill-resume", "kill-checkpoint", "teeth"])
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="genforge-faults-") as tmp:
        if args.sweep == "kill-resume":
            ok = kill_resume(args.trials or 20, args.seed, Path(tmp))
        elif args.sweep == "kill-checkpoint":
            ok = kill_checkpoint(args.trials or 100, args.seed, Path(tmp))
        else:
            ok = teeth()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
