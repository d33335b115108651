"""The shapes judge: a small CNN trained on the procedural data, used to check that generated samples
show the requested class (share of samples it assigns to the requested label).

The judge ships with genforge: `SHIPPED_JUDGE` (genforge/eval/weights/shapes-judge-<JUDGE_VERSION>.safetensors,
written by `python benchmarks/judge.py --write`, a seeded `train_judge()`), so nothing trains it on a fresh machine.
Only where that file is missing does `load_or_train_judge` train one and cache it under $GENFORGE_CACHE/judge.

Versioning rule: scores are comparable only under the same judge, so a judge whose weights change (another
recipe, architecture, data or retraining) gets a new `JUDGE_VERSION`, hence a new file name; a file once shipped
is never overwritten with other weights.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from genforge.core.status import console
from genforge.core.files import cache_root
from genforge.data.shapes import COLORS, NUM_CLASSES, render_batch

JUDGE_SIZE = 32
JUDGE_VERSION = "v1"
JUDGE_FILE = f"shapes-judge-{JUDGE_VERSION}.safetensors"
SHIPPED_JUDGE = Path(__file__).with_name("weights") / JUDGE_FILE  # package data (pyproject.toml)
HELDOUT_IMAGES = 2000


class ShapesJudge(nn.Module):
    """Three conv stages (32 -> 16 -> 8 -> 4 px) and a linear classifier over the 16 classes."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()

        def stage(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.MaxPool2d(2))

        self.features = nn.Sequential(stage(3, width), stage(width, 2 * width), stage(2 * width, 4 * width))
        self.head = nn.Linear(4 * width * 4 * 4, NUM_CLASSES)

    def forward(self, images: Tensor) -> Tensor:
        # images [B, 3, H, W] in [-1, 1], any resolution -> logits [B, 16]
        if images.shape[-2:] != (JUDGE_SIZE, JUDGE_SIZE):
            images = F.interpolate(images, size=(JUDGE_SIZE, JUDGE_SIZE), mode="bilinear", antialias=True,
                                   align_corners=False)
        return self.head(self.features(images).flatten(1))


@torch.no_grad()
def judge_predictions(judge: ShapesJudge, images: Tensor, batch_size: int = 256) -> Tensor:
    """The judge's class [N] for `images` [N, 3, H, W] in [-1, 1] (puts `judge` in eval mode)."""
    judge.eval()
    device = next(judge.parameters()).device
    preds = [judge(images[start : start + batch_size].to(device).float()).argmax(1).cpu()
             for start in range(0, len(images), batch_size)]
    return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)


def judge_accuracy(judge: ShapesJudge, images: Tensor, labels: Tensor, batch_size: int = 256) -> float:
    """Share of `images` [N, 3, H, W] in [-1, 1] whose predicted class equals `labels` [N]."""
    if len(images) != len(labels) or not len(images):
        raise ValueError(f"judge_accuracy needs as many labels as images (> 0), got {len(images)} and {len(labels)}")
    return (judge_predictions(judge, images, batch_size) == labels.cpu()).sum().item() / len(labels)


def judge_report(judge: ShapesJudge, images: Tensor, labels: Tensor) -> dict[str, float]:
    """Class accuracy, and separately how often the kind and the colour of the primary shape are right."""
    if len(images) != len(labels) or not len(images):
        raise ValueError(f"judge_report needs as many labels as images (> 0), got {len(images)} and {len(labels)}")
    return prediction_report(judge_predictions(judge, images), labels.cpu())


