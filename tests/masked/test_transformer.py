"""The shared mask transformer's conditioning: the pooled condition and its adaLN modulation (model.adaln)."""

import torch

from genforge.masked.transformer import MaskTransformer, pooled_context


def test_pooled_context_is_the_mean_of_the_kept_condition_or_the_null_token():
    context = torch.randn(3, 4, 8)  # the null token, then three condition tokens
    mask = torch.tensor([[True, True, True, False], [True, False, False, False], [True, True, False, False]])
    pooled = pooled_context(context, mask)
    assert torch.allclose(pooled[0], context[0, 1:3].mean(0))  # padding left out
    assert torch.equal(pooled[1], context[1, 0])  # dropped condition: the null token
    assert torch.allclose(pooled[2], context[2, 1])


def test_adaln_starts_as_the_plain_model_and_then_reads_the_pooled_condition():
    torch.manual_seed(0)
    plain = MaskTransformer(codebook_size=16, seq_len=9, width=32, depth=2, num_heads=4, text_dim=12)
    modulated = MaskTransformer(codebook_size=16, seq_len=9, width=32, depth=2, num_heads=4, text_dim=12,
                                modulation=True)
    missing, unexpected = modulated.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(".modulation." in name for name in missing)
    ids = torch.randint(0, 17, (2, 9))
    text, text_mask = torch.randn(2, 5, 12), torch.ones(2, 5, dtype=torch.bool)
    keep = torch.zeros(2, dtype=torch.bool)
    context, context_mask = modulated.context(keep, text_embed=text, text_mask=text_mask)
    assert torch.allclose(modulated(ids, context, context_mask), plain(ids, context, context_mask), atol=1e-6)

    for block in modulated.blocks:  # as after training: the modulation is no longer zero
        torch.nn.init.normal_(block.modulation[-1].weight, std=0.5)
    other = context.clone()
    other[:, 1:] = other[:, 1:] + torch.randn(2, 1, 32)  # the condition moved, the same for every token
    base = modulated(ids, context, context_mask)
    assert not torch.allclose(modulated(ids, other, context_mask), base, atol=1e-3)
    dropped_context, dropped_mask = modulated.context(~keep, text_embed=text, text_mask=text_mask)
    again, _ = modulated.context(~keep, text_embed=torch.randn(2, 5, 12), text_mask=text_mask)
    assert torch.allclose(modulated(ids, dropped_context, dropped_mask), modulated(ids, again, dropped_mask))
