"""Issue 35's misuse sweep: every bad-input / misuse case run as a real `genforge` subprocess, one table row each.

    python benchmarks/misuse_sweep.py                 # all cases, about 5 minutes on 2 CPU cores
    python benchmarks/misuse_sweep.py --only damaged  # the cases whose name holds "damaged"

A case declares what the user did, the exit code it expects, the words the output must hold (the field, file or
value at fault) and, where the case changes state, a check of the run directory afterwards. A row says the exit code,
whether a Python traceback appeared, whether the outcome was as expected, and the first line of genforge's message.
A "silent change" is a case that changes state and exits 0 without naming what happened, or whose state check
fails. Exits 1 when any case printed a traceback or ended otherwise than expected.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's genforge, as in the subprocesses
from genforge.data.shapes import write_shapes_folder, write_shapes_shards
from genforge.data.shards import shard_pattern
from genforge.engine.lock import LOCK_FILE, is_locked
from kill_harness import nan_in

TRACEBACK = "Traceback (most recent call last)"
# a quick dit-debug run: checkpoints at steps 2 and 4; running the same command again resumes
QUICK = ["train.steps=4", "train.checkpoint_every=2", "train.sample_every=0", "train.log_every=1", "eval.every=0"]
SHARDS = ["data.source=shards", "data.shuffle_buffer=8", "model.num_classes=16"]
SHARD_RECORDS, SHARD_SIZE = 48, 12  # 4 shards


def sets(*overrides: str) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


def child_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("GENFORGE_ALLOW_PIPE", None)  # the pipe: case must be refused
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                      env.get("PYTHONPATH")]))
    return env


def genforge(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "genforge", *args], env=child_env(), capture_output=True, text=True,
                          timeout=timeout)


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under `folder` and its content hash (the lock, which names its last holder, left out)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*")) if p.name != LOCK_FILE}


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Fixtures:
    """What several cases start from, built once on first use (so `--only` builds only what it needs)."""

    def __init__(self, work: Path) -> None:
        self.root = work / "fixtures"
        self.built: dict[str, Path] = {}

    def _once(self, name: str, build: Callable[[Path], object]) -> Path:
        if name not in self.built:
            start = time.monotonic()
            build(self.root / name)
            self.built[name] = self.root / name
            print(f"(fixture {name}: {time.monotonic() - start:.1f} s)", flush=True)
        return self.built[name]

    @staticmethod
    def _train(run_dir: Path, *overrides: str) -> None:
        done = genforge("train", "dit-debug", "--run-dir", str(run_dir), *sets(*QUICK, *overrides))
        if done.returncode:
            sys.exit(f"could not build the fixture {run_dir.name}:\n{done.stdout}{done.stderr}")

    def good_run(self) -> Path:
        """A dit-debug run with checkpoints step-000002 and step-000004 (latest)."""
        return self._once("good-run", self._train)

    def narrow_run(self) -> Path:
        """A dit-debug run of another width (model.backbone.hidden_size=32): weights of the wrong shape for the good
        run."""
        return self._once("narrow-run",
                          lambda path: self._train(path, "train.steps=2", "model.backbone.hidden_size=32"))

    def shards(self) -> Path:
        """4 webdataset shards of 12 shapes each (.png, .txt, .cls)."""
        return self._once("shards", lambda path: write_shapes_shards(path, SHARD_RECORDS, 16, shard_size=SHARD_SIZE))

    def copy_of_good_run(self, folder: Path) -> Path:
        run = folder / "run"
        shutil.copytree(self.good_run(), run)
        return run

    def copy_of_shards(self, folder: Path) -> tuple[Path, str]:
        """A copy of the shards in `folder/shards`, and the brace pattern naming them (a data.path)."""
        shutil.copytree(self.shards(), folder / "shards")
        return folder / "shards", shard_pattern(folder / "shards", "shapes", SHARD_RECORDS, SHARD_SIZE)[0]


@dataclass
class Case:
    name: str
    did: str  # what the user did, in a few words
    prepare: Callable[[Path, dict], list[str]]  # builds what the case needs in its folder; the genforge arguments
    code: int  # the exit code expected
    says: tuple[str, ...] | Callable[[dict], tuple[str, ...]]  # the output must hold each (a callable: of state)
    check: Callable[[Path, dict], str | None] | None = None  # state afterwards: None, or what is wrong
    changes_state: bool = False  # the run goes on changing something: exit 0 needs a message naming it


@dataclass
class Outcome:
    case: Case
    code: int | None
    output: str
    seconds: float
    message: str = ""
    traceback: bool = False
    problems: list[str] = field(default_factory=list)
    silent: bool = False


# ---- 1. two trainers on one run directory ------------------------------------------------------------------------

def lock_case() -> Case:
    def prepare(folder: Path, state: dict) -> list[str]:
        run = folder / "run"
        # ~600 steps of dit-debug: 15-20 s on 2 busy cores, longer than the second trainer takes to start
        with open(folder / "first.out", "w") as log:
            first = subprocess.Popen([sys.executable, "-m", "genforge", "train", "dit-debug", "--run-dir", str(run),
                                      *sets(*QUICK, "train.steps=600", "train.checkpoint_every=200")],
                                     env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        state["first"], state["pid"] = first, first.pid
        deadline = time.monotonic() + 120
        lock = run / LOCK_FILE
        # probe only once the holder has written its name into the lock file: is_locked takes the lock for a moment,
        # and a probe between the trainer creating the file and locking it would turn the trainer away
        while not (lock.is_file() and lock.stat().st_size and is_locked(run)):
            if first.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the first trainer never held {run / LOCK_FILE}: "
                                   f"{(folder / 'first.out').read_text()[-2000:]}")
            time.sleep(0.1)
        return ["train", "dit-debug", "--run-dir", str(run), *sets(*QUICK, "train.steps=600")]

    def check(folder: Path, state: dict) -> str | None:
        first = state["first"]
        try:
            code = first.wait(timeout=300)
        except subprocess.TimeoutExpired:
            first.kill()
            return "the first trainer did not finish in 300 s"
        if code != 0:
            return f"the first trainer exited {code}: {(folder / 'first.out').read_text()[-500:]}"
        steps = [r["step"] for r in jsonl(folder / "run" / "metrics.jsonl") if "step" in r and "loss" in r]
        if steps != list(range(1, 601)):
            return f"metrics.jsonl steps are not 1..600 in order: {steps[:5]}...{steps[-5:]} ({len(steps)} lines)"
        return None

    def says(state: dict) -> tuple[str, ...]:
        return "is in use by another `genforge train`", f"host {socket.gethostname()}, pid {state['pid']}"

    return Case("lock-two-trainers", "2nd `train` on a run dir another is training", prepare, 2, says, check)


# ---- 2. damaged checkpoints ---------------------------------------------------------------------------------------

def header_claiming(path: Path, length: int) -> None:
    """Rewrite the 8-byte header length of a safetensors file."""
    path.write_bytes(struct.pack("<Q", length) + path.read_bytes()[8:])


def cut(path: Path, size: int) -> None:
    """Keep the first `size` bytes of `path`."""
    path.write_bytes(path.read_bytes()[:size])


def damaged_cases(fx: Fixtures) -> list[Case]:
    def narrow_weights(ckpt: Path) -> None:
        narrow = fx.narrow_run() / "checkpoints" / "step-000002" / "model.safetensors"
        shutil.copyfile(narrow, ckpt / "model.safetensors")

    damage = [  # (case, what the user did to checkpoints/step-000004, the file the warning must name, how)
        ("truncated-model", "model.safetensors cut to 1 KB", "model.safetensors",
         lambda ckpt: cut(ckpt / "model.safetensors", 1000)),
        ("random-model", "model.safetensors random bytes", "model.safetensors",
         lambda ckpt: (ckpt / "model.safetensors").write_bytes(os.urandom(4096))),
        ("huge-header", "header claims 10^15 bytes", "model.safetensors",
         lambda ckpt: header_claiming(ckpt / "model.safetensors", 10**15)),
        ("missing-ema", "ema.safetensors deleted", "ema.safetensors", lambda ckpt: (ckpt / "ema.safetensors").unlink()),
        ("invalid-json", "trainer_state.json torn", "trainer_state.json",
         lambda ckpt: (ckpt / "trainer_state.json").write_text('{"step": 4,')),
        ("json-list", "trainer_state.json = [1, 2]", "trainer_state.json",
         lambda ckpt: (ckpt / "trainer_state.json").write_text("[1, 2]")),
        ("json-string", 'trainer_state.json = "step"', "trainer_state.json",
         lambda ckpt: (ckpt / "trainer_state.json").write_text('"step"')),
        ("wrong-shape", "weights of hidden_size=32", "model.safetensors", narrow_weights),
        ("missing-rng", "rng/rank-0.safetensors deleted", "rank-0.safetensors",
         lambda ckpt: (ckpt / "rng" / "rank-0.safetensors").unlink()),
        ("nan-weight", "a NaN in model.safetensors (a bit flip)", "non-finite",
         lambda ckpt: nan_in(ckpt / "model.safetensors")),
    ]
    cases = []
    for name, did, file, hurt in damage:
        def prepare(folder: Path, state: dict, hurt=hurt) -> list[str]:
            run = fx.copy_of_good_run(folder)
            hurt(run / "checkpoints" / "step-000004")
            return ["train", "dit-debug", "--run-dir", str(run), *sets(*QUICK)]  # the same command again

        def check(folder: Path, state: dict) -> str | None:
            ckpts = folder / "run" / "checkpoints"
            if not (ckpts / "damaged-step-000004").is_dir():
                return "checkpoints/damaged-step-000004 is not there"
            events = [r for r in jsonl(folder / "run" / "metrics.jsonl") if r.get("event") == "checkpoint_fallback"]
            if not events:
                return "no checkpoint_fallback event in metrics.jsonl"
            if (ckpts / "latest").read_text().strip() != "step-000004" or not (ckpts / "step-000004").is_dir():
                return "the resumed run did not write a new step-000004 as latest"
            return None

        cases.append(Case(f"damaged-{name}", f"resume; latest {did}", prepare, 0,
                          ("step-000004", file, "damaged-step-000004", "step-000002"), check, changes_state=True))

    def prepare_missing(folder: Path, state: dict) -> list[str]:
        run = fx.copy_of_good_run(folder)
        shutil.rmtree(run / "checkpoints" / "step-000004")  # `latest` still names it
        return ["train", "dit-debug", "--run-dir", str(run), *sets(*QUICK)]

    def check_missing(folder: Path, state: dict) -> str | None:
        ckpts = folder / "run" / "checkpoints"
        latest = (ckpts / "latest").read_text().strip()
        return None if (ckpts / latest).is_dir() else f"latest names {latest!r}, which is not there"

    cases.append(Case("damaged-latest-missing", "resume; `latest` names a deleted folder", prepare_missing, 0,
                      ("step-000004", "step-000002"), check_missing, changes_state=True))

    def prepare_all(folder: Path, state: dict) -> list[str]:
        run = fx.copy_of_good_run(folder)
        (run / "checkpoints" / "step-000004" / "trainer_state.json").write_text("[]")
        (run / "checkpoints" / "step-000002" / "model.safetensors").write_bytes(b"\x00" * 5)
        state["before"] = snapshot(run / "checkpoints")
        return ["train", "dit-debug", "--run-dir", str(run), *sets(*QUICK)]

    def unchanged_checkpoints(folder: Path, state: dict) -> str | None:
        return None if snapshot(folder / "run" / "checkpoints") == state["before"] else "checkpoints/ changed"

    cases.append(Case("damaged-every-checkpoint", "resume; both checkpoints damaged", prepare_all, 2,
                      ("step-000004/trainer_state.json", "step-000002/model.safetensors"), unchanged_checkpoints))

    def prepare_sample(folder: Path, state: dict) -> list[str]:
        run = fx.copy_of_good_run(folder)
        (run / "checkpoints" / "step-000004" / "trainer_state.json").write_text("[1, 2]")
        state["before"] = snapshot(run)
        return ["sample", str(run), "--n", "2", "--out", str(folder / "grid.png")]

    def check_sample(folder: Path, state: dict) -> str | None:
        if snapshot(folder / "run") != state["before"]:
            return "the reader changed the run directory"
        return None if (folder / "grid.png").is_file() else "no grid.png written"

    cases.append(Case("damaged-sample-previous", "`sample` a run whose latest ckpt is damaged", prepare_sample, 0,
                      ("step-000004", "trainer_state.json", "wrote 2 samples"), check_sample))

    def prepare_sample_none(folder: Path, state: dict) -> list[str]:
        prepare_all(folder, state)
        return ["sample", str(folder / "run"), "--n", "2", "--out", str(folder / "grid.png")]

    def prepare_sample_nan(folder: Path, state: dict) -> list[str]:
        run = fx.copy_of_good_run(folder)
        nan_in(run / "checkpoints" / "step-000004" / "ema.safetensors")
        state["before"] = snapshot(run)
        return ["sample", str(run), "--n", "2", "--out", str(folder / "grid.png")]

    cases.append(Case("damaged-sample-nan", "`sample` a run whose latest EMA holds a NaN", prepare_sample_nan, 0,
                      ("step-000004", "non-finite", "wrote 2 samples"), check_sample))
    cases.append(Case("damaged-sample-none-usable", "`sample` a run with no usable checkpoint", prepare_sample_none,
                      2, ("step-000004/trainer_state.json", "step-000002/model.safetensors"), unchanged_checkpoints))
    return cases


# ---- 3, 4. bad shards, folders and missing fields -----------------------------------------------------------------

def skipped_names(file: str) -> Callable[[Path, dict], str | None]:
    def check(folder: Path, state: dict) -> str | None:
        path = folder / "run" / "skipped.jsonl"
        if not path.is_file():
            return "no skipped.jsonl"
        return None if any(file in r["key"] + r["reason"] for r in jsonl(path)) else f"skipped.jsonl lacks {file}"
    return check


def no_run_dir(folder: Path, state: dict) -> str | None:
    return "a run directory was left behind" if (folder / "run").exists() else None


def data_cases(fx: Fixtures) -> list[Case]:
    def bad_shard(hurt: Callable[[Path], None]) -> Callable[[Path, dict], list[str]]:
        def prepare(folder: Path, state: dict) -> list[str]:
            root, pattern = fx.copy_of_shards(folder)
            hurt(root / "shapes-000001.tar")
            return ["train", "dit-debug", "--run-dir", str(folder / "run"),
                    *sets(*QUICK, *SHARDS, f"data.path={pattern}", "data.max_bad_fraction=0.5", "train.steps=6",
                          "train.checkpoint_every=6")]  # 6 batches of 8 read every shard
        return prepare

    def without_cls(folder: Path, state: dict) -> list[str]:
        root, pattern = fx.copy_of_shards(folder)
        for tar in sorted(root.glob("*.tar")):  # the same records without their .cls
            stripped = tar.with_suffix(".tmp")
            with tarfile.open(tar) as src, tarfile.open(stripped, "w") as dst:
                for member in src.getmembers():
                    if not member.name.endswith(".cls"):
                        dst.addfile(member, src.extractfile(member))
            stripped.replace(tar)
        return ["train", "dit-debug", "--run-dir", str(folder / "run"), *sets(*QUICK, *SHARDS, f"data.path={pattern}")]

    def some_captions(folder: Path, state: dict) -> list[str]:
        root = write_shapes_folder(folder / "data", 32, 16)
        for caption in sorted(root.rglob("*.txt"))[::2]:
            caption.unlink()
        return ["train", "maskgit-debug", "--run-dir", str(folder / "run"),
                *sets(*QUICK, "data.source=folder", f"data.path={root}", 'model.sample_prompts=["a red circle"]')]

    def small(dry_run: bool) -> Callable[[Path, dict], list[str]]:
        def prepare(folder: Path, state: dict) -> list[str]:
            root = write_shapes_folder(folder / "data", 5, 16)
            return ["train", "dit-debug", "--run-dir", str(folder / "run"),
                    *sets(*QUICK, "data.source=folder", f"data.path={root}")] + (["--dry-run"] if dry_run else [])
        return prepare

    def all_broken(folder: Path, state: dict) -> list[str]:
        root = write_shapes_folder(folder / "data", 12, 16)
        for image in root.rglob("*.png"):
            image.write_bytes(b"not a png")
        return ["train", "dit-debug", "--run-dir", str(folder / "run"),
                *sets(*QUICK, "data.source=folder", f"data.path={root}")]

    def all_listed(folder: Path, state: dict) -> str | None:
        path = folder / "run" / "skipped.jsonl"
        count = len(jsonl(path)) if path.is_file() else 0
        return None if count == 12 else f"skipped.jsonl lists {count} of the 12 broken images"

    return [
        Case("shard-truncated", "a .tar cut in half among 4 shards",
             bad_shard(lambda tar: cut(tar, tar.stat().st_size // 2)), 0, ("shapes-000001.tar",),
             skipped_names("shapes-000001.tar"), changes_state=True),
        Case("shard-random-bytes", "a .tar of random bytes among 4 shards",
             bad_shard(lambda tar: tar.write_bytes(os.urandom(3000))), 0, ("shapes-000001.tar",),
             skipped_names("shapes-000001.tar"), changes_state=True),
        Case("shard-no-cls", "class-conditional dit on shards without .cls", without_cls, 2, ("'label'", ".cls")),
        Case("folder-some-captions", "text-conditioned maskgit, half the captions", some_captions, 2,
             ("'text'", "caption")),
        Case("data-smaller-than-batch", "5 images, batch_size 8", small(False), 2,
             ("holds 5 training sample(s)", "train.batch_size=8")),
        Case("data-smaller-dry-run", "5 images, batch_size 8, --dry-run", small(True), 2,
             ("holds 5 training sample(s)", "train.batch_size=8")),
        Case("folder-all-broken", "a folder of 12 broken .png files", all_broken, 2,
             ("all 12 samples are unreadable", "skipped.jsonl"), all_listed),
    ]


# ---- 5. resume with a changed config ------------------------------------------------------------------------------

def resume_cases(fx: Fixtures) -> list[Case]:
    def changed_lr(folder: Path, state: dict) -> list[str]:
        run = fx.copy_of_good_run(folder)
        return ["train", "dit-debug", "--run-dir", str(run), *sets(*QUICK, "train.steps=6", "train.lr=3e-4")]

    def lr_recorded(folder: Path, state: dict) -> str | None:
        path = folder / "run" / "config-history.jsonl"
        if not path.is_file():
            return "no config-history.jsonl"
        changes = [c for entry in jsonl(path) for c in entry["changes"]]
        if {"field": "train.lr", "old": 1e-3, "new": 3e-4} not in changes:
            return f"config-history.jsonl does not record train.lr 0.001 -> 0.0003: {changes}"
        return None if "lr: 0.0003" in (folder / "run" / "config.yaml").read_text() else "config.yaml lacks the new lr"

    def changed_depth(folder: Path, state: dict) -> list[str]:
        run = fx.copy_of_good_run(folder)
        state["before"] = snapshot(run)
        return ["train", "dit-debug", "--run-dir", str(run), *sets(*QUICK, "model.backbone.depth=3")]

    def untouched(folder: Path, state: dict) -> str | None:
        after = snapshot(folder / "run")
        if after.get("config.yaml") != state["before"]["config.yaml"]:
            return "config.yaml changed"
        return None if after == state["before"] else "the run directory changed"

    def sample_refused(folder: Path, state: dict) -> list[str]:
        refused = genforge(*changed_depth(folder, state))  # the refused resume of the case above
        if refused.returncode != 2:
            raise RuntimeError(f"the resume with model.backbone.depth=3 exited {refused.returncode}")
        return ["sample", str(folder / "run"), "--n", "2", "--out", str(folder / "grid.png")]

    return [
        Case("resume-changed-lr", "resume, train.lr 1e-3 -> 3e-4, steps 4 -> 6", changed_lr, 0,
             ("resuming with a changed config", "train.lr: 0.001 -> 0.0003"), lr_recorded, changes_state=True),
        Case("resume-changed-depth", "resume with model.backbone.depth 2 -> 3", changed_depth, 2,
             ("may not change", "model.backbone.depth: 2 -> 3"), untouched),
        Case("resume-refused-then-sample", "`sample` the run after the refused resume", sample_refused, 0,
             ("wrote 2 samples",), lambda folder, state: None if (folder / "grid.png").is_file() else "no grid.png"),
    ]


# ---- 6, 7, 8. pipe: URLs, unwritable places, a full disk ----------------------------------------------------------

def place_cases(fx: Fixtures) -> list[Case]:
    def pipe(folder: Path, state: dict) -> list[str]:
        state["marker"] = folder / "the-pipe-ran"
        return ["train", "dit-debug", "--run-dir", str(folder / "run"),
                *sets(*QUICK, *SHARDS, f"data.path=pipe:touch {state['marker']} && cat shards.tar")]

    def pipe_not_run(folder: Path, state: dict) -> str | None:
        return "the pipe: command ran" if state["marker"].exists() else no_run_dir(folder, state)

    def a_file(folder: Path) -> Path:
        blocker = folder / "a-file"
        blocker.write_text("x")
        return blocker

    def train_into(where: Callable[[Path], Path]) -> Callable[[Path, dict], list[str]]:
        return lambda folder, state: ["train", "dit-debug", "--run-dir", str(where(folder)), *sets(*QUICK)]

    def sample_to(where: Callable[[Path], Path]) -> Callable[[Path, dict], list[str]]:
        return lambda folder, state: ["sample", str(fx.good_run()), "--n", "2", "--out", str(where(folder))]

    def full_disk(folder: Path, state: dict) -> list[str]:
        run = folder / "run"
        run.mkdir()
        (run / "metrics.jsonl").symlink_to("/dev/full")  # every write to it fails with ENOSPC
        return ["train", "dit-debug", "--run-dir", str(run), *sets(*QUICK)]

    def read_only(run: Path, name: str) -> None:
        """RUN/<name> a link into /sys, where root may not create anything: a read-only mount as root sees it."""
        shutil.rmtree(run / name, ignore_errors=True)
        (run / name).symlink_to(f"/sys/genforge-sweep-{name}")

    def eval_unwritable(folder: Path, state: dict) -> list[str]:
        run = fx.copy_of_good_run(folder)
        read_only(run, "eval")
        return ["eval", str(run), "--metrics", "fid", "--n", "4"]

    def sample_unwritable(folder: Path, state: dict) -> list[str]:
        run = fx.copy_of_good_run(folder)
        read_only(run, "samples")
        return ["sample", str(run), "--n", "2"]

    # We run as root: chmod a-w does not stop root writing, so no read-only folder can be made here; /sys refuses
    # root's mkdir (EPERM) and stands in for a read-only mount.
    return [
        Case("pipe-url", "data.path=pipe:touch MARKER && cat ...", pipe, 2,
             ("data.path", "pipe", "GENFORGE_ALLOW_PIPE=1"), pipe_not_run),
        Case("run-dir-is-a-file", "--run-dir FILE", train_into(a_file), 2, ("--run-dir", "cannot write there")),
        Case("run-dir-under-a-file", "--run-dir FILE/run", train_into(lambda f: a_file(f) / "run"), 2,
             ("--run-dir", "cannot write there")),
        Case("run-dir-in-proc", "--run-dir /proc/genforge-sweep",
             train_into(lambda f: Path("/proc/genforge-sweep")), 2, ("--run-dir", "/proc/genforge-sweep")),
        Case("run-dir-in-sys", "--run-dir /sys/genforge-sweep (EPERM for root)",
             train_into(lambda f: Path("/sys/genforge-sweep")), 2, ("--run-dir", "/sys/genforge-sweep")),
        Case("sample-out-under-a-file", "`sample RUN --out FILE/grid.png`",
             sample_to(lambda f: a_file(f) / "grid.png"), 2, ("--out", "a-file: cannot write there")),
        Case("sample-out-in-proc", "`sample RUN --out /proc/grid.png`",
             sample_to(lambda f: Path("/proc/grid.png")), 2, ("--out /proc", "cannot write there")),
        Case("metrics-on-full-disk", "RUN/metrics.jsonl -> /dev/full (ENOSPC)", full_disk, 1,
             ("metrics.jsonl", "No space left on device")),
        Case("eval-run-unwritable", "`eval RUN`; RUN/eval -> /sys/... (read-only)", eval_unwritable, 2,
             ("cannot write there", "fid:", "the scores above were not written")),
        Case("sample-run-unwritable", "`sample RUN` (default --out); RUN/samples -> /sys", sample_unwritable, 2,
             ("--out (default: RUN_DIR/samples/)", "cannot write there"),
             lambda folder, state: "it sampled before refusing" if "sampling" in (folder / "output.txt").read_text()
             else None),
    ]


# ---- 9. input edges -----------------------------------------------------------------------------------------------

def edge_cases(fx: Fixtures) -> list[Case]:
    def latin1_caption(folder: Path, state: dict) -> list[str]:
        root = write_shapes_folder(folder / "data", 8, 16)  # 8 images, batch 8: every one is read
        caption = sorted(root.rglob("*.txt"))[0]
        caption.write_bytes(b"a red \xff circle")
        state["image"] = caption.with_suffix(".png").name
        return ["train", "maskgit-debug", "--run-dir", str(folder / "run"),
                *sets(*QUICK, "train.steps=2", "data.source=folder", f"data.path={root}")]

    def image_kept(folder: Path, state: dict) -> str | None:
        path = folder / "run" / "skipped.jsonl"
        if path.is_file() and state["image"] in path.read_text():
            return f"skipped.jsonl lists {state['image']}"
        skipped = sum(r.get("skipped_samples", 0) for r in jsonl(folder / "run" / "metrics.jsonl"))
        return f"metrics.jsonl counts {skipped:g} skipped samples" if skipped else None

    def torn_log(folder: Path, state: dict) -> list[str]:
        run = fx.copy_of_good_run(folder)
        (run / "skipped.jsonl").write_text('{"key": "a.png", "reason": "x", "step": 1}\n{"key": "b.pn')
        return ["train", "dit-debug", "--run-dir", str(run), *sets(*QUICK, "train.steps=6")]

    def finished(folder: Path, state: dict) -> str | None:
        latest = folder / "run" / "checkpoints" / "latest"
        return None if latest.read_text().strip() == "step-000006" else "the resumed run did not reach step 6"

    def path_is_file(folder: Path, state: dict) -> list[str]:
        archive = folder / "images.zip"
        archive.write_bytes(b"PK")
        return ["train", "dit-debug", "--run-dir", str(folder / "run"),
                *sets(*QUICK, "data.source=folder", f"data.path={archive}")]

    return [
        Case("caption-not-utf8", "a caption file holding byte 0xff (maskgit)", latin1_caption, 0, ("run directory",),
             image_kept),
        Case("skipped-jsonl-torn", "resume with a torn last line in skipped.jsonl", torn_log, 0,
             ("skipped.jsonl", "unreadable line(s) ignored"), finished, changes_state=True),
        Case("data-path-is-a-file", "data.path=images.zip (a file)", path_is_file, 2,
             ("images.zip", "is a file")),
    ]


# ---- 10. bad numbers and keys -------------------------------------------------------------------------------------

def value_cases(fx: Fixtures) -> list[Case]:
    def train_with(*overrides: str, dry_run: bool = False) -> Callable[[Path, dict], list[str]]:
        return lambda folder, state: (["train", "dit-debug", "--run-dir", str(folder / "run"),
                                       *sets(*QUICK, *overrides)] + (["--dry-run"] if dry_run else []))

    huge, absurd_n = "train.batch_size=1000000000000", "data.shapes.n=10000000000000"
    return [
        Case("sample-cfg-scale-inf", "`sample RUN --cfg-scale inf`",
             lambda folder, state: ["sample", str(fx.good_run()), "--cfg-scale", "inf", "--out",
                                    str(folder / "grid.png")], 2, ("--cfg-scale inf",),
             lambda folder, state: "grid.png was written" if (folder / "grid.png").exists() else None),
        Case("weight-decay-inf", "--set train.weight_decay=inf", train_with("train.weight_decay=inf"), 2,
             ("train.weight_decay",), no_run_dir),
        Case("batch-size-huge", f"--set {huge}", train_with(huge), 2, ("train.batch_size",)),
        Case("sizes-absurd", f"--set {huge} --set {absurd_n}", train_with(huge, absurd_n), 2,
             ("train.batch_size", "data.shapes.n"), no_run_dir),
        Case("sample-n-absurd", "`sample RUN --n 10^12`",
             lambda folder, state: ["sample", str(fx.good_run()), "--n", "1000000000000", "--out",
                                    str(folder / "grid.png")], 2, ("--n",),
             lambda folder, state: "grid.png was written" if (folder / "grid.png").exists() else None),
        Case("eval-n-absurd", "`eval RUN --n 10^12`",
             lambda folder, state: ["eval", str(fx.good_run()), "--n", "1000000000000"], 2, ("--n",)),
        Case("batch-size-huge-dry-run", f"--set {huge} --dry-run", train_with(huge, dry_run=True), 2,
             ("train.batch_size",)),
        Case("model-width-absurd", "--set model.backbone.hidden_size=1000000", train_with(
             "model.backbone.hidden_size=1000000", "model.backbone.num_heads=1"), 1,
             ("out of memory building the model", "model.*"), no_run_dir),
        Case("lr-nan", "--set train.lr=nan", train_with("train.lr=nan"), 2, ("train.lr",), no_run_dir),
        Case("steps-not-a-number", "--set train.steps=abc", train_with("train.steps=abc"), 2, ("train.steps",),
             no_run_dir),
        Case("unknown-key", "--set train.stepz=3", train_with("train.stepz=3"), 2, ("train.stepz",), no_run_dir),
    ]


def all_cases(fx: Fixtures) -> list[Case]:
    return [lock_case(), *damaged_cases(fx), *data_cases(fx), *resume_cases(fx), *place_cases(fx),
            *edge_cases(fx), *value_cases(fx)]


# ---- running and reporting ----------------------------------------------------------------------------------------

def first_message(output: str, says: tuple[str, ...]) -> str:
    """The first line of genforge's message: the first line holding what the case expects it to say, else the first
    `genforge: ...` line, else the first line (progress bars left out)."""
    lines = [line.strip() for line in output.splitlines() if line.strip() and "it/s]" not in line] or ["(no output)"]
    at = next((n for n, line in enumerate(lines) if says and says[0] in line),
              next((n for n, line in enumerate(lines) if line.startswith("genforge:")), 0))
    if lines[at].endswith(":") and at + 1 < len(lines):  # "genforge: invalid config:" and the field below it
        return f"{lines[at]} {lines[at + 1]}"
    return lines[at]


def stop_background(state: dict) -> None:
    """Kill what a case started in the background and its check did not wait for."""
    for value in state.values():
        if isinstance(value, subprocess.Popen) and value.poll() is None:
            value.kill()
            value.wait()


def run_case(case: Case, folder: Path) -> Outcome:
    folder.mkdir(parents=True)
    state: dict = {}
    start = time.monotonic()
    try:
        done = genforge(*case.prepare(folder, state))
        code, output = done.returncode, done.stderr + done.stdout
    except subprocess.TimeoutExpired as err:
        code, output = None, f"timed out after {err.timeout} s"
    except Exception as err:  # a case that could not be set up is reported, not raised
        stop_background(state)
        return Outcome(case, None, f"{type(err).__name__}: {err}", time.monotonic() - start,
                       problems=[f"setup failed: {type(err).__name__}: {err}"])
    (folder / "output.txt").write_text(output)
    says = case.says(state) if callable(case.says) else case.says
    outcome = Outcome(case, code, output, 0.0, first_message(output, says), traceback=TRACEBACK in output)
    if code != case.code:
        outcome.problems.append(f"exit {code}, expected {case.code}")
    missing = [s for s in says if s not in output]
    if missing:
        outcome.problems.append(f"output lacks {missing}")
    wrong = None
    if case.check is not None:
        try:
            wrong = case.check(folder, state)
        except Exception as err:
            wrong = f"state check failed: {type(err).__name__}: {err}"
        if wrong:
            outcome.problems.append(wrong)
    stop_background(state)
    if outcome.traceback:
        outcome.problems.append("a traceback")
    outcome.silent = code == 0 and case.changes_state and bool(missing or wrong)
    outcome.seconds = time.monotonic() - start
    return outcome


COLUMNS = (("case", 26), ("what the user did", 46), ("exit", 4), ("traceback", 9), ("expected", 8), ("s", 3))


def header() -> str:
    head = " ".join(f"{name:<{width}}" for name, width in COLUMNS) + " genforge's message (first line)"
    return head + "\n" + "-" * (sum(width + 1 for _, width in COLUMNS) + 110)


def short_paths(text: str, work: Path, case: Case) -> str:
    """Paths in the case's folder relative to it (`run/checkpoints/...`), others under the work folder as $W/..."""
    return text.replace(f"{work / 'cases' / case.name}/", "").replace(str(work), "$W")


