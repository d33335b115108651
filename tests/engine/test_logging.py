import errno
import io
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from genforge.app.config import load_config
from genforge.app.runs import make_trainer
from genforge.core.config import LogConfig
from genforge.data.previews import image_grid
from genforge.data.video import write_video
from genforge.engine.logging import Progress, RunLogger


def test_scalars_go_to_jsonl_and_a_resumed_run_drops_what_came_after_its_checkpoint(tmp_path):
    logger = RunLogger(tmp_path, LogConfig(tensorboard=False, progress=False))
    for step in (1, 2, 3):
        logger.scalars(step, {"loss": float(step)})
    logger.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')  # torn by kill -9
    RunLogger(tmp_path, LogConfig(tensorboard=False, progress=False), resume_step=2).close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]


def test_histogram_of_code_counts_reaches_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = RunLogger(tmp_path, LogConfig(tensorboard=True, progress=False))
    logger.histogram(5, "eval/codebook_histogram", [3, 0, 1, 0])
    logger.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"histograms": 0})
    events.Reload()
    (event,) = events.Histograms("eval/codebook_histogram")
    assert event.step == 5
    assert event.histogram_value.num == 4 and event.histogram_value.sum == 0 * 3 + 2 * 1
    assert list(event.histogram_value.bucket) == [3, 0, 1, 0]


@pytest.mark.parametrize("suffix", [".png", ".gif"])
def test_png_and_gif_previews_reach_tensorboard(tmp_path, suffix):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    frames = np.zeros((3, 6, 10, 3), np.uint8)
    frames[:, :, :, 0] = 255  # red clip
    path = tmp_path / f"preview{suffix}"
    if suffix == ".gif":
        write_video(frames, path)  # palette frames: a 2-D array without the conversion to RGB
    else:
        Image.fromarray(frames[0]).save(path)
    logger = RunLogger(tmp_path, LogConfig(tensorboard=True, progress=False))
    logger.image(7, "samples", path)
    logger.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    (event,) = events.Images("samples")
    assert (event.step, event.width, event.height) == (7, 10, 6)


def test_image_grid_pads_and_maps_minus_one_one_to_uint8():
    grid = image_grid(torch.stack([-torch.ones(3, 4, 4), torch.ones(3, 4, 4)]), nrow=2, pad=2)
    assert grid.dtype == np.uint8 and grid.shape == (4 + 2 * 2, 2 * 4 + 3 * 2, 3)
    assert grid[2, 2].tolist() == [0, 0, 0] and grid[2, 2 + 4 + 2].tolist() == [255, 255, 255]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (writes to it fail with ENOSPC)")
def test_a_full_disk_while_logging_names_metrics_jsonl(tmp_path):
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    logger = RunLogger(tmp_path, LogConfig(tensorboard=False, progress=False))
    with pytest.raises(OSError, match="metrics.jsonl") as full:
        logger.scalars(1, {"loss": 1.0})
    assert full.value.errno == errno.ENOSPC


def test_without_a_terminal_each_logged_step_is_one_plain_line_and_the_run_ends_with_a_summary(tmp_path, capfd,
                                                                                               caplog):
    """stderr redirected (a log file, a cluster job): no progress bar, one line per train.log_every steps through
    the `genforge` logger (on stderr unless the application configured logging, as pytest has), and a closing
    summary (steps, wall time, last loss, checkpoint, samples)."""
    overrides = ["train.steps=6", "train.log_every=2", "train.checkpoint_every=6", "train.sample_every=6",
                 "log.progress=true"]
    caplog.set_level(logging.INFO, logger="genforge")
    make_trainer(load_config("dit-debug", overrides), tmp_path).fit()
    assert "\r" not in capfd.readouterr().err  # no bar
    lines = [m for m in caplog.messages if m.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["2/6", "4/6", "6/6"]
    assert all(" loss " in line and " samples/s ETA " in line for line in lines)
    summary = next(m for m in caplog.messages if m.startswith("trained steps 1-6 of 6 in "))
    assert "last loss" in summary and "step-000006" in summary and "samples" in summary


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_with_a_summary_elsewhere(monkeypatch, caplog):
    """sample / eval / encode progress: without a terminal one line per tenth of the total crossed and a closing
    summary through the `genforge` logger; on a terminal a tqdm bar and no lines; on ranks other than 0 nothing."""
    caplog.set_level(logging.INFO, logger="genforge")
    plain = Progress("encoding", "images", total=100)
    for done in [*range(7, 100, 7), 100]:
        plain.report(done)
    lines = [m for m in caplog.messages if m.startswith("encoding ")]
    assert [line.split()[1] for line in lines] == ["14/100", "21/100", "35/100", "42/100", "56/100", "63/100",
                                                   "70/100", "84/100", "91/100", "100/100"]
    assert all(", ETA " in line and " images/s" in line for line in lines)
    plain.finish("encoded 100 images into 1 shard(s)", "3 unreadable skipped")
    assert caplog.messages[-1] == "encoded 100 images into 1 shard(s) in 0:00:00: 3 unreadable skipped"

    caplog.clear()
    shares = Progress("sampling", "samples", processes=2)  # the total comes with the first report
    shares.report(64, 128)
    shares.report(128, 128)
    shares.finish("sampled 256 samples")
    assert len(caplog.messages) == 3
    assert caplog.messages[0].startswith("sampling (rank 0 of 2) 64/128 samples, ")
    assert caplog.messages[1].startswith("sampling (rank 0 of 2) 128/128 samples, ")
    assert caplog.messages[2] == "sampled 256 samples on 2 processes in 0:00:00"

    caplog.clear()
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bar = Progress("evaluating", "samples", total=10)
    bar.report(5)
    bar.report(10)
    bar.finish("evaluated 10 samples")
    assert "\r" in terminal.getvalue() and "10/10" in terminal.getvalue()  # the bar
    assert caplog.messages == ["evaluated 10 samples in 0:00:00"]  # no lines, the summary

    caplog.clear()
    monkeypatch.setattr(sys, "stderr", Terminal())
    quiet = Progress("evaluating", "samples", total=10, enabled=False)  # rank 1
    quiet.report(10)
    quiet.finish("evaluated 10 samples")
    assert caplog.messages == [] and sys.stderr.getvalue() == ""
