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


def prior_similarities(candidates: Tensor, caption_embeds: Tensor, captions: list[str],
                       image_embeds: Tensor | None = None) -> dict[str, float]:
    """What DALLE2-pytorch's prior trainer reports, as mean cosine similarities over n captions, from a prior's k
    candidates per caption [n, k, D] in the order drawn ([n, D]: one each): the predicted image embedding against
    its caption's text embedding [n, D] (`text_similarity`), against an unrelated caption's
    (`unrelated_text_similarity`: the next row with another caption), and with the captions' true image embeddings
    [n, D] against the prediction (`image_similarity`) and against the caption (`baseline_similarity`, what CLIP
    itself gives). Each prediction's figure twice: `_single`, of the first candidate (one draw: unbiased), and
    `_reranked`, of the candidate most similar to its caption (DALL·E 2 §2.2's reranking, what a decoder is given;
    its text similarity is biased upward, being what it was chosen by). With k = 1 the two are equal."""
    c = F.normalize(candidates.float(), dim=-1)
    c = c[:, None] if c.dim() == 2 else c  # [n, k, D]
    t = F.normalize(caption_embeds.float(), dim=-1)  # [n, D]
    kept = c[torch.arange(len(c)), torch.einsum("nkd,nd->nk", c, t).argmax(dim=1)]  # [n, D]
    i = F.normalize(image_embeds.float(), dim=-1) if image_embeds is not None else None
    results = {}
    for name, p in (("single", c[:, 0]), ("reranked", kept)):
        results[f"text_similarity_{name}"] = (p * t).sum(-1).mean().item()
        results[f"unrelated_text_similarity_{name}"] = (p * t[unrelated_rows(captions)]).sum(-1).mean().item()
        if i is not None:
            results[f"image_similarity_{name}"] = (p * i).sum(-1).mean().item()
    if i is not None:
        results["baseline_similarity"] = (t * i).sum(-1).mean().item()
    return results
