"""The per-tensor fingerprints the cross-rank consistency check gathers."""

import torch

from genforge.engine.consistency import fingerprint, first_difference


def test_fingerprints_see_every_bit_and_every_position():
    x = torch.randn(64, 32)
    assert torch.equal(fingerprint(x), fingerprint(x.clone()))
    nudged = x.clone()
    nudged[3, 5] = torch.nextafter(nudged[3, 5], torch.tensor(float("inf")))  # one ulp
    assert not torch.equal(fingerprint(x), fingerprint(nudged))
    swapped = x.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert not torch.equal(fingerprint(x), fingerprint(swapped))
    for t in (torch.tensor(True), torch.arange(5), torch.randn(3, dtype=torch.bfloat16), torch.randn(2).double()):
        assert fingerprint(t).shape == (2,)


def test_first_difference_names_the_tensor_and_the_rank():
    a = {"model.w": torch.ones(3), "model.b": torch.zeros(2), "ema.w": torch.ones(3)}
    b = {**a, "model.w": torch.tensor([1.0, 1.0, 2.0])}

    def gather_from(*ranks):
        return lambda local: [torch.stack([fingerprint(r[n]) for n in sorted(r)]) for r in ranks]

    assert first_difference(a, gather_from(a, a, a)) is None
    assert first_difference(a, gather_from(a, a, b)) == ("model.w", 2)
