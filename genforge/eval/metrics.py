"""The metrics of `genforge eval` and in-training evaluation, each registered by name (genforge.core.registry).

A metric says what it reports (`results`), which models it applies to (`requires`: roles a family declares in
its config and a task shows at run time: "generator"; "tokenizer", plus "discrete" for TokenCodecs) and how it
scores:
- `SampleMetric` (generators): per-sample rows from a `FeatureExtractor` (shared by the metrics that use the same
  one), gathered over processes in sample order, scored on rank 0 against the sampling conditions;
- `ReconstructionMetric` (tokenizers): accumulated over batches of held-out images and their reconstructions.
A new metric is a subclass instance registered here or in any module imported before evaluation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import genforge.eval.distribution_metrics as dm
from genforge.core.codec import TokenCodec, codec_kind
from genforge.core.config import DataConfig, EvalConfig
from genforge.core.registry import METRICS
from genforge.core.task import Batch, Task
from genforge.data.loader import (class_names, has_motion, heldout_batches, heldout_split, image_data,
                                  judged_by_shapes_judge, pixel_field)
from genforge.data.video import clip_frames
from genforge.eval.embedding_metrics import prior_similarities, retrieval_recall, zero_shot_accuracy
from genforge.nn.features import I3DFeatures, InceptionFeatures, InceptionLogits
from genforge.nn.perceptual import PerceptualLoss
from genforge.eval.judge import JUDGE_FILE, judge_predictions, kind_by_frame, load_or_train_judge, prediction_report
from genforge.eval.motion import STILL, motion_direction
from genforge.eval.reference import Reference, pool_features, reference_source, reference_stats
from genforge.eval.tokenizer_metrics import CodebookUsage, psnr, ssim

ROLE_NAMES = {("generator",): "generator", ("tokenizer",): "continuous tokenizer",
              ("discrete", "tokenizer"): "discrete tokenizer", ("embedder",): "image-text embedder"}


def task_roles(task: Task) -> tuple[str, ...]:
    """The roles of a task at run time: a generator, a tokenizer (discrete when its codec is a TokenCodec), or an
    image(-text) embedder (its codec is an ImageEmbedder)."""
    codec = task.codec()
    if codec is None:
        return ("generator",)
    kind = codec_kind(codec)
    return {"tokens": ("tokenizer", "discrete"), "image_embed": ("embedder",)}.get(kind, ("tokenizer",))


@dataclass
class EvalContext:
    """What every metric of one evaluation sees: the run's data and eval sections, the sample count, the device."""

    data: DataConfig
    eval: EvalConfig
    n: int
    device: torch.device | str
    batch_size: int = 64
    cond: Batch = field(default_factory=dict)  # generators: the conditions of all n samples
    _reference: Reference | None = None
    _reference_done: bool = False

    def reference(self) -> Reference | None:
        """Real-image statistics for fid/kid/prdc, computed (or read from the cache) once; every rank calls it."""
        if not self._reference_done:
            source = reference_source(self.data, self.eval.ref)
            self._reference = reference_stats(feature_network(str(self.device)), source, self.eval.ref_n or self.n,
                                              self.device, self.batch_size)
            self._reference_done = True
        return self._reference


class Metric:
    """A registered metric."""

    name: str
    results: tuple[str, ...]  # what it reports
    requires: tuple[str, ...]  # roles the model must have
    needs: str  # the requirement in words, for errors
    lower_is_better: tuple[str, ...] = ()  # results where smaller is better (train.keep_best_mode=min)

    def applies_to(self, roles: tuple[str, ...]) -> bool:
        return set(self.requires) <= set(roles)


# -------------------------------------------------------------------------------------------- generators
class FeatureExtractor:
    """Per-sample rows of generated images, shared by the metrics that name the same extractor."""

    def setup(self, ctx: EvalContext) -> None:
        """Before sampling, on every rank: build what is needed, fail early."""

    def rows(self, images: Tensor, cond: Batch, ctx: EvalContext) -> Tensor:
        """Rows [b, ...] (CPU) of images [b, 3, H, W] in [-1, 1] with their conditions."""
        raise NotImplementedError

    def empty(self) -> Tensor:
        """No rows (a rank without samples)."""
        raise NotImplementedError

    def report(self, ctx: EvalContext) -> dict[str, Any]:
        """What the results should say about the extractor."""
        return {}


