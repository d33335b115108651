"""Bad data never ends a run in a traceback: unreadable shards are skipped and reported like unreadable images;
missing fields, too little data and an all-broken folder exit 2 with a message naming the file, field or sizes."""

import json
import os
import tarfile
from pathlib import Path

import torch
from typer.testing import CliRunner

from genforge.cli import app
from genforge.data.shapes import write_shapes_folder, write_shapes_shards

QUICK = ["--set", "train.steps=2", "--set", "train.sample_every=0", "--set", "train.checkpoint_every=2",
         "--set", "train.log_every=1"]


def _train(preset: str, run_dir: Path, *overrides: str, dry_run: bool = False):
    args = ["train", preset, "--run-dir", str(run_dir), *QUICK]
    for override in overrides:
        args += ["--set", override]
    return CliRunner().invoke(app, args + (["--dry-run"] if dry_run else []))


def _skipped(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "skipped.jsonl").read_text().splitlines()]


def _shards(tmp_path: Path) -> tuple[str, list[Path]]:
    pattern, _ = write_shapes_shards(tmp_path / "shards", 48, 16, shard_size=12)
    return pattern, sorted((tmp_path / "shards").glob("*.tar"))


def test_a_corrupt_shard_among_good_ones_is_skipped_and_reported(tmp_path):
    pattern, tars = _shards(tmp_path)
    tars[1].write_bytes(os.urandom(3000))  # random bytes, not a tar
    out = _train("dit-debug", tmp_path / "run", "data.source=shards", f"data.path={pattern}",
                 "data.shuffle_buffer=8", "model.num_classes=16", "data.max_bad_fraction=0.5", "train.steps=6",
                 "train.checkpoint_every=6")  # 6 batches of 8 read every shard
    assert out.exit_code == 0, out.output
    assert "Traceback" not in out.output
    reports = _skipped(tmp_path / "run")
    assert {r["key"] for r in reports} == {"shapes-000001.tar@0"}
    assert "cannot read shard" in reports[0]["reason"] and "shapes-000001.tar" in reports[0]["reason"]


def test_a_corrupt_shard_counts_toward_max_bad_fraction(tmp_path):
    pattern, tars = _shards(tmp_path)
    for tar in tars[:3]:
        tar.write_bytes(os.urandom(3000))
    out = _train("dit-debug", tmp_path / "run", "data.source=shards", f"data.path={pattern}",
                 "data.shuffle_buffer=0", "model.num_classes=16", "train.steps=40", "data.max_bad_fraction=0.01",
                 "train.checkpoint_every=100")
    assert out.exit_code == 1 and "data.max_bad_fraction=0.01" in out.output, out.output


def test_shard_records_without_cls_in_a_class_conditional_run_exit_2(tmp_path):
    folder = tmp_path / "nocls"
    folder.mkdir()
    pattern, tars = _shards(tmp_path)
    for tar in tars:  # the same records without their .cls
        with tarfile.open(tar) as src, tarfile.open(folder / tar.name, "w") as dst:
            for member in src.getmembers():
                if not member.name.endswith(".cls"):
                    dst.addfile(member, src.extractfile(member))
    out = _train("dit-debug", tmp_path / "run", "data.source=shards", f"data.path={folder}/{Path(pattern).name}",
                 "model.num_classes=16")
    assert out.exit_code == 2, out.output
    assert "'label'" in out.output and ".cls" in out.output and "shapes-0000" in out.output
    assert "Traceback" not in out.output and "KeyError" not in out.output


def test_a_folder_with_some_captions_in_a_text_conditioned_run_exits_2(tmp_path):
    root = write_shapes_folder(tmp_path / "folder", 32, 16)
    captions = sorted(root.rglob("*.txt"))
    for caption in captions[::2]:
        caption.unlink()
    out = _train("maskgit-debug", tmp_path / "run", "data.source=folder", f"data.path={root}",
                 'model.sample_prompts=["a red circle"]')  # previews need no held-out captions
    assert out.exit_code == 2, out.output
    assert "'text'" in out.output and "caption" in out.output and ".png" in out.output
    assert "Traceback" not in out.output and "KeyError" not in out.output


def test_data_smaller_than_the_batch_exits_2_naming_the_sizes(tmp_path):
    root = write_shapes_folder(tmp_path / "folder", 5, 16)
    for dry_run in (False, True):
        out = _train("dit-debug", tmp_path / "run", "data.source=folder", f"data.path={root}", dry_run=dry_run)
        assert out.exit_code == 2, out.output
        assert f"data.path='{root}'" in out.output and "holds 5 training sample(s)" in out.output
        assert "train.batch_size=8" in out.output and "Traceback" not in out.output


def test_an_all_broken_folder_exits_2_naming_it(tmp_path):
    root = write_shapes_folder(tmp_path / "folder", 12, 16)
    for image in root.rglob("*.png"):
        image.write_bytes(b"not a png")
    out = _train("dit-debug", tmp_path / "run", "data.source=folder", f"data.path={root}")
    assert out.exit_code == 2, out.output
    assert f"data.path='{root}'" in out.output and "all 12 samples are unreadable" in out.output
    assert "skipped.jsonl" in out.output and "Traceback" not in out.output
    assert len(_skipped(tmp_path / "run")) == 12


def test_a_field_few_records_have_is_left_out_and_named():
    from genforge.data.base import collate
    from genforge.data.shards import consistent

    samples = [{"key": f"s/r{n}", "image": torch.zeros(3, 4, 4)} for n in range(4)]
    samples[1]["label"] = 1
    good, bad = consistent(samples)
    batch = collate(good)
    assert bad == [] and "label" not in batch and batch["missing"] == {"label": "s/r0"}
