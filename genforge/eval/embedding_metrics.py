"""Metrics of image-text embedding models (CLIP, Radford et al. 2021, §3.1): zero-shot classification and
cross-modal retrieval, on unit-norm embeddings."""

from __future__ import annotations

import torch
from torch import Tensor


def zero_shot_accuracy(image_embeds: Tensor, class_embeds: Tensor, labels: Tensor) -> float:
    """Share of images whose most similar class prompt (cosine) is their class: image_embeds [n, D], class_embeds
    [K, D] (one prompt per class, in label order), labels long [n]."""
    predicted = (image_embeds.float() @ class_embeds.float().T).argmax(1)
    return float((predicted == labels.to(predicted.device)).float().mean())


def retrieval_recall(image_embeds: Tensor, text_embeds: Tensor, captions: list[str],
                     ks: tuple[int, ...] = (1, 5)) -> dict[str, float]:
    """Recall@k of image→text and text→image retrieval among n pairs (row i of both is a pair). A retrieved item
    counts as right when its caption is the query's caption, so that identical captions of different images
    ("a large red circle") are not counted as misses: i2t_r{k}, t2i_r{k}."""
    ids = {caption: i for i, caption in enumerate(dict.fromkeys(captions))}
    group = torch.tensor([ids[c] for c in captions])  # [n]: images sharing a caption share a group
    similarity = image_embeds.float().cpu() @ text_embeds.float().cpu().T  # [n images, n texts]
    results = {}
    for k in ks:
        k_eff = min(k, len(captions))
        i2t = group[similarity.topk(k_eff, dim=1).indices] == group[:, None]  # [n, k]: retrieved texts' groups
        t2i = group[similarity.T.topk(k_eff, dim=1).indices] == group[:, None]
        results[f"i2t_r{k}"] = float(i2t.any(1).float().mean())
        results[f"t2i_r{k}"] = float(t2i.any(1).float().mean())
    return results
