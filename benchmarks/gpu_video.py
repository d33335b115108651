"""The video models on one GPU in a fixed wall-time budget (issue 50, part 3): C-ViViT tokenizers on moving shapes,
then Phenaki over each, evaluated with the CLI, as one markdown table and each run's curve.

    python benchmarks/gpu_video.py --budget-s 210 --out DIR [--minilm DIR] [--work /tmp/gpu-video]
    python benchmarks/gpu_video.py --budget-s 100 --out DIR --tiny    # tiny models, a few steps: the path on a CPU

Two tokenizer variants train at once, each in its own process with its own data workers (models this small leave
the GPU mostly idle): `cvivit-moving-shapes-gpu` (2x2 patches) and the CPU preset's 4x4 patching at width 256
(VARIANTS). Each variant is a pipeline of `genforge` subprocesses:

1. a probe of the tokenizer: PROBE_STEPS steps with the GAN from step 0 (the full two-phase step) and an evaluation
   at its end, in a run directory of its own: the step time, the start-up (process, data workers, compile) and the
   evaluation's time, read from its metrics.jsonl;
2. the tokenizer run, its `train.steps` set (`--set train.steps=N`, so the cosine schedule ends there) to end at
   TOKENIZER_SHARE of the budget, the GAN from 0.6 N as in the CPU preset; meanwhile a probe of Phenaki over the
   probe's tokenizer (same layout) times Phenaki's step, start-up and evaluation;
3. `genforge eval TOKENIZER --metrics recon_judge,recon_direction --n 128` (the ceiling) beside Phenaki's run, whose
   steps are set to end where the budget leaves time for its evaluation;
4. `genforge eval PHENAKI --metrics judge,direction --n 128`.

Every subprocess runs under a hard limit that ends before the budget (SIGTERM: genforge checkpoints and stops; then
SIGKILL); a stage that fails or runs out of time leaves its cells "failed"/"not run" and the others are still
reported. Writes DIR/video.md (the table, the curves, what each stage took) and DIR/phenaki-<variant>.gif (the final
preview of the Phenaki run with the best judge); the runs stay under --work. Without a GPU (nvidia-smi) the runs
are fp32 and not compiled.

DIR/video.md is rewritten (whole, then renamed over the last one) every `--snapshot-s` seconds while the runs go
and once more at the end, so a call cut at its limit returns the finished stages and the curves so far; on SIGTERM
(the `timeout` of benchmarks/gpu_session.sh) the running subprocesses are stopped (they checkpoint), video.md is
written and the script exits 143.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

TOKENIZER_PRESET, GENERATOR_PRESET = "cvivit-moving-shapes-gpu", "phenaki-moving-shapes-gpu"
# variant -> tokenizer overrides of TOKENIZER_PRESET (Phenaki over each is GENERATOR_PRESET as it is)
VARIANTS = {
    "p2": [],  # the preset: 2x2 patches, 3x16x16 ids
    "p4-w256": ["model.patch_size=4", "model.dim=256", "model.num_heads=8"],  # the CPU preset's 3x8x8 ids, wider
}
TINY_TOKENIZER = ["data.image_size=16", "model.dim=32", "model.num_heads=2", "model.spatial_depth=1",
                  "model.temporal_depth=1", "model.quantizer.codebook_size=64", "model.gan.channels=16",
                  "data.shapes.n=256", "data.num_workers=1", "train.batch_size=4", "train.warmup_steps=2",
                  "train.log_every=1", "eval.n=8"]
TINY_GENERATOR = ["data.image_size=16", "model.depth=1", "model.width=32", "model.num_heads=2",
                  "model.sample_steps=2", "data.shapes.n=256", "data.num_workers=1", "train.batch_size=4",
                  "train.warmup_steps=2", "train.num_samples=4", "train.log_every=1"]
CPU_SETTINGS = ["train.precision=no", "train.compile=false"]  # no GPU: fp32 eager (bf16 is emulated on CPUs)
TOKENIZER_SHARE = 0.45  # the tokenizers' runs end by this share of the budget; Phenaki gets the rest
GAN_START = 0.6  # the GAN starts at this share of the tokenizer's steps (cvivit-moving-shapes: 1200 of 2000)
CURVE_POINTS = 4  # in-run evaluations (eval.every = steps / CURVE_POINTS)
GENERATOR_CURVE_N = 64  # clips of Phenaki's in-run evaluations (the final CLI evaluation: EVAL_N)
EVAL_N = 128
MARGIN_S = 4.0  # kept free before each deadline
CONTENTION = 0.85  # share of its time the tokenizer's plan counts on while Phenaki's probe runs beside it
SNAPSHOT_S = 15.0  # video.md is rewritten this often while the runs go
COMPILER_ERROR = re.compile(r"torch\._dynamo|torch\._inductor|triton|InductorError|BackendCompilerFailed", re.I)
TABLE = ["run", "tokenizer ceiling (recon judge per frame)", "judge per frame", "kind", "colour", "direction right",
         "still", "steps x batch", "train minutes", "GPU"]
CURVE_KEYS = {  # short column name -> eval key
    "tokenizer": {"PSNR": "psnr", "SSIM": "ssim", "codebook usage": "codebook_usage", "recon judge": "judge_accuracy",
                  "recon kind": "judge_kind_accuracy"},
    "phenaki": {"judge": "judge_accuracy", "kind": "judge_kind_accuracy", "colour": "judge_colour_accuracy",
                "direction right": "direction_accuracy", "still": "direction_still"},
}


# the subprocesses running now, and whether the script is stopping (SIGTERM): no new one starts then
RUNNING: set[subprocess.Popen] = set()
LAUNCH = threading.Lock()
STOPPING = threading.Event()


@dataclass
class Settings:
    budget_s: float
    work: Path
    tiny: bool
    gpu: bool
    minilm: Path | None
    probe_steps: int
    log_every: int
    max_steps: int | None  # --tiny: a few steps whatever the budget allows
    t0: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def at(self, share: float) -> float:
        """Seconds from now to `share` of the budget."""
        return share * self.budget_s - (time.monotonic() - self.t0)


@dataclass
class Probe:
    """What a probe run measured: seconds per step (after the first logged steps), from launch to the first
    logged step less those steps (process, data, compile), and one evaluation (with the sample grid before it)."""
    step_s: float
    startup_s: float
    eval_s: float

    def steps_for(self, seconds: float, evals: int) -> int:
        return int((seconds - self.startup_s - evals * self.eval_s) / self.step_s)


@dataclass
class Stage:
    """One subprocess: its name, wall time, exit status and log."""
    name: str
    seconds: float = 0.0
    status: str = "not run"
    log: Path | None = None


class Pipeline:
    """One variant: tokenizer probe -> tokenizer (+ Phenaki probe) -> ceiling eval (+ Phenaki) -> Phenaki eval."""

    def __init__(self, variant: str, settings: Settings) -> None:
        self.variant, self.s = variant, settings
        self.stages: list[Stage] = []
        self.notes: list[str] = []
        root = settings.work / variant
        self.tok_probe, self.tok, self.gen_probe, self.gen = (root / "tokenizer-probe", root / "tokenizer",
                                                              root / "phenaki-probe", root / "phenaki")
        self.ceiling: dict | None = None
        self.scores: dict | None = None
        self.tok_minutes = self.gen_minutes = 0.0
        self.lock = threading.Lock()
        self.tokenizer_eager: list[str] = []  # ["train.compile=false"] once a compiled probe failed in the compiler
        self.generator_eager: list[str] = []

    # ----------------------------------------------------------------------------------------- overrides
    def tokenizer_overrides(self) -> list[str]:
        return [*VARIANTS[self.variant], *(TINY_TOKENIZER if self.s.tiny else []),
                *([] if self.s.gpu else CPU_SETTINGS), *self.tokenizer_eager]

    def generator_overrides(self, tokenizer: Path) -> list[str]:
        text = [f"model.text.path={self.s.minilm}"] if self.s.minilm else []
        return [f"model.tokens.tokenizer={tokenizer}", *text, *(TINY_GENERATOR if self.s.tiny else []),
                *([] if self.s.gpu else CPU_SETTINGS), *self.generator_eager]

    # ----------------------------------------------------------------------------------------- running
    def run(self, name: str, args: list[str], limit_s: float) -> Stage:
        """`python -m genforge ARGS` under a hard limit (never past the budget); output to WORK/VARIANT/NAME.log."""
        stage = Stage(name, log=self.s.work / self.variant / f"{name}.log")
        with self.lock:
            self.stages.append(stage)
        limit_s = min(limit_s, self.s.left() - 1.0)
        if limit_s <= 1.0:
            stage.status = "skipped: no time left"
            return stage
        stage.log.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with open(stage.log, "w") as log:
            log.write(f"$ genforge {' '.join(args)}\n")
            log.flush()
            with LAUNCH:
                if STOPPING.is_set():
                    stage.status = "skipped: stopping"
                    return stage
                proc = subprocess.Popen([sys.executable, "-m", "genforge", *args], stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True, env=subprocess_env(self.s))
                RUNNING.add(proc)
            stage.status = "running"
            try:
                code = proc.wait(timeout=limit_s)
                stage.status = "ok" if code == 0 else f"exit {code}"
            except subprocess.TimeoutExpired:
                stage.status = f"stopped at its limit ({limit_s:.0f} s)"
                end_group(proc)
            finally:
                with LAUNCH:
                    RUNNING.discard(proc)
        stage.seconds = time.monotonic() - start
        if stage.status != "ok":
            tail = stage.log.read_text(errors="replace").splitlines()[-12:]
            self.notes.append(f"{name}: {stage.status}; the end of {stage.log}:\n\n    " + "\n    ".join(tail) + "\n")
            print(f"[{self.variant}] {self.notes[-1]}", flush=True)
        else:
            print(f"[{self.variant}] {name}: ok in {stage.seconds:.1f} s", flush=True)
        return stage

    def train(self, name: str, preset: str, run_dir: Path, overrides: list[str], limit_s: float) -> Stage:
        sets = [arg for item in overrides for arg in ("--set", item)]
        return self.run(name, ["train", preset, "--run-dir", str(run_dir), *sets], limit_s)

    def train_probe(self, name: str, preset: str, run_dir: Path, overrides: list[str], limit_s: float,
                    eager: list[str]) -> Stage:
        """A probe run; when it fails in torch.compile (dynamo, inductor, Triton in its log), once more eager, and
        `eager` takes train.compile=false for the variant's run of that model."""
        start = time.monotonic()
        stage = self.train(name, preset, run_dir, overrides, limit_s)
        failed_compiling = stage.log.exists() and COMPILER_ERROR.search(stage.log.read_text(errors="replace"))
        if stage.status == "ok" or not failed_compiling:
            return stage
        eager.append("train.compile=false")
        self.notes.append(f"{name}: failed in torch.compile; once more with train.compile=false")
        shutil.rmtree(run_dir, ignore_errors=True)
        return self.train(f"{name}-eager", preset, run_dir, [*overrides, *eager],
                          limit_s - (time.monotonic() - start))

    def evaluate(self, name: str, run_dir: Path, metrics: str) -> tuple[Stage, dict | None]:
        """`genforge eval RUN --metrics M --n EVAL_N`: the scores it wrote (RUN/eval/<step>.json, named in its
        output)."""
        n = 8 if self.s.tiny else EVAL_N
        stage = self.run(name, ["eval", str(run_dir), "--metrics", metrics, "--n", str(n)], self.s.left())
        if stage.status != "ok":
            return stage, None
        written = re.findall(r"^wrote (.+\.json)$", stage.log.read_text(), flags=re.MULTILINE)
        if not written:
            stage.status = "no 'wrote ...json' line in its output"
            return stage, None
        return stage, json.loads(Path(written[-1]).read_text())

    def probe(self, stage: Stage, run_dir: Path) -> Probe | None:
        if stage.status != "ok":
            return None
        try:
            measured = read_probe(run_dir / "metrics.jsonl", stage)
        except ValueError as err:
            self.notes.append(f"{stage.name}: {err}")
            return None
        self.notes.append(f"{stage.name}: {measured.step_s * 1000:.1f} ms/step, start-up {measured.startup_s:.1f} s, "
                          f"evaluation {measured.eval_s:.1f} s")
        return measured

    def planned_steps(self, what: str, measured: Probe | None, seconds: float) -> int:
        """Steps that fit `seconds` by the probe (with CURVE_POINTS evaluations); the preset's own when the probe
        failed is not guessed: the probe's step count (the run still happens, and says so)."""
        if measured is None:
            self.notes.append(f"{what}: no probe measurement; {self.s.probe_steps} steps")
            return self.s.probe_steps
        steps = measured.steps_for(seconds, CURVE_POINTS)
        planned = max(steps, self.s.probe_steps)
        if self.s.max_steps is not None:
            planned = min(planned, self.s.max_steps)
        fit = (f"fit {steps} steps by the probe" if steps > 0 else
               "is less than the probe's start-up and evaluation: the budget is too small for this part")
        self.notes.append(f"{what}: {seconds:.0f} s {fit}; trains {planned}")
        return planned

    def probe_cadence(self) -> list[str]:
        p = self.s.probe_steps
        return [f"train.steps={p}", f"train.log_every={self.s.log_every}", f"eval.every={p}",
                f"train.checkpoint_every={p}"]

    def cadence(self, steps: int) -> list[str]:
        every = max(1, -(-steps // CURVE_POINTS))
        return [f"train.steps={steps}", f"eval.every={every}", f"train.checkpoint_every={every}"]

    # ----------------------------------------------------------------------------------------- the pipeline
    def __call__(self) -> None:
        try:
            self.pipeline()
        except Exception as err:  # noqa: BLE001 - one variant failing must leave the other's figures
            self.notes.append(f"pipeline stopped: {type(err).__name__}: {err}")
            print(f"[{self.variant}] pipeline stopped: {type(err).__name__}: {err}", flush=True)

    def pipeline(self) -> None:
        s = self.s
        tok_deadline = lambda: s.at(TOKENIZER_SHARE)  # noqa: E731
        stage = self.train_probe("tokenizer-probe", TOKENIZER_PRESET, self.tok_probe,
                                 [*self.tokenizer_overrides(), *self.probe_cadence(), "model.gan.start_step=0"],
                                 tok_deadline(), self.tokenizer_eager)
        tok_probe = self.probe(stage, self.tok_probe)
        gen_probe_result: list[Probe | None] = [None]

        def probe_generator() -> None:  # Phenaki's step over the probe's tokenizer (same layout), meanwhile
            if stage.status != "ok":
                return
            probed = self.train_probe("phenaki-probe", GENERATOR_PRESET, self.gen_probe,
                                      [*self.generator_overrides(self.tok_probe), *self.probe_cadence(),
                                       f"eval.n={8 if s.tiny else GENERATOR_CURVE_N}"], s.at(1.0),
                                      self.generator_eager)
            gen_probe_result[0] = self.probe(probed, self.gen_probe)

        gen_prober = threading.Thread(target=probe_generator)
        gen_prober.start()
        # Phenaki's probe shares the GPU and the cores with this run for a while: CONTENTION of the time
        tok_steps = self.planned_steps("tokenizer", tok_probe, CONTENTION * (tok_deadline() - MARGIN_S))
        tokenizer = self.train("tokenizer", TOKENIZER_PRESET, self.tok,
                               [*self.tokenizer_overrides(), *self.cadence(tok_steps),
                                f"model.gan.start_step={int(GAN_START * tok_steps)}"],
                               tok_deadline() + 0.1 * s.budget_s)
        self.tok_minutes = tokenizer.seconds / 60
        gen_prober.join()
        if not (self.tok / "checkpoints" / "latest").exists():
            self.notes.append("no tokenizer checkpoint: Phenaki not run")
            return
        ceiling_thread = threading.Thread(target=self.ceiling_eval)
        ceiling_thread.start()
        gen_probe = gen_probe_result[0]
        # Phenaki's evaluation at the end: a start-up and EVAL_N clips (the probe evaluated GENERATOR_CURVE_N); a
        # run past its plan is stopped in time for it
        final_eval_s = (gen_probe.startup_s + gen_probe.eval_s * EVAL_N / GENERATOR_CURVE_N) if gen_probe else 0.0
        gen_steps = self.planned_steps("phenaki", gen_probe, s.left() - final_eval_s - 2 * MARGIN_S)
        generated = self.train("phenaki", GENERATOR_PRESET, self.gen,
                               [*self.generator_overrides(self.tok), *self.cadence(gen_steps),
                                f"eval.n={8 if s.tiny else GENERATOR_CURVE_N}"], s.left() - final_eval_s - MARGIN_S)
        self.gen_minutes = generated.seconds / 60
        if (self.gen / "checkpoints" / "latest").exists():
            self.scores = self.evaluate("phenaki-eval", self.gen, "judge,direction")[1]
        ceiling_thread.join()

    def ceiling_eval(self) -> None:
        self.ceiling = self.evaluate("tokenizer-eval", self.tok, "recon_judge,recon_direction")[1]


# --------------------------------------------------------------------------------------------- helpers
def subprocess_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2" if settings.gpu else "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the subprocess and its data workers (genforge checkpoints and stops), SIGKILL after 5 s."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def read_probe(path: Path, stage: Stage) -> Probe:
    """Step time between the second logged step and the last (the first steps compile), start-up as the wall time
    to the first logged step less its steps, evaluation as the time from the last step's log to its eval entry."""
    rows = read_metrics(path)
    logged = [r for r in rows if "lr" in r]
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    if len(logged) < 3 or not evals:
        raise ValueError(f"{path}: {len(logged)} logged steps and {len(evals)} evaluations, too few to time")
    first, second, last = logged[0], logged[1], logged[-1]
    step_s = (last["time"] - second["time"]) / (last["step"] - second["step"])
    eval_s = max(evals[-1]["time"] - last["time"], 0.0)
    # the wall time less the logged steps after the first and the evaluation: process, data workers, compile, the
    # first logged steps, the checkpoint and the exit (a run of N steps takes about startup + N steps + evaluations)
    startup_s = max(stage.seconds - (last["time"] - first["time"]) - eval_s, 0.0)
    return Probe(step_s, startup_s, eval_s)


def trained(run_dir: Path) -> str:
    """'STEPS x BATCH' of the run's latest checkpoint, or 'none'."""
    latest = run_dir / "checkpoints" / "latest"
    if not latest.exists():
        return "none"
    state = json.loads((run_dir / "checkpoints" / latest.read_text().strip() / "trainer_state.json").read_text())
    batch = yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["batch_size"]
    return f"{state['step']} x {batch}"


def gpu_name() -> str | None:
    """The GPU's name from nvidia-smi, None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    names = done.stdout.strip().splitlines()
    return names[0].strip() if done.returncode == 0 and names else None


def cell(scores: dict | None, key: str) -> str:
    if scores is None:
        return "failed"
    value = scores.get(key)
    return f"{value:.3f}" if isinstance(value, (int, float)) else "–"


def markdown(rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(str(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows[1:]]


def curve(run_dir: Path, kind: str) -> list[str]:
    """The run's own periodic evaluations (metrics.jsonl's eval/ entries) as a table."""
    keys = CURVE_KEYS[kind]
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if any(k.startswith("eval/") for k in r)]
    if not rows:
        return ["(no evaluations logged)"]
    return markdown([["step", *keys], *[[r["step"], *[cell({k: r.get(f"eval/{v}") for k, v in keys.items()}, k)
                                                       for k in keys]] for r in rows]])


def report(pipelines: list[Pipeline], settings: Settings, gpu: str) -> str:
    rows: list[list[object]] = [TABLE]
    for p in pipelines:
        steps = f"tokenizer {trained(p.tok)}, phenaki {trained(p.gen)}"
        rows.append([f"{p.variant}: {TOKENIZER_PRESET} + {GENERATOR_PRESET}", cell(p.ceiling, "judge_accuracy"),
                     cell(p.scores, "judge_accuracy"), cell(p.scores, "judge_kind_accuracy"),
                     cell(p.scores, "judge_colour_accuracy"), cell(p.scores, "direction_accuracy"),
                     cell(p.scores, "direction_still"), steps,
                     f"{p.tok_minutes:.2f} + {p.gen_minutes:.2f}", gpu])
    lines = [f"Video models in a {settings.budget_s:.0f} s budget (benchmarks/gpu_video.py"
             f"{' --tiny' if settings.tiny else ''}); evaluations: `genforge eval` with --n "
             f"{8 if settings.tiny else EVAL_N}; variants: " +
             "; ".join(f"{v}: {' '.join(o) or 'the preset'}" for v, o in VARIANTS.items()), "",
             *markdown(rows)]
    for p in pipelines:
        lines += ["", f"Curve of {p.variant}'s tokenizer (its eval.every):", "", *curve(p.tok, "tokenizer"),
                  "", f"Curve of {p.variant}'s Phenaki (its eval.every, n {8 if settings.tiny else GENERATOR_CURVE_N}):",
                  "", *curve(p.gen, "phenaki")]
    lines += ["", "Stages:", ""]
    lines += markdown([["variant", "stage", "status", "seconds"],
                       *[[p.variant, st.name, st.status, f"{st.seconds:.1f}"] for p in pipelines for st in p.stages]])
    lines += ["", *[f"- {p.variant}: {note}" for p in pipelines for note in p.notes]]
    return "\n".join(lines) + "\n"


def best_gif(pipelines: list[Pipeline], out: Path) -> Path | None:
    """The final preview GIF of the Phenaki run with the best judge, copied to OUT."""
    scored = [p for p in pipelines if p.scores is not None]
    for p in sorted(scored, key=lambda p: -p.scores.get("judge_accuracy", 0.0)):
        previews = sorted((p.gen / "samples").glob("step-*.gif"))
        if previews:
            target = out / f"phenaki-{p.variant}.gif"
            shutil.copyfile(previews[-1], target)
            return target
    return None


def write_report(pipelines: list[Pipeline], settings: Settings, gpu: str, out: Path, final: bool = False) -> str:
    """DIR/video.md as it stands (at the end: with the best run's GIF), written whole and renamed over the last
    one; its text."""
    text = report(pipelines, settings, gpu)
    if final:
        gif = best_gif(pipelines, out)
        if gif is not None:
            text += f"\nSamples (the final preview of the best Phenaki run, held-out captions): {gif.name}\n"
    else:
        text += f"\n(written while the runs go, {time.monotonic() - settings.t0:.0f} s into the budget)\n"
    partial = out / ".video.md.partial"
    partial.write_text(text)
    os.replace(partial, out / "video.md")
    return text


def stop_running() -> None:
    """No new subprocess starts; the running ones are stopped (SIGTERM: they checkpoint; then SIGKILL)."""
    STOPPING.set()
    with LAUNCH:
        procs = list(RUNNING)
    for proc in procs:
        end_group(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, required=True, help="wall seconds for everything")
    parser.add_argument("--out", type=Path, required=True, help="video.md and one GIF go here")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-video"), help="run directories and logs")
    parser.add_argument("--minilm", type=Path, help="a local all-MiniLM-L6-v2 folder (model.text.path)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--snapshot-s", type=float, default=SNAPSHOT_S, help="rewrite video.md this often")
    parser.add_argument("--tiny", action="store_true", help="tiny models, a few steps: the code path on a CPU")
    args = parser.parse_args()
    gpu = gpu_name()
    settings = Settings(args.budget_s, args.work, args.tiny, gpu is not None, args.minilm,
                        probe_steps=4 if args.tiny else 60, log_every=1 if args.tiny else 5,
                        max_steps=8 if args.tiny else None)
    if args.work.exists():
        shutil.rmtree(args.work)  # fresh runs: a run directory left from before would resume
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"gpu_video: {gpu or 'no GPU (fp32, not compiled)'}; budget {args.budget_s:.0f} s; variants "
          f"{', '.join(args.variants)}; runs in {args.work}", flush=True)
    pipelines = [Pipeline(v, settings) for v in args.variants]

    def snapshot() -> str:
        try:
            return write_report(pipelines, settings, gpu or "CPU", args.out)
        except Exception as err:  # noqa: BLE001 - a run writing its files meanwhile: the next snapshot
            return f"(snapshot failed: {type(err).__name__}: {err})"

    def stop(signum: int, frame: object) -> None:
        stop_running()
        snapshot()
        print(f"gpu_video: stopped by signal {signum}; wrote {args.out / 'video.md'}", flush=True)
        os._exit(128 + signum)  # the pipelines' threads hold no subprocess any more

    signal.signal(signal.SIGTERM, stop)
    threads = [threading.Thread(target=p, daemon=True) for p in pipelines]
    for t in threads:
        t.start()
    while alive := [t for t in threads if t.is_alive()]:
        alive[0].join(timeout=args.snapshot_s)
        snapshot()
    text = write_report(pipelines, settings, gpu or "CPU", args.out, final=True)
    print(text, flush=True)
    gifs = list(args.out.glob("phenaki-*.gif"))
    print(f"wrote {args.out / 'video.md'}" + (f" and {gifs[0]}" if gifs else "") +
          f"; {time.monotonic() - settings.t0:.0f} s of {args.budget_s:.0f}", flush=True)


if __name__ == "__main__":
    main()
