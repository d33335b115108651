"""Score a task (`genforge eval` and in-training evaluation): generators on fresh samples, tokenizers on
reconstructions of held-out images, with the registered metrics (genforge.eval.metrics). Takes the run's data and
eval sections and a Task; never the whole run config.

Samples are drawn by genforge.sampling, the path `genforge sample` takes. Several processes (torchrun /
accelerate launch): every rank generates its share of the samples and extracts their features; the rows are
gathered in sample order (`core.collectives`) before rank 0 computes any statistic, so the results equal those of
one process on the same samples. Tokenizers are scored on rank 0.

`precision` ("no", "bf16", "fp16"): the networks run under that autocast (`core.precision`); samples,
reconstructions and embeddings are cast back to float32 before a metric sees them. `report(done, total)`, when
given, is called after each batch with the samples this process has finished and its share of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from genforge.core.config import DataConfig, EvalConfig, SampleOptions
from genforge.core.precision import autocast
from genforge.core.task import Task
from genforge.data.loader import heldout_batch, heldout_sample_batches, heldout_split, pixel_field
from genforge.data.video import clip_frames
from genforge.core.collectives import gather_rows, rank_and_world
from genforge.eval.metrics import (EmbeddingMetric, EvalContext, ReconstructionMetric, SampleMetric, check_metrics,
                                   task_roles)
from genforge.sampling import Report, chunk_share, sample_chunks


def evaluate_task(task: Task, data: DataConfig, eval_cfg: EvalConfig, metrics: list[str], n: int, seed: int,
                  device: torch.device | str, batch_size: int = 64, precision: str = "no",
                  report: Report | None = None, options: SampleOptions | None = None) -> dict[str, Any]:
    """Run each metric on `n` fresh samples drawn with `options` (results include the sampler settings they resolve
    to), or for a tokenizer
    (`task.codec()` is not None) on `n` reconstructions of held-out images of `data`. Every rank of a process
    group must call it; rank 0 gets the results, the others an empty dict."""
    chosen = check_metrics(metrics, task_roles(task))
    ctx = EvalContext(data, eval_cfg, n, device, batch_size)
    codec = task.codec()
    if codec is not None:
        given = sorted(options.model_fields_set) if options is not None else []
        if given:
            raise ValueError(f"sampler options {given} do not apply to a {task_roles(task)[0]}")
        if rank_and_world()[0] != 0:
            return {}
        if task_roles(task) == ("embedder",):
            return evaluate_embedder(codec, chosen, ctx, precision=precision)
        return evaluate_tokenizer(codec, chosen, ctx, precision=precision, report=report)
    return evaluate_generator(task, chosen, ctx, seed, precision, report, options)


def with_metric_options(options: SampleOptions, metrics: list[SampleMetric]) -> SampleOptions:
    """The resolved `options` with those the metrics draw their samples with (`SampleMetric.sample_options`, e.g. a
    prior's every candidate for prior_similarity); ValueError when the family has no such option."""
    wanted = {name: value for metric in metrics for name, value in metric.sample_options.items()}
    for name in wanted:
        if name not in type(options).model_fields:
            metric = next(m.name for m in metrics if name in m.sample_options)
            raise ValueError(f"metric {metric!r} samples with the option {name!r}, which this model does not take")
    return options.model_copy(update=wanted) if wanted else options


def evaluate_generator(task: Task, metrics: list[SampleMetric], ctx: EvalContext, seed: int, precision: str = "no",
                       report: Report | None = None, options: SampleOptions | None = None) -> dict[str, Any]:
    """Sample metrics on `ctx.n` samples drawn with `options` (resolved here by the task), generated and featurised
    in shares over the ranks."""
    rank, world = rank_and_world()
    short = [m for m in metrics if ctx.n < m.min_samples]
    if short:
        raise ValueError(f"metric {short[0].name!r} needs at least {short[0].min_samples} samples, got n={ctx.n}")
    options = with_metric_options(task.resolve(options), metrics)
    ctx.cond = task.sample_conditions(ctx.n, torch.Generator(device=ctx.device).manual_seed(seed), options)
    extractors = list({id(m.extractor): m.extractor for m in metrics}.values())
    for extractor in extractors:
        extractor.setup(ctx)
    for metric in metrics:
        metric.setup(ctx)
    index: list[Tensor] = []
    rows: dict[int, list[Tensor]] = {id(e): [] for e in extractors}
    share = chunk_share(ctx.n, ctx.batch_size, rank, world)
    for start, images in sample_chunks(task, ctx.cond, ctx.n, seed, ctx.device, ctx.batch_size, rank, world,
                                       precision, options):
        index.append(torch.arange(start, start + len(images)))
        cond = {k: v[start : start + len(images)] for k, v in ctx.cond.items()}
        for extractor in extractors:
            rows[id(extractor)].append(extractor.rows(images, cond, ctx))
        if report is not None:
            report(sum(len(i) for i in index), share)
    order = torch.cat(index) if index else torch.zeros(0, dtype=torch.long)
    gathered = {id(e): gather_rows(torch.cat(rows[id(e)]) if rows[id(e)] else e.empty(), order) for e in extractors}
    if rank != 0:
        return {}
    results: dict[str, Any] = {"n": ctx.n, "sampler": task.sampler_settings(options)}
    for extractor in extractors:
        results.update(extractor.report(ctx))
    for metric in metrics:
        results.update(metric.score(gathered[id(metric.extractor)], ctx))
    return results


@torch.no_grad()
def evaluate_tokenizer(codec: nn.Module, metrics: list[ReconstructionMetric], ctx: EvalContext,
                       batch_size: int = 32, precision: str = "no",
                       report: Report | None = None) -> dict[str, Any]:
    """Encode and decode `ctx.n` held-out images or clips; each metric accumulates over the batches (reconstructions
    clamped to [-1, 1]; clips [B, C, T, H, W] are scored frame by frame, `n` counting clips)."""
    states = [metric.start(codec, ctx) for metric in metrics]
    count = 0
    for held in heldout_sample_batches(ctx.data, ctx.n, batch_size):
        images = held[pixel_field(ctx.data)].to(ctx.device)
        with autocast(precision, ctx.device):
            codes = codec.encode(images)
            recon = codec.decode(codes)
        codes = codes.float() if codes.is_floating_point() else codes  # latents; token ids stay integers
        recon = recon.float().clamp(-1, 1)
        count += len(images)
        if report is not None:
            report(count, ctx.n)
        images, recon = clip_frames(images), clip_frames(recon)  # clips: per frame
        for metric, state in zip(metrics, states):
            metric.update(state, images, codes, recon, held)
    if count == 0:
        raise ValueError(f"no readable images in the {heldout_split(ctx.data)!r} split of the run's data")
    results: dict[str, Any] = {"n": count, "split": heldout_split(ctx.data)}
    for metric, state in zip(metrics, states):
        results.update(metric.compute(state))
    return results


@torch.no_grad()
def evaluate_embedder(codec: nn.Module, metrics: list[EmbeddingMetric], ctx: EvalContext,
                      precision: str = "no") -> dict[str, Any]:
    """Embed `ctx.n` held-out images (with their labels and captions) once; each metric scores the embeddings."""
    heldout = heldout_batch(ctx.data, ctx.n)
    images = heldout["image"]
    with autocast(precision, ctx.device):
        embeds = [codec.embed_images(images[i : i + ctx.batch_size].to(ctx.device))
                  for i in range(0, len(images), ctx.batch_size)]
    embeds = torch.cat([e.float().cpu() for e in embeds])
    results: dict[str, Any] = {"n": len(images), "split": heldout_split(ctx.data)}
    for metric in metrics:
        results.update(metric.score(codec, embeds, heldout, ctx))
    return results


def write_eval_results(run_dir: Path, step: int, results: dict[str, Any]) -> Path:
    """`run_dir/eval/<step>.json`: the step and the results."""
    out = Path(run_dir) / "eval" / f"{step}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"step": step, **results}, indent=1))
    return out
