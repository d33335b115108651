"""Generate samples from a task and score them (offline; `genforge eval` and in-training evaluation)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from genforge.config import RunConfig
from genforge.config.base import METRIC_RESULTS
from genforge.engine.task import Task

METRICS = tuple(METRIC_RESULTS)


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


def judge_score(cfg: RunConfig, images: Tensor, labels: Tensor) -> dict[str, float]:
    """Share of samples the shapes judge assigns to the requested class (and to its kind and colour)."""
    from genforge.eval.judge import judge_report, load_or_train_judge

    if cfg.data.source != "shapes":
        raise ValueError("metric 'judge' needs a model trained on data.source=shapes")
    return judge_report(load_or_train_judge(), images, labels.cpu())


def evaluate_task(task: Task, cfg: RunConfig, metrics: list[str], n: int, seed: int,
                  device: torch.device | str, **opts: Any) -> dict[str, Any]:
    """Run each metric on `n` fresh samples; results include the sampler settings used."""
    unknown = sorted(set(metrics) - set(METRICS))
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; allowed: {', '.join(METRICS)}")
    images, cond = generate(task, n, seed, device, **opts)
    results: dict[str, Any] = {"n": n, "sampler": task.sampler_settings(**opts)}
    if "judge" in metrics:
        if "label" not in cond:
            raise ValueError("metric 'judge' needs a class-conditional model")
        results.update(judge_score(cfg, images, cond["label"]))
    return results