@functools.lru_cache(maxsize=1)
def feature_network(device: str) -> InceptionFeatures:
    """The FID Inception-v3 (local weights) for fid/kid/is/prdc, built once per process."""
    return InceptionFeatures().to(device)


class InceptionPool(FeatureExtractor):
    """Inception-v3 pool3 features [b, 2048] of the uint8-quantised images, or [b, T, 2048] of each frame of clips."""

    def setup(self, ctx: EvalContext) -> None:
        feature_network(str(ctx.device))

    def rows(self, images: Tensor, cond: Batch, ctx: EvalContext) -> Tensor:
        net = feature_network(str(ctx.device))
        features = pool_features(net, clip_frames(images), ctx.device, ctx.batch_size)
        return features.view(images.shape[0], images.shape[2], -1) if images.ndim == 5 else features  # clips: per frame

    def empty(self) -> Tensor:
        return torch.zeros(0, InceptionFeatures.dim)

    def report(self, ctx: EvalContext) -> dict[str, Any]:
        return {"features": feature_network(str(ctx.device)).fingerprint()["network"]}


class JudgePredictions(FeatureExtractor):
    """The shapes judge's predicted class of each image [b], or of each frame of each clip [b, T]."""

    def setup(self, ctx: EvalContext) -> None:
        if not judged_by_shapes_judge(ctx.data):
            raise ValueError("metric 'judge' needs a model trained on data with the shapes classes (data.source=shapes "
                             "or moving_shapes, or a cache encoded from them)")
        if "label" not in ctx.cond:
            raise ValueError("metric 'judge' needs a class-conditional model")
        load_or_train_judge()

    def rows(self, images: Tensor, cond: Batch, ctx: EvalContext) -> Tensor:
        predictions = judge_predictions(load_or_train_judge(), clip_frames(images))
        return predictions.view(images.shape[0], images.shape[2]) if images.ndim == 5 else predictions  # clips: [b, T]

    def empty(self) -> Tensor:
        return torch.zeros(0, dtype=torch.long)

    def report(self, ctx: EvalContext) -> dict[str, Any]:
        return {"judge_weights": JUDGE_FILE}  # scores compare only under the same judge (judge.py: JUDGE_VERSION)


class MotionDirections(FeatureExtractor):
    """The direction each clip moves [b] (global Lucas–Kanade velocity; genforge.eval.motion)."""

    def setup(self, ctx: EvalContext) -> None:
        if "direction" not in ctx.cond:
            raise ValueError("metric 'direction' needs clips prompted with a direction (a video model trained on "
                             "data.source=moving_shapes, sampled from its held-out captions)")

    def rows(self, images: Tensor, cond: Batch, ctx: EvalContext) -> Tensor:
        if images.ndim != 5:
            raise ValueError("metric 'direction' needs clips [B, C, T, H, W]")
        return motion_direction(images)

    def empty(self) -> Tensor:
        return torch.zeros(0, dtype=torch.long)


INCEPTION, JUDGE = InceptionPool(), JudgePredictions()


class SampleMetric(Metric):
    """A generator metric on the rows of `extractor` for all n samples."""

    requires = ("generator",)
    needs = "a generator"
    extractor: FeatureExtractor
    min_samples = 1
    sample_options: dict[str, Any] = {}  # sampling options its samples are drawn with (fields of the family's)

    def setup(self, ctx: EvalContext) -> None:
        """Before sampling, on every rank (collectives allowed): fail early, compute what all ranks share."""

    def score(self, rows: Tensor, ctx: EvalContext) -> dict[str, Any]:
        """Results from the rows of all samples, in sample order (rank 0)."""
        raise NotImplementedError