def row(outcome: Outcome, work: Path) -> str:
    case = outcome.case
    cells = (case.name, case.did, str(outcome.code), "YES" if outcome.traceback else "no",
             "yes" if not outcome.problems else "NO", f"{outcome.seconds:.0f}")
    message = short_paths(outcome.message.removeprefix("genforge: "), work, case)
    message = message if len(message) <= 110 else message[:107] + "..."
    line = " ".join(f"{cell:<{width}}" for cell, (_, width) in zip(cells, COLUMNS)) + " " + message
    for problem in outcome.problems:
        line += f"\n{'':>27}! {short_paths(problem, work, case)}"
    if outcome.problems:
        tail = [text for text in short_paths(outcome.output, work, case).strip().splitlines()
                if "it/s]" not in text][-12:]
        line += "".join(f"\n{'':>27}| {text}" for text in tail)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the cases whose name holds this")
    parser.add_argument("--work", type=Path, default=None, help="folder for the cases (default: a temporary one, "
                                                                "removed afterwards); kept when given")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args()
    if args.list:
        for case in all_cases(Fixtures(Path())):  # nothing is built until a case runs
            if args.only in case.name:
                print(f"{case.name:<27} {case.did}")
        return
    work = (args.work or Path(tempfile.mkdtemp(prefix="genforge-misuse-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cases = [case for case in all_cases(Fixtures(work)) if args.only in case.name]
    print(f"{len(cases)} cases in $W={work}; each case's paths are relative to its folder $W/cases/<case>",
          flush=True)
    print(header(), flush=True)
    start, outcomes = time.monotonic(), []
    try:
        for case in cases:
            outcome = run_case(case, work / "cases" / case.name)
            outcomes.append(outcome)
            print(row(outcome, work), flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    tracebacks = sum(o.traceback for o in outcomes)
    unexpected = sum(bool(o.problems) for o in outcomes)
    silent = sum(o.silent for o in outcomes)
    print(f"{len(outcomes)} cases: {tracebacks} tracebacks, {unexpected} unexpected outcomes, {silent} silent changes "
          f"({time.monotonic() - start:.0f} s)")
    sys.exit(1 if tracebacks or unexpected else 0)


if __name__ == "__main__":
    main()
