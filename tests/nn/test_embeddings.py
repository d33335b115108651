import math

import numpy as np
import pytest
import torch

from genforge.nn.embeddings import (
    LabelEmbedder,
    PatchEmbed,
    TimestepEmbedder,
    apply_rotary,
    rotary_tables,
    sincos_pos_embed_2d,
    timestep_embedding,
)


def test_timestep_embedding_values():
    emb = timestep_embedding(torch.tensor([0, 3]), 8)
    assert emb.shape == (2, 8) and emb.dtype == torch.float32
    assert torch.equal(emb[0], torch.tensor([1.0] * 4 + [0.0] * 4))  # cos 0, sin 0
    freqs = [10_000 ** (-i / 4) for i in range(4)]
    expected = [math.cos(3 * f) for f in freqs] + [math.sin(3 * f) for f in freqs]
    torch.testing.assert_close(emb[1], torch.tensor(expected))


def test_timestep_embedding_takes_floats_and_odd_widths():
    emb = timestep_embedding(torch.tensor([1.5, 0.25], dtype=torch.float64), 7)
    assert emb.shape == (2, 7) and torch.equal(emb[:, -1], torch.zeros(2))
    assert math.isclose(emb[0, 0].item(), math.cos(1.5), rel_tol=1e-6)


def test_timestep_embedder_shape():
    assert TimestepEmbedder(32, freq_dim=16)(torch.tensor([0, 999])).shape == (2, 32)


def reference_sincos(dim: int, grid_h: int, grid_w: int) -> np.ndarray:
    """Token by token: [sin(x·ω), cos(x·ω), sin(y·ω), cos(y·ω)], ω_i = 10000^(-i/(dim/4))."""
    k = dim // 4
    omega = 1.0 / 10_000 ** (np.arange(k) / k)
    rows = []
    for y in range(grid_h):
        for x in range(grid_w):
            rows.append(np.concatenate([np.sin(x * omega), np.cos(x * omega), np.sin(y * omega), np.cos(y * omega)]))
    return np.stack(rows)


@pytest.mark.parametrize("dim,grid_h,grid_w", [(16, 3, 5), (64, 4, 4)])
def test_sincos_2d_values(dim, grid_h, grid_w):
    pe = sincos_pos_embed_2d(dim, grid_h, grid_w)
    assert pe.shape == (grid_h * grid_w, dim) and pe.dtype == torch.float32
    assert not isinstance(pe, torch.nn.Parameter) and not pe.requires_grad
    torch.testing.assert_close(pe, torch.from_numpy(reference_sincos(dim, grid_h, grid_w)).float())


def test_sincos_2d_halves_and_width_check():
    pe = sincos_pos_embed_2d(16, 3, 5)
    assert torch.equal(pe[0, :8], pe[5, :8]) and not torch.equal(pe[0, 8:], pe[5, 8:])  # same column
    assert torch.equal(pe[0], torch.tensor(([0.0] * 4 + [1.0] * 4) * 2))  # sin 0, cos 0
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_pos_embed_2d(18, 2, 2)


def test_label_embedder_null_class_and_forced_drop():
    emb = LabelEmbedder(10, 4, dropout_prob=0.0)
    assert emb.embedding_table.num_embeddings == 11 and emb.null_id == 10
    labels = torch.tensor([1, 2, 3])
    assert emb.drop(labels, torch.tensor([True, False, True])).tolist() == [10, 2, 10]
    forced = emb(labels, force_drop_ids=torch.tensor([1, 0, 1]))
    torch.testing.assert_close(forced, emb.embedding_table.weight[[10, 2, 10]])


def test_label_dropout_only_while_training():
    torch.manual_seed(0)
    emb = LabelEmbedder(5, 4, dropout_prob=0.5)
    labels = torch.arange(200) % 5
    out = emb(labels)  # training mode
    dropped = (out == emb.embedding_table.weight[5]).all(dim=1)
    kept = (out == emb.embedding_table.weight[labels]).all(dim=1)
    assert torch.all(dropped | kept) and 60 < dropped.sum() < 140
    emb.eval()
    torch.testing.assert_close(emb(labels), emb.embedding_table.weight[labels])
    emb.train()
    emb.dropout_prob = 1.0
    assert (emb(labels) == emb.embedding_table.weight[5]).all()
    with pytest.raises(ValueError, match="dropout_prob"):
        LabelEmbedder(5, 4, dropout_prob=1.5)


def test_patch_embed_is_a_linear_map_per_patch():
    torch.manual_seed(0)
    embed = PatchEmbed(3, 8, patch=2)
    x = torch.randn(2, 3, 4, 6)
    tokens = embed(x)
    assert tokens.shape == (2, 6, 8)  # (4/2)·(6/2) tokens, row-major
    patch = x[:, :, 2:4, 4:6].reshape(2, -1)  # row 1, column 2 -> token 1·3 + 2
    expected = patch @ embed.proj.weight.reshape(8, -1).T + embed.proj.bias
    torch.testing.assert_close(tokens[:, 5], expected)


def test_rotary_scores_depend_on_the_offset_only_and_keep_norms():
    torch.manual_seed(0)
    positions = torch.tensor([[0, 0, 0], [1, 2, 3], [5, 1, 2], [6, 3, 5], [1, 3, 3]])
    cos, sin = rotary_tables(positions, 32)
    q, k = torch.randn(32), torch.randn(32)
    rq, rk = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)  # [5, 32] each
    assert torch.allclose(rq.norm(dim=1), q.norm().expand(5), atol=1e-5)  # a rotation
    assert float(rq[0] @ rk[1]) == pytest.approx(float(rq[2] @ rk[3]), abs=1e-5)  # offset (1, 2, 3) both times
    assert float(rq[0] @ rk[1]) != pytest.approx(float(rq[0] @ rk[4]), abs=1e-3)  # offset (1, 3, 3)
    assert torch.allclose(apply_rotary(q, *rotary_tables(torch.zeros(1, 3), 32))[0], q)  # position 0: unchanged
    with pytest.raises(ValueError, match="even head width"):
        rotary_tables(positions, 5)