class Judge(SampleMetric):
    """Share of samples the shapes judge assigns to the requested class (kind, colour); clips frame by frame, and the
    share of clips whose majority class over the frames is the requested one."""

    name, results, extractor = "judge", ("judge_accuracy", "judge_kind_accuracy", "judge_colour_accuracy"), JUDGE

    def score(self, rows: Tensor, ctx: EvalContext) -> dict[str, Any]:
        labels = ctx.cond["label"].cpu()
        if rows.ndim == 1:
            return prediction_report(rows, labels)
        frames = prediction_report(rows.flatten(), labels.repeat_interleave(rows.shape[1]))
        return {**frames, "judge_clip_accuracy": (rows.mode(dim=1).values == labels).double().mean().item(),
                "judge_frames": rows.shape[1], "judge_kind_by_frame": kind_by_frame(rows, labels)}


class Direction(SampleMetric):
    """Share of clips that move the prompted way (moving_shapes), and of clips that do not move at all."""

    name, results, extractor = "direction", ("direction_accuracy", "direction_still"), MotionDirections()

    def score(self, rows: Tensor, ctx: EvalContext) -> dict[str, Any]:
        return direction_report(rows, ctx.cond["direction"].cpu())


def direction_report(directions: Tensor, truth: Tensor) -> dict[str, float]:
    """Share of clips moving the true way, and of clips that do not move."""
    return {"direction_accuracy": (directions == truth).double().mean().item(),
            "direction_still": (directions == STILL).double().mean().item()}


_NO_FEATURES = ("metric {!r} needs reference features; {} holds only mu and sigma (use an image folder or a "
                ".safetensors statistics file)")


class AgainstReference(SampleMetric):
    """Inception features of the samples against those of real images (eval.ref, default the held-out data)."""

    extractor = INCEPTION
    min_samples = 2
    needs_features = False  # KID and PRDC compare feature sets; FID only Gaussians (an .npz suffices)

    def setup(self, ctx: EvalContext) -> None:
        source = reference_source(ctx.data, ctx.eval.ref)
        npz = isinstance(source, Path) and source.suffix == ".npz"  # known on every rank, unlike the file's content
        if self.needs_features and npz:
            raise ValueError(_NO_FEATURES.format(self.name, source))
        reference = ctx.reference()
        if self.needs_features and reference is not None and reference.features is None:
            raise ValueError(_NO_FEATURES.format(self.name, source))

    def score(self, rows: Tensor, ctx: EvalContext) -> dict[str, Any]:
        reference = ctx.reference()  # clips: features of every frame on both sides (per-frame FID)
        return {"ref": str(reference.path), "ref_n": reference.n, **self.compare(reference, rows.flatten(0, -2))}

    def compare(self, reference: Reference, features: Tensor) -> dict[str, Any]:
        raise NotImplementedError


class FID(AgainstReference):
    name, results, lower_is_better = "fid", ("fid",), ("fid",)

    def compare(self, reference: Reference, features: Tensor) -> dict[str, Any]:
        return {"fid": dm.frechet_distance(reference.mu, reference.sigma, *dm.gaussian_stats(features))}


class KID(AgainstReference):
    name, results, lower_is_better, needs_features = "kid", ("kid_mean", "kid_std"), ("kid_mean",), True

    def compare(self, reference: Reference, features: Tensor) -> dict[str, Any]:
        mean, std = dm.kid(reference.features, features)
        return {"kid_mean": mean, "kid_std": std}


class PRDC(AgainstReference):
    name, results, needs_features = "prdc", ("precision", "recall", "density", "coverage"), True
    min_samples = dm.PRDC_K + 1

    def compare(self, reference: Reference, features: Tensor) -> dict[str, Any]:
        return dm.prdc(reference.features, features)


