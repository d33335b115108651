import pytest
import torch

from genforge.families.dit.model import DIT_SIZES, DiT, dit_from_size


def tiny(**kw):
    args = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=4, num_classes=10)
    return DiT(**{**args, **kw})


@pytest.mark.parametrize("name,millions", [("S/2", 33.0), ("B/2", 130.3), ("L/2", 457.8), ("XL/2", 674.8)])
def test_paper_parameter_counts(name, millions):
    with torch.device("meta"):
        model = dit_from_size(name, input_size=32, in_channels=4, num_classes=1000)
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(millions, rel=0.01)


def test_zoo_has_12_sizes_and_rejects_unknown():
    assert len(DIT_SIZES) == 12 and DIT_SIZES["XL/2"] == dict(depth=28, hidden_size=1152, num_heads=16, patch_size=2)
    with pytest.raises(ValueError, match="allowed"):
        dit_from_size("M/3", input_size=32, in_channels=4)


@pytest.mark.parametrize("learn_sigma,channels", [(True, 4), (False, 4), (True, 3)])
def test_output_shapes(learn_sigma, channels):
    model = tiny(in_channels=channels, learn_sigma=learn_sigma)
    out = model(torch.randn(3, channels, 8, 8), torch.tensor([0, 10, 999]), torch.tensor([1, 2, 10]))
    assert out.shape == (3, channels * (2 if learn_sigma else 1), 8, 8)


def test_adaln_zero_initial_output_is_zero():
    model = tiny()
    out = model(torch.randn(2, 4, 8, 8), torch.tensor([5, 500]), torch.tensor([0, 3]))
    assert torch.equal(out, torch.zeros_like(out))


def test_position_embedding_is_fixed():
    model = tiny()
    assert "pos_embed" not in dict(model.named_parameters()) and "pos_embed" not in model.state_dict()
    assert model.pos_embed.shape == (1, 16, 32)


def test_every_parameter_learns():
    torch.manual_seed(0)
    model = tiny()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, t, y = torch.randn(4, 4, 8, 8), torch.randint(0, 1000, (4,)), torch.randint(0, 11, (4,))
    for _ in range(3):
        opt.zero_grad()
        (model(x, t, y) - x.repeat(1, 2, 1, 1)).pow(2).mean().backward()
        opt.step()
    silent = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not silent


def test_unconditional_and_input_size_check():
    model = tiny(num_classes=0)
    assert model.y_embedder is None
    assert model(torch.randn(1, 4, 8, 8), torch.tensor([3])).shape == (1, 8, 8, 8)
    with pytest.raises(ValueError, match="divisible"):
        tiny(input_size=9)


def test_unpatchify_inverts_patchify_layout():
    model = tiny(learn_sigma=False)
    x = torch.randn(2, 4, 8, 8)
    patches = x.view(2, 4, 4, 2, 4, 2).permute(0, 2, 4, 3, 5, 1).reshape(2, 16, 16)  # [B, N, p·p·C]
    assert torch.equal(model.unpatchify(patches), x)
