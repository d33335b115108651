"""Small input edges (issue 35 item 9): a non-UTF-8 caption keeps its image, a torn skipped.jsonl is read past with
a warning naming it, a data.path that is a file is reported as such (exit 2)."""

from typer.testing import CliRunner

from genforge.cli import app
from genforge.data.folder import ImageFolderDataset
from genforge.data.loader import SkipLog
from genforge.data.shapes import write_shapes_folder


def test_a_caption_that_is_not_utf8_keeps_its_image(tmp_path):
    root = write_shapes_folder(tmp_path / "data", 4, 16)
    dataset = ImageFolderDataset(root, 16, split="all")
    caption = (root / dataset.files[0]).with_suffix(".txt")
    caption.write_bytes(b"a red \xff circle")
    sample = dataset[0]
    assert "bad" not in sample and sample["image"].shape == (3, 16, 16)
    assert sample["text"] == "a red \ufffd circle"


def test_a_torn_skip_log_is_read_past_with_a_warning(tmp_path, status):
    path = tmp_path / "skipped.jsonl"
    path.write_text('{"key": "a.png", "reason": "x", "step": 1}\n{"key": "b.pn')
    assert SkipLog(path).listed == {"a.png"}
    assert f"{path}: 1 unreadable line(s) ignored" in status.text


def test_a_data_path_that_is_a_file_is_named_as_such(tmp_path):
    file = tmp_path / "images.zip"
    file.write_bytes(b"PK")
    out = CliRunner().invoke(app, ["train", "dit-debug", "--run-dir", str(tmp_path / "run"), "--set",
                                   "data.source=folder", "--set", f"data.path={file}"])
    assert out.exit_code == 2 and "is a file; it must be a folder" in out.output, out.output