class InceptionScore(SampleMetric):
    """Needs eval.is_weights (the Inception logits layer, which the FID network lacks)."""

    name, results, extractor, min_samples = "is", ("is_mean", "is_std"), INCEPTION, dm.IS_SPLITS

    def setup(self, ctx: EvalContext) -> None:
        inception_logits(ctx.eval.is_weights)  # before sampling: fail early

    def score(self, rows: Tensor, ctx: EvalContext) -> dict[str, Any]:
        mean, std = dm.inception_score(inception_logits(ctx.eval.is_weights)(rows.flatten(0, -2)))  # clips: frames
        return {"is_mean": mean, "is_std": std}


@functools.lru_cache(maxsize=2)
def inception_logits(path: str | None) -> InceptionLogits:
    return InceptionLogits(path)


@functools.lru_cache(maxsize=2)
def i3d_features(path: str | None, device: str) -> I3DFeatures:
    return I3DFeatures(path).to(device)


class I3DClipFeatures(FeatureExtractor):
    """I3D features [b, D] of generated clips (eval.i3d_weights)."""

    def setup(self, ctx: EvalContext) -> None:
        clips = image_data(ctx.data)  # a video token cache: the clips it was encoded from
        if clips is None or pixel_field(clips) != "video":
            raise ValueError(f"metric 'fvd' needs a video model (data.source={ctx.data.source} gives no clips)")
        i3d_features(ctx.eval.i3d_weights, str(ctx.device))  # before sampling: fail early

    def rows(self, images: Tensor, cond: Batch, ctx: EvalContext) -> Tensor:
        net = i3d_features(ctx.eval.i3d_weights, str(ctx.device))
        return torch.cat([net(chunk.to(ctx.device)).cpu() for chunk in images.split(ctx.batch_size)])

    def empty(self) -> Tensor:
        return torch.zeros(0, I3DFeatures.dim)

    def report(self, ctx: EvalContext) -> dict[str, Any]:
        return {"i3d": str(i3d_features(ctx.eval.i3d_weights, str(ctx.device)).path)}


class FVD(SampleMetric):
    """Fréchet Video Distance: the Fréchet distance (as FID) between Gaussians fitted to the I3D features of the
    generated clips and of `eval.ref_n` (default n) held-out real clips of the run's data."""

    name, results, lower_is_better, extractor, min_samples = "fvd", ("fvd",), ("fvd",), I3DClipFeatures(), 2

    def score(self, rows: Tensor, ctx: EvalContext) -> dict[str, Any]:
        net, n = i3d_features(ctx.eval.i3d_weights, str(ctx.device)), ctx.eval.ref_n or ctx.n
        data, split = image_data(ctx.data), heldout_split(image_data(ctx.data))  # the clips behind a cache
        real = torch.cat([net(clips.to(ctx.device)).cpu()
                          for clips in heldout_batches(data, n, ctx.batch_size, "video")])
        if len(real) < 2:
            raise ValueError(f"metric 'fvd' needs at least 2 readable clips in the {split!r} split")
        fvd = dm.frechet_distance(*dm.gaussian_stats(real), *dm.gaussian_stats(rows))
        return {"fvd": fvd, "fvd_ref_n": len(real), "fvd_ref_split": split}


# -------------------------------------------------------------------------------------------- tokenizers
class ReconstructionMetric(Metric):
    """A tokenizer metric over held-out images x, their codes and reconstructions x̂ (clamped to [-1, 1]); clips come
    frame by frame ([B·T, C, H, W]) with their held-out batch `held` (per clip: `label`, `direction`, ...)."""

    requires = ("tokenizer",)
    needs = "a tokenizer"

    def start(self, codec: nn.Module, ctx: EvalContext) -> Any:
        """A fresh accumulator."""
        return {"sum": 0.0, "count": 0}

    def update(self, state: Any, images: Tensor, codes: Tensor, recon: Tensor, held: Batch) -> None:
        state["sum"] += float(self.per_image(recon, images).sum())
        state["count"] += len(images)

    def compute(self, state: Any) -> dict[str, Any]:
        return {self.name: state["sum"] / state["count"]}

    def per_image(self, recon: Tensor, images: Tensor) -> Tensor:
        """Scores [B] (the default accumulator reports their mean)."""
        raise NotImplementedError


