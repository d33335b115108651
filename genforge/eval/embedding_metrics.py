"""Metrics of image-text embedding models (CLIP, Radford et al. 2021, §3.1): zero-shot classification and
cross-modal retrieval, on unit-norm embeddings; and of a diffusion prior's predicted image embeddings (DALL·E 2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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


def unrelated_rows(captions: list[str]) -> Tensor:
    """For each row i, the first row after it (cyclically) whose caption differs: an unrelated caption [n] (i itself
    when every caption is the same)."""
    n = len(captions)
    index = torch.arange(n)
    for shift in range(1, n):
        other = (torch.arange(n) + shift) % n
        pending = torch.tensor([captions[i] == captions[j] for i, j in enumerate(index.tolist())])
        if not pending.any():
            break
        index = torch.where(pending, other, index)
    return index


def prior_similarities(predicted: Tensor, caption_embeds: Tensor, captions: list[str],
                       image_embeds: Tensor | None = None) -> dict[str, float]:
    """What DALLE2-pytorch's prior trainer reports, as mean cosine similarities over n captions: the predicted image
    embedding [n, D] against its caption's text embedding [n, D] (`text`), against an unrelated caption's
    (`unrelated_text`: the next row with another caption), and with the captions' true image embeddings [n, D]
    against the prediction (`image`) and against the caption (`baseline`, what CLIP itself gives)."""
    p, t = F.normalize(predicted.float(), dim=-1), F.normalize(caption_embeds.float(), dim=-1)
    results = {"text": (p * t).sum(-1).mean().item(),
               "unrelated_text": (p * t[unrelated_rows(captions)]).sum(-1).mean().item()}
    if image_embeds is not None:
        i = F.normalize(image_embeds.float(), dim=-1)
        results.update(image=(p * i).sum(-1).mean().item(), baseline=(t * i).sum(-1).mean().item())
    return results
