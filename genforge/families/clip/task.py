"""clip as a Task: the symmetric InfoNCE loss of CLIP (Radford et al. 2021, Fig. 3) over the global batch.

With several processes every rank gathers the image and text embeddings of all ranks with their gradients
(`_GatherRows`) and scores its own rows against every column: the mean over ranks of
the ranks' losses is the loss of the whole batch, and since DDP averages the ranks' gradients, which the gather's
backward already summed across ranks, 2 processes take the step 1 process takes on the same global batch. With
`train.grad_accum` > 1 each micro-batch (gathered over ranks) is its own contrastive batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
import torch.distributed as dist
import torch.nn.functional as F

from genforge.core.config import SampleOptions
from genforge.core.family import BuildContext
from genforge.core.task import Batch, Task
from genforge.families.clip.config import ClipConfig
from genforge.families.clip.model import ClipModel
from genforge.text.encoders import build_text_encoder


class _GatherRows(torch.autograd.Function):
    """All ranks' rows [b, D] -> [R·b, D] in rank order; backward sums the gradient of every rank's loss with
    respect to this rank's rows (each rank's loss reads every row)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        rows = len(grad) // dist.get_world_size()
        return grad[dist.get_rank() * rows : (dist.get_rank() + 1) * rows]


def gather_with_grad(x: Tensor) -> tuple[Tensor, int]:
    """All ranks' rows of x [b, D] in rank order, differentiable, and where this rank's rows start; (x, 0) alone."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    return _GatherRows.apply(x), dist.get_rank() * len(x)


def contrastive_loss(image: Tensor, text: Tensor, logit_scale: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Symmetric InfoNCE (CLIP Fig. 3): cross-entropy of this rank's images against every text of the global batch
    and of its texts against every image, averaged; image, text unit-norm [b, D]. Returns the loss and the in-batch
    image→text top-1 accuracy."""
    all_image, offset = gather_with_grad(image)
    all_text, _ = gather_with_grad(text)
    targets = torch.arange(len(image), device=image.device) + offset  # the matching column of each row
    logits_image = logit_scale * image.float() @ all_text.float().T  # [b, B]
    logits_text = logit_scale * text.float() @ all_image.float().T  # [b, B]
    loss = (F.cross_entropy(logits_image, targets) + F.cross_entropy(logits_text, targets)) / 2
    accuracy = (logits_image.argmax(1) == targets).float().mean()
    return loss, {"accuracy": accuracy.detach()}


class ClipTask(Task):
    """Trains `ClipModel`; its codec is the model itself (an ImageEmbedder), which `genforge encode` and the DALL·E 2
    decoder use. It makes no samples."""


    def __init__(self, cfg: ClipConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = ClipModel(cfg, ctx.info.image_size, build_text_encoder(cfg.text))

    def ema_module(self) -> torch.nn.Module:
        return self.model

    def codec(self) -> ClipModel:
        return self.model

    def loss(self, batch: Batch, phase: str, step: int) -> tuple[Tensor, dict[str, Tensor]]:
        if "text" not in batch:
            raise ValueError("clip trains on image-caption pairs: the data has no captions (a sidecar .txt per "
                             "image, .txt in shards, or data.source=shapes)")
        image = self.model.embed_images(batch["image"])  # [b, D]
        text = self.model.embed_texts(batch["text"])  # [b, D]
        scale = self.model.logit_scale()
        loss, logs = contrastive_loss(image, text, scale)
        return loss, {**logs, "logit_scale": scale.detach()}

    def sample(self, cond: Batch, generator: torch.Generator, n: int, options: SampleOptions,
               progress: bool = False) -> Tensor:
        raise ValueError("a clip model embeds images and texts; it does not generate (use genforge eval)")
