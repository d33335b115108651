"""benchmarks/gpu.py's code path on the CPU, so that a session with a GPU only has to run it: `--tiny` prints every
row of the table (the real Trainer step of both DiTs, the reference's rows, MaskGIT sampling at batch 1 and 32); and
benchmarks/prior_text_cache.py on the debug presets. The figures are printed, never judged."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


@pytest.mark.slow  # a subprocess end to end, ~15 s
def test_gpu_table_tiny_prints_every_row():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--tiny", "--threads", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [cells(line) for line in done.stdout.splitlines() if line.startswith("| ")]
    for model in ("DiT-XL/2 (tiny)", "DiT-B/2 (tiny)"):
        genforge = [r for r in rows if r[:4] == [model, "genforge", "4", "bf16"]]
        assert len(genforge) == 1, done.stdout
        ms, images, mfu, memory, stall = genforge[0][4:9]
        assert float(ms) > 0 and float(images) > 0 and mfu.endswith("%") and memory == "n/a (CPU)"
        assert stall.endswith("%")
        assert [model, "facebookresearch/DiT", "4", "bf16", "not run: no --reference DIR"] in [r[:5] for r in rows]
    maskgit = [r for r in rows if r[0].startswith("MaskGIT 2x64")]
    assert [r[1] for r in maskgit] == ["1", "32"] and all(float(r[4]) > 0 for r in maskgit), done.stdout


@pytest.mark.slow  # a subprocess end to end, ~15 s
def test_prior_text_cache_prints_every_row():
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "prior_text_cache.py"), "--clip-preset",
                           "clip-debug", "--prior", "dalle2-prior-debug", "--steps", "2", "--warmup", "1", "--n", "16"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [cells(line) for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert [r[:2] for r in rows] == [["images", "both towers"], ["cache: image embeddings", "text tower"],
                                     ["cache: + text states", "neither"]], done.stdout
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)
