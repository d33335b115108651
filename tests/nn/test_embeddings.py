import math

import torch

from genforge.nn.embeddings import LabelEmbedder, sincos_pos_embed_2d, timestep_embedding


def test_timestep_embedding_values():
    emb = timestep_embedding(torch.tensor([0, 3]), 8)
    assert emb.shape == (2, 8)
    assert torch.equal(emb[0], torch.tensor([1.0] * 4 + [0.0] * 4))
    assert math.isclose(emb[1, 0].item(), math.cos(3.0), rel_tol=1e-6)  # first frequency is 1
    assert timestep_embedding(torch.tensor([1.5]), 7).shape == (1, 7)


def test_sincos_2d_structure():
    pe = sincos_pos_embed_2d(16, 3, 5)
    assert pe.shape == (15, 16)
    # first half encodes the column, second half the row: same column -> same first half
    assert torch.equal(pe[0, :8], pe[5, :8]) and not torch.equal(pe[0, 8:], pe[5, 8:])
    assert torch.equal(pe[0], torch.tensor([0.0] * 4 + [1.0] * 4 + [0.0] * 4 + [1.0] * 4))


def test_label_null_class():
    emb = LabelEmbedder(10, 4)
    assert emb.table.num_embeddings == 11
    dropped = emb.drop(torch.tensor([1, 2, 3]), torch.tensor([True, False, True]))
    assert dropped.tolist() == [10, 2, 10]
