"""Score a task offline (`genforge eval` and in-training evaluation): generators on fresh samples, tokenizers
on reconstructions of held-out images."""

from __future__ import annotations

import functools
import itertools
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from genforge.config import RunConfig
from genforge.config.base import METRIC_RESULTS, TOKENIZER_METRICS, DataConfig
from genforge.engine.task import Task

METRICS = tuple(METRIC_RESULTS)
GENERATOR_METRICS = tuple(m for m in METRICS if m not in TOKENIZER_METRICS)


@torch.no_grad()
def generate(task: Task, n: int, seed: int, device: torch.device | str, batch_size: int = 64,
             **opts: Any) -> tuple[Tensor, dict[str, Any]]:
    """`n` samples (CPU, [-1, 1]) in batches, reproducible from `seed`, and the conditions used."""
    gen = torch.Generator(device=device).manual_seed(seed)
    cond_all = task.sample_conditions(n, gen, **opts)
    images = []
    for start in range(0, n, batch_size):
        cond = {k: v[start : start + batch_size] for k, v in cond_all.items()}
        count = min(batch_size, n - start)
        images.append(task.sample(cond, gen, n=count, **opts).float().cpu())
    return torch.cat(images), cond_all


def data_source(cfg: DataConfig) -> str:
    """Where the training images come from: `cfg.source`, or for a cache the source it was encoded from."""
    if cfg.source != "cache":
        return cfg.source
    from genforge.data.cache import read_manifest

    return read_manifest(cfg.path).preprocessing.source


def judge_score(cfg: RunConfig, images: Tensor, labels: Tensor) -> dict[str, float]:
    """Share of samples the shapes judge assigns to the requested class (and to its kind and colour)."""
    from genforge.eval.judge import judge_report, load_or_train_judge

    if data_source(cfg.data) != "shapes":
        raise ValueError("metric 'judge' needs a model trained on data.source=shapes (or on a cache encoded "
                         "from shapes)")
    return judge_report(load_or_train_judge(), images, labels.cpu())


def evaluate_task(task: Task, cfg: RunConfig, metrics: list[str], n: int, seed: int,
                  device: torch.device | str, **opts: Any) -> dict[str, Any]:
    """Run each metric on `n` fresh samples (results include the sampler settings used), or for a tokenizer
    (`task.codec()` is not None) on `n` reconstructions of held-out images."""
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
        return evaluate_tokenizer(codec, cfg, metrics, n, device)
    images, cond = generate(task, n, seed, device, **opts)
    results: dict[str, Any] = {"n": n, "sampler": task.sampler_settings(**opts)}
    if "judge" in metrics:
        if "label" not in cond:
            raise ValueError("metric 'judge' needs a class-conditional model")
        results.update(judge_score(cfg, images, cond["label"]))
    return results


def heldout_split(cfg: DataConfig) -> str:
    """The split tokenizers are scored on: held-out images when there are any, else the training data
    (shapes always has a held-out set: another seed)."""
    return "val" if cfg.source == "shapes" or cfg.val_fraction > 0 else "train"


def heldout_batches(cfg: DataConfig, n: int, batch_size: int) -> Iterator[Tensor]:
    """The first `n` readable images of `heldout_split(cfg)`, unflipped, in batches [b, C, H, W] in [-1, 1]."""
    from genforge.data.loader import build_dataset

    dataset = build_dataset(cfg, split=heldout_split(cfg), flip=False)
    items = (dataset[i] for i in range(len(dataset)))
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
