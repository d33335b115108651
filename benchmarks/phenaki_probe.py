"""Does a phenaki run's generator read the motion words, and does it prefer still clips? A probe on held-out
moving-shapes clips (docs/phenaki.md, "Why the clips stood still").

Each held-out clip is tokenized; its first token frame (the shape's start) stays visible and every later token frame
is masked. The generator's logits at the masked positions (conditional, no guidance) then score:

- `ce true`: cross-entropy of the clip's real tokens under its own caption, and `ce other`: under the same caption
  with each of the three other directions (mean). A generator that reads the motion words has ce true < ce other.
  Both over every masked token, and over the moving ones only (those that differ from the first token frame's token
  at the same place: the shape's; the background is the same in every frame and needs no caption).
- `direction from ce`: share of clips whose own caption gives the lowest cross-entropy of the four directions
  (chance 0.25).
- `still vs moving`: log p(the first token frame copied into every later frame) − log p(the real later frames),
  per clip, under the true caption; positive means the generator prefers a still clip to the real motion.

With `--kind`, where the kind (the shape's outline) is lost (docs/phenaki.md, "What limits the kind"):

- `kind from ce`: every token masked, the first token frame's real tokens scored under the clip's caption and under
  it with each other kind word; share of clips whose own kind gives the lowest cross-entropy (chance 0.25): does
  the generator read the kind word at all?
- the shapes judge's kind frame by frame (`judge_kind_by_frame`) of the clips generated from the caption, of clips
  primed with the clip's real first frame (the first token frame given, the rest generated), and of the tokenizer's
  reconstructions (the ceiling); with the kind of the later frames given a first frame of the right kind and of a
  wrong one: does the continuation carry an outline it is given?

With `--primed`, also the continuation of primed clips (`sample --prime`): each held-out clip's first 3 frames
(two token frames) prime a clip of the training length, prompted with its own caption and with the caption turned
to the next direction (left→right→up→down→left); the motion check (genforge.eval.motion) of the frames from the
last primed one on says whether the continuation goes the prompt's way.

    python benchmarks/phenaki_probe.py runs/phenaki-moving-shapes [--n 128] [--threads 2] [--primed] [--kind]
        [--cfg-scale 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from genforge.app.runs import load_run
from genforge.data.base import collate
from genforge.data.loader import heldout_samples
from genforge.data.moving_shapes import DIRECTIONS
from genforge.data.shapes import COLORS, KINDS
from genforge.eval.judge import judge_predictions, kind_by_frame, load_or_train_judge
from genforge.eval.motion import STILL, motion_direction
from genforge.families.phenaki.config import PhenakiSampleOptions


def with_direction(caption: str, direction: str) -> str:
    """The caption with its motion word replaced ("... moving left" -> "... moving up")."""
    return caption.rsplit("moving ", 1)[0] + f"moving {direction}"


def with_kind(caption: str, kind: str) -> str:
    """The caption with its kind word replaced ("a red circle moving left" -> "a red cross moving left")."""
    return " ".join(kind if word in KINDS else word for word in caption.split(" "))


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--primed", action="store_true", help="also the direction of primed continuations")
    parser.add_argument("--kind", action="store_true", help="also where the kind (outline) is lost")
    parser.add_argument("--cfg-scale", type=float, default=None,
                        help="guidance of the primed continuations and of --kind's clips (default: the run's "
                        "model.cfg_scale)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_run(args.run_dir)
    task, cfg = loaded.task.eval(), loaded.config
    samples = list(heldout_samples(cfg.data, args.n))
    per_frame = task.grid**2
    ce_true, ce_other, right, still_minus_moving, moving_true, moving_other = [], [], [], [], [], []
    for start in range(0, len(samples), args.batch):
        batch = collate(samples[start : start + args.batch])
        ids = task.to_tokens({"video": batch["video"]})  # [B, N]
        b, n = ids.shape
        masked = torch.zeros(n, dtype=torch.bool)
        masked[per_frame:] = True  # every token frame after the first
        inputs = ids.masked_fill(masked, task.model.mask_id)
        keep = torch.zeros(b, dtype=torch.bool)
        still = ids[:, :per_frame].repeat(1, n // per_frame)  # the first token frame in every frame: [B, N]
        changed = (ids != still)[:, masked].float()  # [B, M]: the moving shape's tokens
        per_direction, per_direction_moving = [], []
        for direction in DIRECTIONS:
            texts = [with_direction(t, direction) for t in batch["text"]]
            context, context_mask = task.context({"text": texts}, keep)
            logp = F.log_softmax(task.model(inputs, context, context_mask)[:, masked].float(), -1)  # [B, M, K]
            real = -logp.gather(-1, ids[:, masked, None])[..., 0]  # [B, M]
            per_direction.append(real.mean(1))  # [B]
            per_direction_moving.append((real * changed).sum(1) / changed.sum(1).clamp_min(1))  # [B]
        ce = torch.stack(per_direction, 1)  # [B, 4]
        truth = batch["direction"].long()  # [B]
        ce_moving = torch.stack(per_direction_moving, 1)  # [B, 4]
        moving_true.append(ce_moving.gather(1, truth[:, None])[:, 0])
        moving_other.append((ce_moving.sum(1) - moving_true[-1]) / 3)
        ce_true.append(ce.gather(1, truth[:, None])[:, 0])
        ce_other.append((ce.sum(1) - ce.gather(1, truth[:, None])[:, 0]) / 3)
        right.append(ce.argmin(1) == truth)
        context, context_mask = task.context({"text": list(batch["text"])}, keep)
        logp = F.log_softmax(task.model(inputs, context, context_mask)[:, masked].float(), -1)
        moving = logp.gather(-1, ids[:, masked, None])[..., 0].sum(1)  # [B]
        copied = logp.gather(-1, still[:, masked, None])[..., 0].sum(1)
        still_minus_moving.append(copied - moving)
    ce_true, ce_other = torch.cat(ce_true), torch.cat(ce_other)
    right, gap = torch.cat(right).float(), torch.cat(still_minus_moving)
    print(f"{args.run_dir}: {len(ce_true)} held-out clips, first token frame given, {n // per_frame - 1} masked")
    print(f"  ce true caption {ce_true.mean():.3f}, other directions {ce_other.mean():.3f} "
          f"(difference {float((ce_other - ce_true).mean()):+.3f})")
    moving_true, moving_other = torch.cat(moving_true), torch.cat(moving_other)
    print(f"  on the moving tokens only: ce true caption {moving_true.mean():.3f}, other directions "
          f"{moving_other.mean():.3f} (difference {float((moving_other - moving_true).mean()):+.3f})")
    print(f"  direction from ce: {right.mean():.3f} (chance 0.25)")
    print(f"  log p(still) - log p(real motion): mean {gap.mean():+.1f} nats, clips preferring still "
          f"{(gap > 0).float().mean():.3f}")
    if args.primed:
        primed_directions(task, samples, args.batch, args.cfg_scale)
    if args.kind:
        kind_probe(task, samples, args.batch, args.cfg_scale)


@torch.no_grad()
def primed_directions(task, samples: list[dict], batch_size: int, cfg_scale: float | None = None) -> None:
    """Direction accuracy of continuations primed with each clip's first 3 frames, prompted with its own direction
    and with the next one, decoded with guidance `cfg_scale` (None: the run's)."""
    for shift, name in ((0, "own caption"), (1, "next direction")):
        right, still = [], []
        for start in range(0, len(samples), batch_size):
            batch = collate(samples[start : start + batch_size])
            wanted = (batch["direction"].long() + shift) % len(DIRECTIONS)
            texts = [with_direction(t, DIRECTIONS[d]) for t, d in zip(batch["text"], wanted.tolist())]
            gen = torch.Generator().manual_seed(start)
            options = task.resolve(PhenakiSampleOptions(prime=batch["video"][:, :, :3], cfg_scale=cfg_scale))
            video = task.sample({"text": texts}, gen, len(texts), options)  # [B, C, T, H, W]
            found = motion_direction(video[:, :, 2:])  # from the last primed frame on
            right.append(found == wanted)
            still.append(found == STILL)
        print(f"  primed with 3 frames, {name}: direction right {torch.cat(right).float().mean():.3f}, "
              f"still {torch.cat(still).float().mean():.3f}")


@torch.no_grad()
def kind_probe(task, samples: list[dict], batch_size: int, cfg_scale: float | None = None) -> None:
    """Whether the generator reads the kind word (cross-entropy of the first token frame under each kind), and the
    judge's kind frame by frame of generated, first-frame-primed and reconstructed clips."""
    judge, per_frame = load_or_train_judge(), task.grid**2
    right, labels = [], []
    preds: dict[str, list[Tensor]] = {"generated from the caption": [], "primed with the real first frame": [],
                                      "the tokenizer's reconstructions": []}
    for start in range(0, len(samples), batch_size):
        batch = collate(samples[start : start + batch_size])
        codes = task.token_codec.encode(batch["video"])  # [B, t, h, w]
        ids = codes.flatten(1)  # [B, N]
        inputs, keep = torch.full_like(ids, task.model.mask_id), torch.zeros(len(ids), dtype=torch.bool)
        ce = []
        for kind in KINDS:
            context, context_mask = task.context({"text": [with_kind(t, kind) for t in batch["text"]]}, keep)
            logits = task.model(inputs, context, context_mask)[:, :per_frame].float()  # [B, h*w, K]
            ce.append(F.cross_entropy(logits.transpose(1, 2), ids[:, :per_frame], reduction="none").mean(1))  # [B]
        right.append(torch.stack(ce, 1).argmin(1) == batch["label"] // len(COLORS))
        texts = list(batch["text"])
        plain = task.resolve(PhenakiSampleOptions(cfg_scale=cfg_scale))
        primed = task.resolve(PhenakiSampleOptions(prime=batch["video"][:, :, :1], cfg_scale=cfg_scale))
        clips = {"generated from the caption": task.sample({"text": texts}, torch.Generator().manual_seed(start),
                                                           len(texts), plain),
                 "primed with the real first frame": task.sample({"text": texts}, torch.Generator().manual_seed(start),
                                                                 len(texts), primed),
                 "the tokenizer's reconstructions": task.token_codec.decode(codes).clamp(-1, 1)}
        for name, video in clips.items():  # [B, C, T, H, W] -> the judge's class of every frame [B, T]
            b, c, t, h, w = video.shape
            preds[name].append(judge_predictions(judge, video.transpose(1, 2).reshape(b * t, c, h, w)).view(b, t))
        labels.append(batch["label"])
    labels = torch.cat(labels)
    print(f"  kind from ce (first token frame, every token masked): {torch.cat(right).float().mean():.3f} "
          "(chance 0.25)")
    for name, rows in preds.items():
        rows = torch.cat(rows)
        kind = rows // len(COLORS) == (labels // len(COLORS))[:, None]  # [N, T]
        later, first = kind[:, 1:].float().mean(1), kind[:, 0]
        print(f"  {name}: kind by frame {kind_by_frame(rows, labels)}; later frames' kind when the first frame's "
              f"is right {later[first].mean():.3f} ({int(first.sum())} clips), wrong {later[~first].mean():.3f}")


if __name__ == "__main__":
    main()