class PSNR(ReconstructionMetric):
    name, results = "psnr", ("psnr",)

    def per_image(self, recon: Tensor, images: Tensor) -> Tensor:
        return psnr(recon, images)


class SSIM(ReconstructionMetric):
    name, results = "ssim", ("ssim",)

    def per_image(self, recon: Tensor, images: Tensor) -> Tensor:
        return ssim(recon, images)


@functools.lru_cache(maxsize=1)
def perceptual_metric(device: str) -> nn.Module:
    """The default PerceptualLoss (FID Inception, local weights), built once per process."""
    return PerceptualLoss().to(device)


class Perceptual(ReconstructionMetric):
    name, results, lower_is_better = "perceptual", ("perceptual",), ("perceptual",)

    def start(self, codec: nn.Module, ctx: EvalContext) -> Any:
        return {"sum": 0.0, "count": 0, "net": perceptual_metric(str(ctx.device))}

    def update(self, state: Any, images: Tensor, codes: Tensor, recon: Tensor, held: Batch) -> None:
        state["sum"] += float(state["net"](recon, images).sum())
        state["count"] += len(images)


class Codebook(ReconstructionMetric):
    """Usage, perplexity and dead codes over every id of the held-out images, and their histogram."""

    name, results = "codebook", ("codebook_usage", "codebook_perplexity", "codebook_dead")
    requires, needs = ("tokenizer", "discrete"), "a discrete tokenizer (TokenCodec: dvae, vqgan)"

    def start(self, codec: nn.Module, ctx: EvalContext) -> Any:
        if not isinstance(codec, TokenCodec):
            raise ValueError(f"metric 'codebook' needs {self.needs}; this codec has continuous latents")
        return CodebookUsage(codec.codebook_size)

    def update(self, state: Any, images: Tensor, codes: Tensor, recon: Tensor, held: Batch) -> None:
        state.update(codes)

    def compute(self, state: Any) -> dict[str, Any]:
        return {**state.compute(), "codebook_histogram": state.counts.tolist()}  # uses of each id, for TensorBoard


class ReconstructionJudge(ReconstructionMetric):
    """The shapes judge on the reconstructions of held-out shapes (clips: every frame) against their true class:
    how much of the kind and colour the tokenizer keeps, the ceiling of a generator over its codes."""

    name, results = "recon_judge", ("judge_accuracy", "judge_kind_accuracy", "judge_colour_accuracy")

    def start(self, codec: nn.Module, ctx: EvalContext) -> Any:
        if not judged_by_shapes_judge(ctx.data):
            raise ValueError("metric 'recon_judge' needs a tokenizer trained on data with the shapes classes "
                             "(data.source=shapes or moving_shapes)")
        return {"judge": load_or_train_judge(), "preds": [], "labels": []}

    def update(self, state: Any, images: Tensor, codes: Tensor, recon: Tensor, held: Batch) -> None:
        labels = held["label"]
        state["preds"].append(judge_predictions(state["judge"], recon).cpu().view(len(labels), -1))  # [b, T]
        state["labels"].append(labels.cpu())

    def compute(self, state: Any) -> dict[str, Any]:
        preds, labels = torch.cat(state["preds"]), torch.cat(state["labels"])  # [N, T] (images: T = 1), [N]
        report = prediction_report(preds.flatten(), labels.repeat_interleave(preds.shape[1]))
        return {**report, "judge_kind_by_frame": kind_by_frame(preds, labels)} if preds.shape[1] > 1 else report


