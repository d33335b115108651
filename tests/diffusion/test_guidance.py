import torch

from genforge.diffusion import classifier_free_guidance


def test_guided_output_and_one_doubled_call():
    calls = []

    def model(x, t, y):
        calls.append(len(x))
        mean = x + y.float().view(-1, 1, 1, 1)  # cond: +label, uncond (y = 0): x
        var = 10 + y.float().view(-1, 1, 1, 1).expand_as(x)
        return torch.cat([mean, var], dim=1)

    x, t, y = torch.randn(3, 2, 4, 4), torch.zeros(3, dtype=torch.long), torch.tensor([1, 2, 3])
    guided = classifier_free_guidance(model, 4.0, {"y": torch.zeros(3, dtype=torch.long)}, out_channels=2)
    out = guided(x, t, y=y)
    assert calls == [6]
    torch.testing.assert_close(out[:, :2], x + 4.0 * y.float().view(-1, 1, 1, 1))
    torch.testing.assert_close(out[:, 2:], 10 + y.float().view(-1, 1, 1, 1).expand_as(x))
    assert classifier_free_guidance(model, 1.0, {"y": torch.zeros(3, dtype=torch.long)}, 2) is model


def test_shared_kwargs_are_repeated_and_nulls_broadcast():
    def model(x, t, emb, lowres, flag):
        assert flag == "keep" and torch.equal(lowres[:2], lowres[2:])
        return x + emb.sum(1).view(-1, 1, 1) + lowres

    x, t = torch.zeros(2, 1, 3), torch.zeros(2, dtype=torch.long)
    emb, lowres = torch.ones(2, 4), torch.randn(2, 1, 3)
    guided = classifier_free_guidance(model, 3.0, {"emb": torch.zeros(1, 4)}, out_channels=1)
    torch.testing.assert_close(guided(x, t, emb=emb, lowres=lowres, flag="keep"), lowres + 3.0 * 4)
