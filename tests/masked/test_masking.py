"""MaskGIT's mask schedule, training masks and iterative decoding (genforge/masked/masking.py)."""

import math

import pytest
import torch

from genforge.masked import masking
from genforge.masked.masking import (decode, frame_hidden_count, frame_training_mask, hidden_count, mask_ratio,
                                     masked_count, sampling_temperature, training_mask)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "square"])
def test_mask_ratio_goes_from_all_to_none_and_decreases(schedule):
    r = torch.linspace(0, 1, 101)
    gamma = mask_ratio(r, schedule)
    assert gamma[0] == 1 and abs(gamma[-1]) < 1e-6
    assert (gamma[1:] <= gamma[:-1]).all()


def test_cosine_training_masks_hide_two_over_pi_of_the_tokens_on_average():
    gen = torch.Generator().manual_seed(0)
    b, n = 20_000, 256
    r, scores = torch.rand(b, generator=gen), torch.rand(b, n, generator=gen)
    mask = training_mask(r, scores, "cosine")
    # E_r[cos(πr/2)] = 2/π; the ceiling adds < 1/N
    assert mask.float().mean().item() == pytest.approx(2 / math.pi, abs=0.006)
    counts = torch.ceil(torch.cos(math.pi / 2 * r) * n).clamp(1, n)
    assert torch.equal(mask.sum(1), counts.long())  # exactly ⌈γ(r)·N⌉ per row, at least one
    per_position = mask.float().mean(0)  # a uniformly random subset: every position equally often
    assert (per_position - per_position.mean()).abs().max() < 0.03


def test_masked_count_reveals_a_token_per_step_keeps_one_masked_until_the_last_and_ends_at_zero():
    for steps, n in [(12, 64), (8, 256), (1, 16), (20, 8), (48, 16)]:
        counts = [masked_count(s, steps, n) for s in range(steps)]
        assert counts[-1] == 0 and all(c >= 1 for c in counts[:-1])  # nothing decoded early, all at the end
        previous = n
        for c in counts[:-1]:
            assert c <= max(previous - 1, 1)  # one fewer each step while more than one is left
            previous = c
    # the cosine schedule at 12 steps of 64 tokens: ⌊64·cos(π/2·t/12)⌋
    assert [masked_count(s, 12, 64) for s in range(3)] == [63, 61, 59]
    # fewer tokens than iterations (Phenaki's 48 steps over a small region): the last token waits for the last step
    assert [masked_count(s, 48, 16) for s in range(48)][14:17] == [1, 1, 1]


def test_frame_training_masks_hide_part_of_one_token_frame_and_every_later_one():
    gen = torch.Generator().manual_seed(0)
    b, frames, p = 64, 5, 16
    r, frame = torch.rand(b, generator=gen), torch.randint(0, frames, (b,), generator=gen)
    mask = frame_training_mask(r, frame, torch.rand(b, p, generator=gen), frames).view(b, frames, p)
    for row in range(b):
        f = int(frame[row])
        assert not mask[row, :f].any()  # earlier token frames all visible
        assert mask[row, f + 1 :].all()  # later ones all hidden
        assert mask[row, f].sum() == hidden_count(r[row : row + 1], p)[0]  # ⌈γ(r)·P⌉ of the current one
    assert torch.equal(mask.flatten(1).sum(1), frame_hidden_count(r, frame, p, frames))


def test_decode_fills_every_position_in_exactly_the_given_steps_and_keeps_revealed_tokens():
    b, n, k, steps = 3, 64, 10, 12
    seen, states = [], []
    logits = torch.randn(b, n, k, generator=torch.Generator().manual_seed(1))

    def logits_fn(ids):
        seen.append((ids == k).sum(1))
        return logits

    ids = decode(logits_fn, b, n, mask_id=k, steps=steps, generator=torch.Generator().manual_seed(0),
                 device=torch.device("cpu"), on_step=lambda s, x: states.append(x.clone()))
    assert len(seen) == steps and (seen[0] == n).all()
    assert ids.shape == (b, n) and (ids != k).all() and ids.max() < k
    for step, state in enumerate(states):
        assert ((state == k).sum(1) == masked_count(step, steps, n)).all()
        if step:
            revealed = states[step - 1] != k
            assert torch.equal(state[revealed], states[step - 1][revealed])
    assert torch.equal(states[-1], ids)


