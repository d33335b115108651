"""Masked-token modelling (MaskGIT, Chang et al. 2022): the mask-ratio schedule, training masks, and
iterative parallel decoding with confidence-based re-masking. Shared by the token generators (maskgit;
phenaki over video tokens).

Shapes: B batch, N tokens, K codebook size; `mask_id` = K is the [MASK] token.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from genforge.nn.sampling import gumbel


def mask_ratio(r: Tensor, schedule: str = "cosine") -> Tensor:
    """γ(r): the share of tokens masked at r ∈ [0, 1] (MaskGIT §3.3, eq. in "Masking design"): γ(0) = 1,
    γ(1) = 0, decreasing. cosine: cos(πr/2); linear: 1 − r; square: 1 − r²."""
    if schedule == "cosine":
        return torch.cos(math.pi / 2 * r)
    if schedule == "linear":
        return 1 - r
    if schedule == "square":
        return 1 - r * r
    raise ValueError(f"unknown mask schedule {schedule!r}; allowed: cosine, linear, square")


def hidden_count(r: Tensor, n: int | Tensor, schedule: str = "cosine") -> Tensor:
    """Tokens hidden in training for mask-ratio draws r [B] ~ U[0, 1): ⌈γ(r)·N⌉, at least 1 -> long [B]; `n` the
    positions of every row, or of each row (long [B]: the real ones of clips with padding)."""
    return torch.ceil(mask_ratio(r, schedule) * n).clamp(min=1).minimum(torch.as_tensor(n).to(r)).long()


def training_mask(r: Tensor, scores: Tensor, schedule: str = "cosine", real: Tensor | None = None) -> Tensor:
    """Bool mask [B, N] of the tokens to hide: for each row, the `hidden_count` positions with the smallest
    `scores` [B, N] (i.i.d. uniform: a uniformly random subset). r [B] ~ U[0, 1). `real` bool [B, N]: only those
    positions are hidden, their `hidden_count` (the others are padding, never a target)."""
    if real is not None:
        scores = scores.masked_fill(~real, 2.0)  # above every uniform score: ranked last, never hidden
    count = hidden_count(r, scores.shape[1] if real is None else real.sum(1), schedule)  # [B]
    ranks = scores.argsort(dim=1).argsort(dim=1)  # [B, N]: rank of each position's score within its row
    return ranks < count[:, None]


def guided_logits(cond: Tensor, uncond: Tensor, scale: float) -> Tensor:
    """Classifier-free guidance on logits (Ho & Salimans 2022; MUSE §2.7): u + s·(c − u)."""
    return uncond + scale * (cond - uncond)


def sampling_temperature(step: int, steps: int, temperature: float, anneal: str = "constant") -> float:
    """The softmax temperature of decoding iteration `step` (0-based) of `steps`. constant: `temperature` at every
    iteration (MaskGIT's reference decoding); linear: temperature·(1 − (step+1)/steps), falling by temperature/steps
    an iteration to 0 (greedy) at the last one (phenaki-pytorch's Phenaki.sample, from its starting_temperature)."""
    if anneal == "constant":
        return temperature
    if anneal == "linear":
        return temperature * (1 - (step + 1) / steps)
    raise ValueError(f"unknown temperature anneal {anneal!r}; allowed: constant, linear")


def gumbel_noise(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> Tensor:
    """Standard Gumbel noise −log(−log u), u ~ U(0, 1) from `generator`."""
    return gumbel(torch.rand(shape, generator=generator, device=device))


def masked_count(step: int, steps: int, n: int, schedule: str = "cosine") -> int:
    """Tokens still masked after decoding iteration `step` (0-based) of `steps`: ⌊γ((step+1)/steps)·N⌋, at least
    one fewer than before (every iteration reveals a token) but at least one until the last iteration, and 0 after
    it (MaskGIT's reference: max(1, min(unknown − 1, planned))). With fewer tokens than iterations the last ones
    reveal nothing until the final one, instead of running on a fully decoded sequence."""
    if step == steps - 1:
        return 0
    before = n if step == 0 else masked_count(step - 1, steps, n, schedule)
    planned = int(math.floor(float(mask_ratio(torch.tensor((step + 1) / steps), schedule)) * n))
    return max(1, min(before - 1, planned))


def frame_training_mask(r: Tensor, frame: Tensor, scores: Tensor, frames: int, schedule: str = "cosine") -> Tensor:
    """Bool mask [B, N] (N = frames·P, frame-major) of frame-ordered training rows, the conditional that decoding
    token frames in order (`decode_order: frames`) asks for: token frames before `frame` [B] (long) all visible,
    frame `frame` with ⌈γ(r)·P⌉ random positions hidden (r [B] ~ U[0, 1), the row's `hidden_count` draw over P
    positions; `scores` [B, P] i.i.d. uniform choose them), every later token frame hidden."""
    b, p = scores.shape
    current = training_mask(r, scores, schedule)  # [B, P]: the hidden positions of the frame being decoded
    index = torch.arange(frames, device=scores.device)[None, :, None]  # [1, t, 1]
    at = frame[:, None, None]  # [B, 1, 1]
    mask = (index > at) | ((index == at) & current[:, None, :])  # [B, t, P]
    return mask.reshape(b, frames * p)


def frame_hidden_count(r: Tensor, frame: Tensor, per_frame: int, frames: int | Tensor,
                       schedule: str = "cosine") -> Tensor:
    """Tokens `frame_training_mask` hides per row [B]: ⌈γ(r)·P⌉ in the current frame + P per later frame (of
    `frames`, or of each row's real token frames long [B])."""
    return hidden_count(r, per_frame, schedule) + (frames - 1 - frame) * per_frame


@torch.no_grad()
def decode(logits_fn: Callable[[Tensor], Tensor], batch: int, n: int, mask_id: int, steps: int,
           generator: torch.Generator, device: torch.device, temperature: float = 1.0,
           choice_temperature: float = 4.5, schedule: str = "cosine",
           on_step: Callable[[int, Tensor], None] | None = None, initial: Tensor | None = None,
           critic: Callable[[Tensor], Tensor] | None = None, critic_noise: float = 1.0,
           generate: Tensor | None = None, temperature_anneal: str = "constant") -> Tensor:
    """MaskGIT's iterative decoding (§3.2): start from all [MASK]; at each iteration sample every masked token
    from softmax(logits / T), T = `sampling_temperature` of the iteration (`temperature`, or annealed to 0 with
    temperature_anneal=linear as phenaki-pytorch does; T = 0 takes the most likely token), then re-mask the
    `masked_count` least confident of the newly sampled ones, confidence = log p(sampled token) +
    choice_temperature·(1 − (t+1)/steps)·Gumbel noise. Tokens once revealed stay. `logits_fn` maps ids [B, N]
    (mask_id where masked) to logits [B, N, K].

    `initial` [B, N]: known ids kept as they are, mask_id where to generate (the same number in every row); the
    schedule then runs over the masked positions only (Phenaki's story mode: a clip continued from the tokens of
    the previous one). Returns ids [B, N] in [0, K), every position filled after exactly `steps` iterations.

    `generate` bool [N]: only these masked positions are decoded; the other masked ones stay [MASK] throughout and
    in the result (decoding a clip's token frames in order: one frame per call, the later ones still masked).

    `critic` (Token-Critic, Lezama et al. 2022, Alg. 1): maps the sampled sequence [B, N] to scores [B, N], high =
    looks real; the `masked_count` lowest-scoring tokens (+ critic_noise·(1 − (t+1)/steps)·Gumbel) are re-masked
    among all positions but the given ones, so a token revealed earlier can be re-masked and sampled again."""
    if initial is None:
        ids = torch.full((batch, n), mask_id, dtype=torch.long, device=device)  # [B, N]
    else:
        ids = initial.to(device=device, dtype=torch.long)
    region = torch.ones(n, dtype=torch.bool, device=device) if generate is None else generate.to(device)  # [N]
    free = ((ids == mask_id) & region).sum(1)  # [B]
    if ids.shape != (batch, n) or bool((free != free[0]).any()) or int(free[0]) == 0:
        raise ValueError(f"initial ids {tuple(ids.shape)} must be [{batch}, {n}] with the same, non-zero number "
                         "of masked positions to generate in every row")
    n = int(free[0])  # the schedule counts the positions to generate
    given = ~region | (ids != mask_id)  # [B, N]: known from the start or not decoded in this call: never re-masked
    for step in range(steps):
        masked = (ids == mask_id) & region  # [B, N]: still to decode
        logits = logits_fn(ids).float()  # [B, N, K]
        noise = gumbel_noise(logits.shape, generator, device)  # drawn at T = 0 too: the same stream either way
        t = sampling_temperature(step, steps, temperature, temperature_anneal)
        sampled = torch.argmax(logits / t + noise if t > 0 else logits, dim=-1)  # a draw from softmax(logits / T)
        sampled = torch.where(masked, sampled, ids)  # positions outside `region` keep [MASK]
        left = 1 - (step + 1) / steps  # the noise's annealing factor
        if critic is None:  # MaskGIT: confidence of the new tokens; revealed tokens are never re-masked
            drawn = sampled.clamp(max=logits.shape[-1] - 1)  # [MASK] outside `region`: any index, filled with inf
            confidence = torch.log_softmax(logits, dim=-1).gather(-1, drawn[..., None])[..., 0]  # [B, N]
            confidence = confidence + choice_temperature * left * gumbel_noise(confidence.shape, generator, device)
            confidence = confidence.masked_fill(~masked, float("inf"))
        else:  # Token-Critic: the critic's score of every token; only given tokens are never re-masked
            confidence = critic(sampled).float()  # [B, N]
            confidence = confidence + critic_noise * left * gumbel_noise(confidence.shape, generator, device)
            confidence = confidence.masked_fill(given, float("inf"))
        keep_masked = masked_count(step, steps, n, schedule)
        ids = sampled
        if keep_masked:
            lowest = confidence.topk(keep_masked, dim=1, largest=False).indices  # [B, keep_masked]
            ids = ids.scatter(1, lowest, mask_id)
        if on_step is not None:
            on_step(step, ids)
    return ids
