"""The Python API (genforge.app.api): the README's example runs as written, `Run.sample` and `Run.evaluate` give what
`genforge sample` and `genforge eval` give (one code path), options are validated naming them, `train` takes a
RunConfig, and `import genforge` stays light."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import genforge
from genforge.app.config import ConfigError, load_config
from genforge.cli import app
from genforge.data.images import to_uint8
from genforge.engine.logging import write_samples
from genforge.eval import metrics as metrics_module
from genforge.sampling import generate
from genforge.core.config import SampleOptions
from eval.eval_standins import TinyFeatures

ROOT = Path(__file__).parents[2]
runner = CliRunner()


def readme_blocks() -> list[str]:
    """The ```python blocks of the README's "Python API" section, in order."""
    section = (ROOT / "README.md").read_text().split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, dict]:
    """The README's first Python block executed as written in an empty folder: (the folder, its variables)."""
    cwd, here = tmp_path_factory.mktemp("readme"), os.getcwd()
    namespace: dict = {}
    os.chdir(cwd)
    try:
        exec(compile(readme_blocks()[0], "README.md", "exec"), namespace)
    finally:
        os.chdir(here)
    return cwd, namespace


def test_the_readme_example_runs_as_written(demo):
    cwd, ns = demo
    assert ns["run_dir"] == Path("runs/api-demo") and (cwd / "runs/api-demo/checkpoints/latest").is_file()
    run, images, samples = ns["run"], ns["images"], ns["samples"]
    assert (run.family, run.step, run.device) == ("diffusion", 6, "cuda" if torch.cuda.is_available() else "cpu")
    assert samples.shape == (4, 3, 16, 16) and samples.dtype == torch.float32 and samples.abs().max() <= 1
    assert len(images) == 4 and all(isinstance(i, Image.Image) and i.size == (16, 16) for i in images)
    for image, tensor in zip(images, samples):  # the PIL images are the tensor's pixels
        assert np.array_equal(np.asarray(image), to_uint8(tensor).movedim(0, -1).numpy())
    assert Image.open(cwd / "api-demo.png").size == (16, 16)


def test_sample_draws_what_genforge_sample_draws(demo, tmp_path):
    cwd, _ = demo
    run_dir = cwd / "runs/api-demo"
    run = genforge.load_run(run_dir, device="cpu")
    options = {"label": 2, "steps": 4, "cfg_scale": 1.5}
    samples = run.sample(n=4, seed=3, **options)
    assert torch.equal(samples, generate(run.task, 4, 3, "cpu", options=SampleOptions(**options))[0])
    out = runner.invoke(app, ["sample", str(run_dir), "--n", "4", "--seed", "3", "--label", "2", "--steps", "4",
                              "--cfg-scale", "1.5", "--out", str(tmp_path / "cli.png")])
    assert out.exit_code == 0, out.output
    cond = run.task.sample_conditions(4, torch.Generator().manual_seed(3), run.task.resolve(SampleOptions(**options)))
    write_samples(run.task, cond, samples, tmp_path / "api.png")
    assert np.array_equal(np.asarray(Image.open(tmp_path / "cli.png")), np.asarray(Image.open(tmp_path / "api.png")))


@pytest.mark.parametrize("options, message", [
    ({"frames": 9}, "frames does not apply to a 'diffusion' model (it is an option of phenaki models)"),
    ({"image": torch.zeros(1, 3, 16, 16)}, "image does not apply to a 'diffusion' model"),
    ({"critic": False}, "critic does not apply to a 'diffusion' model"),
    ({"temperature": 2.0}, "temperature does not apply to a 'diffusion' model (it is an option of maskgit, phenaki"),
    ({"guidance": 2.0}, "guidance: no such sample option; those of 'diffusion' models: none"),
    ({"steps": 0}, "steps 0: Input should be greater than or equal to 1"),
    ({"cfg_scale": float("inf")}, "cfg_scale inf:"),
    ({"label": 99}, "--label 99: allowed 0..15"),  # the task's own check
    ({"prompt": "a red circle"}, "prompt/prompts/negative_prompt: this 'diffusion' model is not text-conditioned"),
    ({"precision": "fp16"}, "precision fp16 needs a CUDA GPU"),
    ({"output": "jpg"}, "output 'jpg': allowed 'tensor', 'pil'"),
])
def test_a_bad_option_raises_naming_it(demo, options, message):
    if options.get("precision") == "fp16" and torch.cuda.is_available():
        pytest.skip("fp16 runs on a CUDA GPU")
    run = genforge.load_run(demo[0] / "runs/api-demo", device="cpu")
    with pytest.raises(ValueError) as err:
        run.sample(n=2, **options)
    assert message in str(err.value)


def test_evaluate_returns_the_scores_of_genforge_eval(demo, monkeypatch):
    cwd, ns = demo
    monkeypatch.setattr(metrics_module, "feature_network", lambda device: TinyFeatures())
    monkeypatch.chdir(cwd)
    variables = dict(ns)
    exec(compile(readme_blocks()[1], "README.md", "exec"), variables)  # the README's evaluate line
    scores = variables["scores"]
    assert {"n", "sampler", "fid", "kid_mean", "kid_std", "autocast"} <= set(scores) and scores["n"] == 32
    assert not (cwd / "runs/api-demo/eval").exists()  # written only with write=True

    run = genforge.load_run("runs/api-demo", device="cpu")
    results = run.evaluate("fid", n=8, seed=1, steps=2, write=True)
    written = json.loads((cwd / "runs/api-demo/eval/6.json").read_text())
    assert written == {"step": 6, **json.loads(json.dumps(results))}
    out = runner.invoke(app, ["eval", "runs/api-demo", "--metrics", "fid", "--n", "8", "--seed", "1", "--steps", "2"])
    assert out.exit_code == 0, out.output
    assert json.loads((cwd / "runs/api-demo/eval/6.json").read_text()) == written  # the CLI's scores: the same
    with pytest.raises(ValueError, match="critic does not apply to a 'diffusion' model"):
        run.evaluate("fid", n=8, critic=False)


def test_train_takes_a_run_config_and_overrides(tmp_path):
    cfg = load_config("dit-debug")
    overrides = ["train.steps=2", "train.checkpoint_every=2", "train.sample_every=0"]
    run_dir = genforge.train(cfg, overrides, run_dir=tmp_path / "run")
    assert run_dir == tmp_path / "run" and genforge.load_run(run_dir, device="cpu").step == 2
    with pytest.raises(ConfigError, match="train.lr"):
        genforge.train(cfg, ["train.lr=-1"], run_dir=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_two_runs_of_other_precisions_train_in_one_python_process(tmp_path):
    """genforge.train twice in one process (a notebook: a float32 run, then the default preset, bf16 where the CPU has
    it natively): accelerate's one state per process would refuse the second precision; each run gets its own."""
    base = ["train.steps=1", "train.sample_every=0", "train.checkpoint_every=1", "data.num_workers=0"]
    for precision in ("no", "bf16", "no"):
        out = genforge.train("dit-debug", [*base, f"train.precision={precision}"], run_dir=tmp_path / precision,
                             fresh=True)
        assert load_config(str(out / "config.yaml")).train.precision == precision


def test_import_genforge_stays_light():
    """`import genforge` (run by every submodule's import) loads neither the API nor torch; the names load on use."""
    code = ("import sys, genforge; assert 'torch' not in sys.modules and 'genforge.app.api' not in sys.modules; "
            "assert {'load_run', 'train', 'Run'} <= set(dir(genforge))")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert genforge.Run is genforge.load_run.__globals__["Run"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        genforge.nope  # noqa: B018