def test_decode_samples_from_the_logits_and_is_reproducible():
    b, n, k = 4, 16, 5
    peaked = torch.full((b, n, k), -30.0)
    peaked[..., 3] = 30.0
    out = decode(lambda ids: peaked, b, n, k, 4, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert (out == 3).all()
    flat = torch.zeros(b, n, k)
    run = lambda: decode(lambda ids: flat, b, n, k, 4, torch.Generator().manual_seed(7), torch.device("cpu"))
    assert torch.equal(run(), run())
    many = decode(lambda ids: torch.zeros(512, n, k), 512, n, k, 4, torch.Generator().manual_seed(1),
                  torch.device("cpu"))
    freq = torch.bincount(many.flatten(), minlength=k).float() / many.numel()
    assert (freq - 1 / k).abs().max() < 0.02  # uniform logits: uniform tokens


def test_decode_keeps_initial_tokens_and_schedules_only_the_masked_ones():
    b, n, k, steps = 2, 12, 7, 4
    initial = torch.full((b, n), k)
    initial[:, :5] = torch.tensor([1, 2, 3, 4, 5])  # known: the first five positions of every row
    states = []
    ids = decode(lambda ids: torch.zeros(b, n, k), b, n, k, steps, torch.Generator().manual_seed(0),
                 torch.device("cpu"), on_step=lambda s, x: states.append(x.clone()), initial=initial)
    assert torch.equal(ids[:, :5], initial[:, :5]) and (ids != k).all()
    for step, state in enumerate(states):  # the schedule of the 7 positions to generate
        assert torch.equal(state[:, :5], initial[:, :5])
        assert ((state == k).sum(1) == masked_count(step, steps, n - 5)).all()
    ragged = initial.clone()
    ragged[0, 5] = 0  # one row with fewer positions to generate
    with pytest.raises(ValueError, match="same, non-zero number of masked positions"):
        decode(lambda ids: torch.zeros(b, n, k), b, n, k, steps, torch.Generator(), torch.device("cpu"),
               initial=ragged)


def test_decode_with_a_critic_re_masks_the_tokens_it_scores_lowest_among_all_but_the_given_ones():
    """Token-Critic decoding: the critic judges every position each step, so a token revealed before is re-masked
    when it scores low; given tokens stay; every position is filled at the end."""
    b, n, k, steps = 2, 12, 7, 4
    initial = torch.full((b, n), k)
    initial[:, :3] = 6  # given: the first three positions
    calls = []

    def critic(ids):  # even steps prefer low positions, odd steps high ones; given positions score lowest of all
        calls.append(ids.clone())
        order = torch.arange(n).float()
        return (-order if len(calls) % 2 else order).expand(b, n)

    states = []
    ids = decode(lambda ids: torch.zeros(b, n, k), b, n, k, steps, torch.Generator().manual_seed(0),
                 torch.device("cpu"), on_step=lambda s, x: states.append(x.clone()), initial=initial, critic=critic,
                 critic_noise=0.0)
    assert (ids != k).all() and torch.equal(ids[:, :3], initial[:, :3])
    assert all(torch.equal(state[:, :3], initial[:, :3]) for state in states)
    free = torch.arange(3, n)
    for step, state in enumerate(states[:-1]):
        still = masked_count(step, steps, n - 3)
        assert ((state == k).sum(1) == still).all()
        masked = free[-still:] if step % 2 == 0 else free[:still]  # the lowest-scoring free positions
        assert (state[:, masked] == k).all()
    assert (states[0][:, 3] != k).all() and (states[1][:, 3] == k).all()  # revealed at step 0, re-masked at step 1
    # without a critic, a revealed token is never re-masked
    plain = []
    decode(lambda ids: torch.zeros(b, n, k), b, n, k, steps, torch.Generator().manual_seed(0), torch.device("cpu"),
           on_step=lambda s, x: plain.append(x.clone()), initial=initial)
    revealed = plain[0] != k
    assert all((state[revealed] == plain[0][revealed]).all() for state in plain[1:])


def test_decode_of_a_region_fills_only_it_and_leaves_the_other_masked_positions_masked():
    b, n, k, steps = 2, 12, 7, 4
    region = torch.zeros(n, dtype=torch.bool)
    region[4:8] = True  # the second of three "frames" of 4 tokens
    initial = torch.full((b, n), k)
    initial[:, :4] = 3  # the first frame known
    seen = []

    def logits_fn(ids):
        seen.append(ids.clone())
        return torch.randn(b, n, k, generator=torch.Generator().manual_seed(len(seen)))

    ids = decode(logits_fn, b, n, mask_id=k, steps=steps, generator=torch.Generator().manual_seed(0),
                 device=torch.device("cpu"), initial=initial, generate=region)
    assert (ids[:, :4] == 3).all() and (ids[:, 4:8] < k).all() and (ids[:, 8:] == k).all()
    assert all((s[:, 8:] == k).all() for s in seen)  # the later frame is [MASK] to the model throughout
    assert [int((s[:, 4:8] == k).sum(1)[0]) for s in seen] == [4, 3, 2, 1]  # one revealed per step, the last at the end


def test_the_sampling_temperature_is_constant_or_annealed_linearly_to_zero_as_phenaki_pytorch_does():
    """linear: phenaki-pytorch's starting_temperature · (steps − (step + 1)) / steps at each iteration."""
    assert [sampling_temperature(s, 4, 0.9) for s in range(4)] == [0.9] * 4
    annealed = [sampling_temperature(s, 4, 0.9, "linear") for s in range(4)]
    assert annealed == pytest.approx([0.9 * 3 / 4, 0.9 * 2 / 4, 0.9 * 1 / 4, 0.0])
    with pytest.raises(ValueError, match="constant, linear"):
        sampling_temperature(0, 4, 1.0, "cosine")


@pytest.mark.parametrize("anneal", ["constant", "linear"])
def test_decode_samples_each_iteration_at_its_scheduled_temperature(monkeypatch, anneal):
    b, n, k, steps = 2, 16, 5, 4
    used = []

    def recorded(step, total, temperature, schedule="constant"):
        used.append(sampling_temperature(step, total, temperature, schedule))
        return used[-1]

    monkeypatch.setattr(masking, "sampling_temperature", recorded)
    decode(lambda ids: torch.zeros(b, n, k), b, n, k, steps, torch.Generator().manual_seed(0), torch.device("cpu"),
           temperature=0.8, temperature_anneal=anneal)
    assert used == pytest.approx([0.8] * 4 if anneal == "constant" else [0.6, 0.4, 0.2, 0.0])


def test_an_annealed_last_iteration_takes_the_most_likely_token():
    """Temperature 0 (the linear anneal's last iteration; its only one with steps=1) is greedy; a constant
    temperature draws from the softmax."""
    b, n, k = 64, 16, 5
    logits = torch.zeros(b, n, k)
    logits[..., 2] = 0.5  # token 2 the most likely, but only slightly
    run = lambda anneal: decode(lambda ids: logits, b, n, k, 1, torch.Generator().manual_seed(0),  # noqa: E731
                                torch.device("cpu"), temperature_anneal=anneal)
    assert (run("linear") == 2).all()
    assert 0.2 < (run("constant") == 2).float().mean() < 0.5  # softmax: e^0.5 / (4 + e^0.5) ≈ 0.29