def prediction_report(preds: Tensor, labels: Tensor) -> dict[str, float]:
    """`judge_report` from the judge's predicted classes [N] (e.g. gathered from several processes)."""
    n_colours, n = len(COLORS), len(labels)
    return {
        "judge_accuracy": (preds == labels).sum().item() / n,
        "judge_kind_accuracy": (preds // n_colours == labels // n_colours).sum().item() / n,
        "judge_colour_accuracy": (preds % n_colours == labels % n_colours).sum().item() / n,
    }


def kind_by_frame(preds: Tensor, labels: Tensor) -> list[float]:
    """For clips: the share of clips whose frame t shows the requested kind, for each t (preds [N, T], labels [N]);
    says whether outlines are lost as a clip goes on or are wrong from its first frame."""
    kinds = preds // len(COLORS) == (labels // len(COLORS))[:, None]  # [N, T]
    return [round(v, 4) for v in kinds.double().mean(0).tolist()]


def train_judge(image_size: int = JUDGE_SIZE, steps: int = 500, batch_size: int = 128, seed: int = 0,
                train_images: int = 12_000, heldout_images: int = HELDOUT_IMAGES) -> tuple[ShapesJudge, float]:
    """Train with AdamW on `train_images` pre-rendered samples (random flips, some batches blurred through a
    lower resolution); return the judge and its accuracy on `heldout_images` of a different seed."""
    train_images = min(train_images, steps * batch_size)  # never render more than training will see
    images, labels = render_batch(train_images, image_size, seed=10_000 + seed)
    test_images, test_labels = render_batch(heldout_images, image_size, seed=20_000 + seed)
    with torch.random.fork_rng(devices=[]):  # seeded init that leaves the caller's global RNG alone
        torch.manual_seed(seed)
        judge = ShapesJudge()
    opt = torch.optim.AdamW(judge.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.15)
    gen = torch.Generator().manual_seed(seed)
    judge.train()
    for _ in range(steps):
        idx = torch.randint(0, len(images), (batch_size,), generator=gen)
        x = images[idx]
        flip = torch.rand(batch_size, generator=gen) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        if torch.rand((), generator=gen) < 0.3:  # blur through a lower resolution: low-res inputs get upsampled
            low = int(torch.randint(image_size * 3 // 8, image_size, (), generator=gen))
            x = F.interpolate(F.interpolate(x, size=low, mode="bilinear", antialias=True), size=image_size,
                              mode="bilinear")
        loss = F.cross_entropy(judge(x), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return judge, judge_accuracy(judge, test_images, test_labels)


def save_judge(judge: ShapesJudge, path: str | Path) -> None:
    """Atomically write the judge's weights (safetensors)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per process: concurrent ranks never clash
    save_file({k: v.contiguous() for k, v in judge.state_dict().items()}, str(tmp))
    os.replace(tmp, path)


def load_judge(path: str | Path) -> ShapesJudge:
    """A judge from `save_judge` weights, in eval mode."""
    judge = ShapesJudge()
    judge.load_state_dict(load_file(str(path)))
    return judge.eval()


_LOADED: dict[Path, ShapesJudge] = {}


def judge_cache_path(cache_dir: str | Path | None = None) -> Path:
    """Where a judge trained here is cached: `cache_dir` or $GENFORGE_CACHE (default ~/.cache/genforge)."""
    return cache_root(cache_dir) / "judge" / JUDGE_FILE


def load_or_train_judge(cache_dir: str | Path | None = None) -> ShapesJudge:
    """The shipped judge (`SHIPPED_JUDGE`); only where that file is missing, the one cached under `cache_dir`,
    trained (about 40 s on 2 CPU cores) and cached on first use."""
    path = SHIPPED_JUDGE if SHIPPED_JUDGE.is_file() else judge_cache_path(cache_dir)
    if path not in _LOADED:
        if not path.is_file():
            console().info(f"training the shapes judge ({SHIPPED_JUDGE} is missing; once, cached at {path})")
            start = time.perf_counter()
            with torch.enable_grad():  # also when called under no_grad (a tokenizer's evaluation)
                judge, accuracy = train_judge()
            console().info(f"judge held-out accuracy {accuracy:.4f}, trained in "
                           f"{time.perf_counter() - start:.0f} s")
            save_judge(judge, path)
        _LOADED[path] = load_judge(path)
    return _LOADED[path]
