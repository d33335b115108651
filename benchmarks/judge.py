"""Train the shapes judge with its defaults; print wall time and held-out accuracy (target >= 0.98 in < 120 s).

    python benchmarks/judge.py [--threads 2]            # train, report, compare with the shipped file
    python benchmarks/judge.py --write                  # the same, then write the shipped file (SHIPPED_JUDGE)

The training is seeded (data, initialisation, batches, augmentation), so a rerun on the same torch build and thread
count gives the same weights bit for bit; the script says whether they equal the shipped file's. `--write` refuses
a judge below 0.98 held-out accuracy; a judge with other weights than a shipped one needs a new JUDGE_VERSION
(genforge/eval/judge.py) rather than overwriting it, so that older scores stay comparable.
"""

import argparse
import time

import torch
from safetensors.torch import load_file

from genforge.eval.judge import HELDOUT_IMAGES, JUDGE_VERSION, SHIPPED_JUDGE, ShapesJudge, save_judge, train_judge

MIN_ACCURACY = 0.98


def differences(judge: ShapesJudge, path: str) -> str:
    """How `judge`'s weights compare with those in the safetensors file at `path`."""
    shipped, ours = load_file(path), judge.state_dict()
    if shipped.keys() != ours.keys():
        return "other tensor names"
    worst = max((ours[k].double() - shipped[k].double()).abs().max().item() for k in ours)
    same = all(torch.equal(ours[k], shipped[k]) for k in ours)
    return "identical, bit for bit" if same else f"different (largest difference {worst:.3g})"


def main() -> None:
    """Train, report, and with --write save the shipped judge."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", action="store_true", help=f"write the judge to {SHIPPED_JUDGE}")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    judge, accuracy = train_judge()
    elapsed = time.perf_counter() - start
    print(f"judge {JUDGE_VERSION}: held-out accuracy {accuracy:.4f} on {HELDOUT_IMAGES} images, trained in "
          f"{elapsed:.1f} s ({args.threads} threads, torch {torch.__version__})")
    if SHIPPED_JUDGE.is_file():
        print(f"against the shipped {SHIPPED_JUDGE.name}: {differences(judge, str(SHIPPED_JUDGE))}")
    if args.write:
        if accuracy < MIN_ACCURACY:
            raise SystemExit(f"not written: held-out accuracy {accuracy:.4f} < {MIN_ACCURACY}")
        save_judge(judge, SHIPPED_JUDGE)
        print(f"wrote {SHIPPED_JUDGE} ({SHIPPED_JUDGE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
