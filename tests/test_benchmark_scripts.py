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


def run_script(name: str, *args: str) -> list[list[str]]:
    """The table rows a benchmark script prints (it must exit 0)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [cells(line) for line in done.stdout.splitlines() if line.startswith("| ")]


@pytest.mark.slow  # a subprocess end to end, ~15 s
def test_gpu_ablation_tiny_prints_every_lever_and_the_loss_curve():
    rows = run_script("gpu_ablation.py", "--tiny", "--no-compile", "--threads", "2")
    step_rows = [r for r in rows if r[0] == "DiT-XL/2 (tiny)"]
    labels = [r[1] for r in step_rows]
    for label in ("genforge eager", "genforge eager, attention flash", "genforge eager, foreach AdamW",
                  "genforge eager, + host sync per phase"):
        assert label in labels, labels
    measured = [r for r in step_rows if r[1] == "genforge eager, foreach AdamW"][0]
    assert float(measured[4]) > 0 and measured[6].endswith("%")
    # a backend the CPU lacks is reported as failed, and the table goes on
    assert any(r[1] == "genforge eager, attention efficient" and r[4].startswith("failed:") for r in step_rows)
    assert [r[2] for r in step_rows if r[1] == "genforge eager"] == ["4", "4", "8"]
    assert any(r[0] == "DiT-B/2 (tiny)" for r in rows)
    assert ["DiT-XL/2 (tiny)", "facebookresearch/DiT", "4", "bf16", "not run: no --reference DIR"] in [
        r[:5] for r in rows]
    losses = [r for r in rows if r[0].isdigit()]
    assert [r[0] for r in losses] == ["1", "2", "3"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 and r[3].endswith("%") for r in losses)


@pytest.mark.slow  # a subprocess end to end, ~10 s
def test_gpu_sampling_tiny_times_genforge_and_the_reference_loop():
    rows = run_script("gpu_sampling.py", "--tiny", "--no-compile", "--threads", "2")
    genforge = [r for r in rows if r[1] == "genforge"]
    assert len(genforge) == 1 and genforge[0][2:6] == ["2", "6", "1.5", "bf16"], rows
    assert float(genforge[0][7]) > 0 and float(genforge[0][8]) > 0
    assert ["DiT-XL/2", "facebookresearch/DiT", "2", "not run: no --reference DIR"] in [r[:4] for r in rows]