class ReconstructionDirection(ReconstructionMetric):
    """The motion direction of reconstructed held-out moving-shapes clips against the true one (`direction`)."""

    name, results = "recon_direction", ("direction_accuracy", "direction_still")

    def start(self, codec: nn.Module, ctx: EvalContext) -> Any:
        if not has_motion(ctx.data):
            raise ValueError("metric 'recon_direction' needs a video tokenizer trained on clips with a known motion "
                             "(data.source=moving_shapes)")
        return {"directions": [], "truth": []}

    def update(self, state: Any, images: Tensor, codes: Tensor, recon: Tensor, held: Batch) -> None:
        truth = held["direction"]
        clips = recon.unflatten(0, (len(truth), -1)).transpose(1, 2)  # [B·T, C, H, W] -> [B, C, T, H, W]
        state["directions"].append(motion_direction(clips).cpu())
        state["truth"].append(truth)

    def compute(self, state: Any) -> dict[str, Any]:
        return direction_report(torch.cat(state["directions"]), torch.cat(state["truth"]))


# -------------------------------------------------------------------------------------------- embedders
class EmbeddingMetric(Metric):
    """An image-text embedder's metric over n held-out images: their unit-norm embeddings [n, D] and the held-out
    batch they come from (`label`, `text` where the data has them)."""

    requires, needs = ("embedder",), "an image-text embedder (clip)"

    def score(self, codec: nn.Module, image_embeds: Tensor, heldout: Batch, ctx: EvalContext) -> dict[str, Any]:
        raise NotImplementedError


class ZeroShot(EmbeddingMetric):
    """Zero-shot classification (CLIP §3.1.2): each class named in `eval.zero_shot_prompt` ("a {}"), each image given
    the class whose prompt is most similar."""

    name, results = "zero_shot", ("zero_shot_accuracy",)

    def score(self, codec: nn.Module, image_embeds: Tensor, heldout: Batch, ctx: EvalContext) -> dict[str, Any]:
        names = class_names(ctx.data)
        if not names or "label" not in heldout:
            raise ValueError("metric 'zero_shot' needs labelled data with class names (shapes, or an image folder "
                             "with class sub-folders)")
        prompts = [ctx.eval.zero_shot_prompt.format(name) for name in names]
        accuracy = zero_shot_accuracy(image_embeds, codec.embed_texts(prompts), heldout["label"])
        return {"zero_shot_accuracy": accuracy, "zero_shot_classes": len(names), "zero_shot_prompts": prompts[:3]}


class Retrieval(EmbeddingMetric):
    """Image→text and text→image retrieval among the n held-out (image, caption) pairs, recall@1 and @5."""

    name = "retrieval"
    results = ("retrieval_i2t_r1", "retrieval_t2i_r1", "retrieval_i2t_r5", "retrieval_t2i_r5")

    def score(self, codec: nn.Module, image_embeds: Tensor, heldout: Batch, ctx: EvalContext) -> dict[str, Any]:
        if "text" not in heldout:
            raise ValueError("metric 'retrieval' needs captioned data (a sidecar .txt per image, or shapes)")
        texts = heldout["text"]
        text_embeds = torch.cat([codec.embed_texts(texts[i : i + ctx.batch_size])
                                 for i in range(0, len(texts), ctx.batch_size)])
        recall = retrieval_recall(image_embeds, text_embeds, texts)
        return {**{f"retrieval_{k}": v for k, v in recall.items()}, "retrieval_distinct_captions": len(set(texts))}


# ------------------------------------------------------------------------------------------- variations
class SourcePairs(FeatureExtractor):
    """Per sample made from a source image (`cond["image"]`: the DALL·E 2 decoder's variations): PSNR, SSIM and the
    perceptual distance between the sample and its source (resized to the sample's size), rows [b, 3]."""

    def setup(self, ctx: EvalContext) -> None:
        if "image" not in ctx.cond:
            raise ValueError("metric 'variation' needs samples made from source images (a model whose samples are "
                             "variations of held-out images, e.g. dalle2_decoder)")
        perceptual_metric(str(ctx.device))

    def rows(self, images: Tensor, cond: Batch, ctx: EvalContext) -> Tensor:
        source = torch.nn.functional.interpolate(cond["image"].float().cpu(), size=images.shape[-2:], mode="bilinear",
                                                 antialias=True) if cond["image"].shape[-1] != images.shape[-1] \
            else cond["image"].float().cpu()
        images = images.float().cpu()
        perceptual = perceptual_metric(str(ctx.device))(images.to(ctx.device), source.to(ctx.device)).cpu()
        return torch.stack([psnr(images, source), ssim(images, source), perceptual.reshape(-1)], dim=1)

    def empty(self) -> Tensor:
        return torch.zeros(0, 3)


