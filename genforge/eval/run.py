"""Score a task offline (`genforge eval` and in-training evaluation): generators on fresh samples, tokenizers
on reconstructions of held-out images.

Several processes (torchrun / accelerate launch): every rank generates its share of the samples and extracts
their features; the features are gathered in sample order (`eval.distributed`) before rank 0 computes any
statistic, so the results equal those of one process on the same samples. Tokenizers are scored on rank 0.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import Tensor, nn
from torch.utils.data import IterableDataset

from genforge.config import RunConfig
from genforge.config.base import METRIC_RESULTS, TOKENIZER_METRICS, DataConfig
from genforge.engine.random import mix_seed
from genforge.engine.task import Batch, Task
from genforge.eval.distributed import gather_rows, rank_and_world

if TYPE_CHECKING:
    from genforge.eval.features import PoolFeatures

METRICS = tuple(METRIC_RESULTS)
GENERATOR_METRICS = tuple(m for m in METRICS if m not in TOKENIZER_METRICS)
FEATURE_METRICS = ("fid", "kid", "is", "prdc")  # on Inception pool3 features of the samples
REFERENCE_METRICS = ("fid", "kid", "prdc")  # ... compared with real images
_NO_FEATURES = ("metric {!r} needs reference features; {} holds only mu and sigma (use an image folder or a "
                ".safetensors statistics file)")


@torch.no_grad()
def sample_chunks(task: Task, cond_all: Batch, n: int, seed: int, device: torch.device | str, batch_size: int = 64,
                  rank: int = 0, world: int = 1, **opts: Any) -> Iterator[tuple[int, Tensor]]:
    """This rank's chunks of the `n` samples: (index of the first sample, images on the CPU in [-1, 1]).
    Chunk c (samples c·batch_size onwards) is drawn with a generator seeded by (seed, c) on rank c % world,
    so the samples are the same for any number of processes."""
    for chunk, start in enumerate(range(0, n, batch_size)):
        if chunk % world != rank:
            continue
        gen = torch.Generator(device=device).manual_seed(mix_seed(seed, chunk))
        cond = {k: v[start : start + batch_size] for k, v in cond_all.items()}
        count = min(batch_size, n - start)
        yield start, task.sample(cond, gen, n=count, **opts).float().cpu()


def generate(task: Task, n: int, seed: int, device: torch.device | str, batch_size: int = 64,
             **opts: Any) -> tuple[Tensor, dict[str, Any]]:
    """`n` samples (CPU, [-1, 1]) in batches, reproducible from `seed`, and the conditions used."""
    cond_all = task.sample_conditions(n, torch.Generator(device=device).manual_seed(seed), **opts)
    chunks = sample_chunks(task, cond_all, n, seed, device, batch_size, **opts)
    return torch.cat([images for _, images in chunks]), cond_all


def data_source(cfg: DataConfig) -> str:
    """Where the training images come from: `cfg.source`, or for a cache the source it was encoded from."""
    if cfg.source != "cache":
        return cfg.source
    from genforge.data.cache import read_manifest

    return read_manifest(cfg.path).preprocessing.source


@functools.lru_cache(maxsize=1)
def feature_network(device: str) -> "PoolFeatures":
    """The FID Inception-v3 (local weights) for fid/kid/is/prdc, built once per process."""
    from genforge.eval.features import InceptionFeatures

    return InceptionFeatures().to(device)


def evaluate_task(task: Task, cfg: RunConfig, metrics: list[str], n: int, seed: int,
                  device: torch.device | str, batch_size: int = 64, **opts: Any) -> dict[str, Any]:
    """Run each metric on `n` fresh samples (results include the sampler settings used), or for a tokenizer
    (`task.codec()` is not None) on `n` reconstructions of held-out images. Every rank of a process group
    must call it; rank 0 gets the results, the others an empty dict."""
    unknown = sorted(set(metrics) - set(METRICS))
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; allowed: {', '.join(METRICS)}")
    codec = task.codec()
    kind, allowed = ("tokenizer", TOKENIZER_METRICS) if codec is not None else ("generator", GENERATOR_METRICS)
    wrong = [m for m in metrics if m not in allowed]
    if wrong:
        raise ValueError(f"metric {wrong[0]!r} does not apply to family {cfg.model.family!r} (a {kind}); "
                         f"its metrics: {', '.join(allowed)}")
    if codec is not None:
        if opts:
            raise ValueError(f"sampler options {sorted(opts)} do not apply to family {cfg.model.family!r} "
                             "(a tokenizer)")
        return evaluate_tokenizer(codec, cfg, metrics, n, device) if rank_and_world()[0] == 0 else {}
    return evaluate_generator(task, cfg, metrics, n, seed, device, batch_size, **opts)


def evaluate_generator(task: Task, cfg: RunConfig, metrics: list[str], n: int, seed: int,
                       device: torch.device | str, batch_size: int = 64, **opts: Any) -> dict[str, Any]:
    """judge, fid, kid, is, prdc on `n` samples, generated and featurised in shares over the ranks."""
    from genforge.eval import distribution_metrics as dm
    from genforge.eval.features import InceptionLogits
    from genforge.eval.judge import judge_predictions, prediction_report
    from genforge.eval.reference import pool_features, reference_source, reference_stats

    rank, world = rank_and_world()
    least = {"fid": 2, "kid": 2, "is": dm.IS_SPLITS, "prdc": dm.PRDC_K + 1}
    short = [m for m in metrics if n < least.get(m, 1)]
    if short:
        raise ValueError(f"metric {short[0]!r} needs at least {least[short[0]]} samples, got n={n}")
    cond_all = task.sample_conditions(n, torch.Generator(device=device).manual_seed(seed), **opts)
    judge = None
    if "judge" in metrics:
        if "label" not in cond_all:
            raise ValueError("metric 'judge' needs a class-conditional model")
        judge = shapes_judge(cfg)
    net = feature_network(str(device)) if set(metrics) & set(FEATURE_METRICS) else None
    logits = InceptionLogits(cfg.eval.is_weights) if "is" in metrics else None  # before sampling: fail early
    reference = None
    if set(metrics) & set(REFERENCE_METRICS):
        source = reference_source(cfg.data, cfg.eval.ref)
        needs = [m for m in ("kid", "prdc") if m in metrics]
        npz = isinstance(source, Path) and source.suffix == ".npz"  # known on every rank, unlike the file's content
        if needs and npz:
            raise ValueError(_NO_FEATURES.format(needs[0], source))
        reference = reference_stats(net, source, cfg.eval.ref_n or n, device, batch_size)
        if needs and reference is not None and reference.features is None:
            raise ValueError(_NO_FEATURES.format(needs[0], source))

    index, features, predictions = [], [], []
    for start, images in sample_chunks(task, cond_all, n, seed, device, batch_size, rank, world, **opts):
        index.append(torch.arange(start, start + len(images)))
        if net is not None:
            features.append(pool_features(net, images, device, batch_size))
        if judge is not None:
            predictions.append(judge_predictions(judge, images))
    index = torch.cat(index) if index else torch.zeros(0, dtype=torch.long)
    if net is not None:
        features = gather_rows(torch.cat(features) if features else torch.zeros(0, net.dim), index)
    if judge is not None:
        predictions = gather_rows(torch.cat(predictions) if predictions else torch.zeros(0, dtype=torch.long), index)
    if rank != 0:
        return {}
    results: dict[str, Any] = {"n": n, "sampler": task.sampler_settings(**opts)}
    if judge is not None:
        results.update(prediction_report(predictions, cond_all["label"].cpu()))
    if net is not None:
        results["features"] = net.fingerprint()["network"]
    if reference is not None:
        results.update(ref=str(reference.path), ref_n=reference.n)
    if "fid" in metrics:
        results["fid"] = dm.frechet_distance(reference.mu, reference.sigma, *dm.gaussian_stats(features))
    if "kid" in metrics:
        results["kid_mean"], results["kid_std"] = dm.kid(reference.features, features)
    if "prdc" in metrics:
        results.update(dm.prdc(reference.features, features))
    if logits is not None:
        results["is_mean"], results["is_std"] = dm.inception_score(logits(features))
    return results


def shapes_judge(cfg: RunConfig) -> nn.Module:
    """The shapes judge, for a model trained on shapes (or on a cache encoded from shapes)."""
    from genforge.eval.judge import load_or_train_judge

    if data_source(cfg.data) != "shapes":
        raise ValueError("metric 'judge' needs a model trained on data.source=shapes (or on a cache encoded "
                         "from shapes)")
    return load_or_train_judge()


def heldout_split(cfg: DataConfig) -> str:
    """The split tokenizers are scored on: held-out images when there are any, else the training data
    (shapes always has a held-out set: another seed; webdataset shards never: the training shards, in order)."""
    if cfg.source == "shards":
        return "train"
    return "val" if cfg.source == "shapes" or cfg.val_fraction > 0 else "train"


def heldout_batches(cfg: DataConfig, n: int, batch_size: int) -> Iterator[Tensor]:
    """The first `n` readable images of `heldout_split(cfg)`, unflipped, in batches [b, C, H, W] in [-1, 1]."""
    from genforge.data.loader import build_dataset

    dataset = build_dataset(cfg, split=heldout_split(cfg), flip=False)
    # a stream (webdataset shards) iterates as one ordered pass, read lazily: only the first n are decoded
    items = iter(dataset) if isinstance(dataset, IterableDataset) else (dataset[i] for i in range(len(dataset)))
    readable = itertools.islice((item["image"] for item in items if "image" in item), n)  # skip unreadable files
    while batch := list(itertools.islice(readable, batch_size)):
        yield torch.stack(batch)


@functools.lru_cache(maxsize=1)
def perceptual_metric(device: str) -> nn.Module:
    """The default PerceptualLoss (FID Inception, local weights), built once per process."""
    from genforge.eval.features import PerceptualLoss

    return PerceptualLoss().to(device)


@torch.no_grad()
def evaluate_tokenizer(codec: nn.Module, cfg: RunConfig, metrics: list[str], n: int, device: torch.device | str,
                       batch_size: int = 32) -> dict[str, Any]:
    """Encode and decode `n` held-out images; per-image means of psnr, ssim, perceptual (reconstructions
    clamped to [-1, 1]) and, for a TokenCodec, codebook usage over all the ids and their histogram."""
    from genforge.eval.tokenizer_metrics import CodebookUsage, psnr, ssim
    from genforge.nn.codec import TokenCodec

    if "codebook" in metrics and not isinstance(codec, TokenCodec):
        raise ValueError(f"metric 'codebook' needs a discrete tokenizer (TokenCodec); family "
                         f"{cfg.model.family!r} has continuous latents")
    scores = {"psnr": psnr, "ssim": ssim}
    if "perceptual" in metrics:
        scores["perceptual"] = perceptual_metric(str(device))
    per_image = {name: 0.0 for name in metrics if name in scores}
    usage = CodebookUsage(codec.codebook_size) if "codebook" in metrics else None
    count = 0
    for images in heldout_batches(cfg.data, n, batch_size):
        images = images.to(device)
        codes = codec.encode(images)
        recon = codec.decode(codes).float().clamp(-1, 1)
        for name in per_image:
            per_image[name] += float(scores[name](recon, images).sum())
        if usage is not None:
            usage.update(codes)
        count += len(images)
    if count == 0:
        raise ValueError(f"no readable images in the {heldout_split(cfg.data)!r} split of the run's data")
    results: dict[str, Any] = {"n": count, "split": heldout_split(cfg.data)}
    results.update({name: total / count for name, total in per_image.items()})
    if usage is not None:
        results.update(usage.compute())
        results["codebook_histogram"] = usage.counts.tolist()  # uses of each code id, for the histogram
    return results
