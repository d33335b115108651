"""Can phenaki's transformer learn a motion that its condition chooses? A synthetic check of the positions
(docs/phenaki.md, "Why the clips stood still").

Each example is two token frames of 8 × 8 random ids: the second is the first shifted one column left or right, and
a class label says which. The transformer sees the first frame and the label and predicts the second. Reading the
label and attending to "the token one column over in the frame before" drives the loss to zero; a model that cannot
pick an offset by its condition stays at chance (ln K nats). Printed: the loss under the true label and under the
other one, every 100 steps, for `absolute` and `rotary` positions (`model.positions`).

    python benchmarks/phenaki_shift.py [--steps 600] [--threads 2]
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

from genforge.families.phenaki.model import VideoMaskTransformer

CODES, SIDE = 16, 8


def shifted_pairs(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, 2·SIDE²] (frame 0, then frame 0 rolled one column: left for label 0, right for 1) and labels [B]."""
    first = torch.randint(0, CODES, (batch, SIDE, SIDE), generator=generator)
    label = torch.randint(0, 2, (batch,), generator=generator)
    second = torch.where(label[:, None, None] == 0, first.roll(-1, dims=2), first.roll(1, dims=2))
    return torch.cat([first.flatten(1), second.flatten(1)], dim=1), label


def train(positions: str, steps: int, batch: int) -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    per_frame = SIDE * SIDE
    model = VideoMaskTransformer(CODES, per_frame, width=64, depth=2, num_heads=4, num_classes=2, positions=positions)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    keep = torch.zeros(batch, dtype=torch.bool)
    for step in range(1, steps + 1):
        ids, label = shifted_pairs(batch, generator)
        shown = ids.clone()
        shown[:, per_frame:] = model.mask_id  # the second frame hidden
        logits = model(shown, *model.context(keep, labels=label))[:, per_frame:]  # [B, P, K]
        loss = F.cross_entropy(logits.reshape(-1, CODES), ids[:, per_frame:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            with torch.no_grad():
                wrong = model(shown, *model.context(keep, labels=1 - label))[:, per_frame:]
                wrong_loss = F.cross_entropy(wrong.reshape(-1, CODES), ids[:, per_frame:].reshape(-1))
            print(f"  {positions:8s} step {step:4d}: loss {loss.item():.3f} nats, with the other label "
                  f"{wrong_loss.item():.3f} (chance {math.log(CODES):.3f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for positions in ("absolute", "rotary"):
        train(positions, args.steps, args.batch)


if __name__ == "__main__":
    main()