class Variation(SampleMetric):
    """How close variations stay to their source images: mean PSNR, SSIM and perceptual distance."""

    name, extractor = "variation", SourcePairs()
    results = ("variation_psnr", "variation_ssim", "variation_perceptual")
    lower_is_better = ("variation_perceptual",)

    def score(self, rows: Tensor, ctx: EvalContext) -> dict[str, Any]:
        means = rows.double().mean(0).tolist()
        return dict(zip(self.results, means))


# ----------------------------------------------------------------------------------------------- priors
class PredictedEmbeddings(FeatureExtractor):
    """A prior's samples are themselves the rows: every candidate embedding it drew, [b, k, D] in the order drawn
    (the metric samples with `keep_candidates`)."""

    def setup(self, ctx: EvalContext) -> None:
        if "caption_embed" not in ctx.cond:
            raise ValueError("metric 'prior_similarity' applies to a diffusion prior (dalle2_prior), whose samples "
                             "are image embeddings of captions")

    def rows(self, images: Tensor, cond: Batch, ctx: EvalContext) -> Tensor:
        return images.float().cpu()

    def empty(self) -> Tensor:
        return torch.zeros(0, 0, 0)


class PriorSimilarity(SampleMetric):
    """A prior's predicted image embeddings for held-out captions, as cosine similarities (DALLE2-pytorch's
    train_diffusion_prior.py): with the caption's text embedding, with an unrelated caption's, with the caption's
    true image embedding, each of one candidate (`_single`, unbiased) and of the reranked best of the prior's
    `candidates` (`_reranked`, what a decoder gets); CLIP's own text-image similarity of the true pairs as the
    baseline."""

    name, extractor = "prior_similarity", PredictedEmbeddings()
    sample_options = {"keep_candidates": True}
    results = tuple(f"prior_{what}_similarity_{which}" for what in ("text", "unrelated_text", "image")
                    for which in ("single", "reranked")) + ("prior_baseline_similarity", "prior_candidates")
    lower_is_better = ("prior_unrelated_text_similarity_single", "prior_unrelated_text_similarity_reranked")

    def score(self, rows: Tensor, ctx: EvalContext) -> dict[str, Any]:
        cond = ctx.cond
        found = prior_similarities(rows, cond["caption_embed"].cpu(), list(cond["text"]),
                                   cond["image_embed"].cpu() if "image_embed" in cond else None)
        return {**{f"prior_{k}": v for k, v in found.items()}, "prior_candidates": rows.shape[1]}


for _metric in (Judge(), Direction(), FID(), FVD(), KID(), InceptionScore(), PRDC(), PSNR(), SSIM(), Perceptual(),
                Codebook(), ReconstructionJudge(), ReconstructionDirection(), Variation(), ZeroShot(), Retrieval(),
                PriorSimilarity()):
    METRICS.register(_metric.name, _metric)


def check_metrics(names: list[str], roles: tuple[str, ...]) -> list[Metric]:
    """The registered metrics of `names`, each applicable to a model of `roles` (ValueError naming the first that
    is unknown or does not apply, with the ones that do)."""
    unknown = [m for m in names if m not in METRICS]
    allowed = [name for name, metric in METRICS.items() if metric.applies_to(roles)]
    if unknown:
        raise ValueError(f"unknown metric {unknown[0]!r}; allowed: {', '.join(METRICS)}")
    for name in names:
        metric = METRICS.get(name)
        if not metric.applies_to(roles):
            what = ROLE_NAMES.get(tuple(sorted(roles)), "/".join(roles))
            raise ValueError(f"metric {name!r} needs {metric.needs}; this model is a {what}, whose metrics are "
                             f"{', '.join(allowed)}")
    return [METRICS.get(name) for name in names]
