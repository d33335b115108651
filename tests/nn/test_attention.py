import pytest
import torch
import torch.nn.functional as F

from genforge.nn.attention import Attention, Mlp, PreNormBlock


def naive_attention(attn: Attention, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ / √d + mask) v per head, written out with plain matmuls."""
    b, n, dim = x.shape
    h, d = attn.num_heads, dim // attn.num_heads
    q, k, v = attn.qkv(x).split(dim, dim=-1)  # [B, N, D] each
    q, k, v = (z.reshape(b, n, h, d).transpose(1, 2) for z in (q, k, v))  # [B, h, N, d]
    logits = q @ k.transpose(-1, -2) / d**0.5  # [B, h, N, N]
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    out = torch.softmax(logits, dim=-1) @ v  # [B, h, N, d]
    return attn.proj(out.transpose(1, 2).reshape(b, n, dim))


def test_matches_naive_softmax_attention():
    torch.manual_seed(0)
    attn = Attention(24, num_heads=3)
    x = torch.randn(2, 7, 24)
    torch.testing.assert_close(attn(x), naive_attention(attn, x), rtol=1e-5, atol=1e-6)


def test_bool_mask_matches_naive_and_hides_masked_keys():
    torch.manual_seed(0)
    attn = Attention(8, num_heads=2)
    x = torch.randn(2, 5, 8)
    keep = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    mask = keep[:, None, None, :]  # key padding, broadcast to [B, h, N, N]
    torch.testing.assert_close(attn(x, mask), naive_attention(attn, x, mask), rtol=1e-5, atol=1e-6)
    changed = x.clone()
    changed[0, 3:] += 5.0  # padded keys/values must not reach the kept queries
    torch.testing.assert_close(attn(changed, mask)[0, :3], attn(x, mask)[0, :3])


def test_causal_mask_via_sdpa_semantics():
    torch.manual_seed(0)
    attn = Attention(8, num_heads=2)
    x = torch.randn(1, 4, 8)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    out = attn(x, causal)
    torch.testing.assert_close(out[:, :2], attn(x[:, :2], causal[:2, :2]), rtol=1e-5, atol=1e-6)


def test_causal_attention_equals_the_tril_mask_without_building_one(monkeypatch):
    """causal=True hands SDPA is_causal and no mask; it computes what the bool tril mask does (the same weights),
    and a later token never changes an earlier token's output."""
    torch.manual_seed(0)
    causal, masked = PreNormBlock(8, 2, causal=True), PreNormBlock(8, 2)
    masked.load_state_dict(causal.state_dict())
    x = torch.randn(3, 6, 8)
    tril = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(causal(x), masked(x, mask=tril), rtol=0, atol=1e-6)
    torch.testing.assert_close(causal.attn(x), naive_attention(causal.attn, x, tril), rtol=1e-5, atol=1e-6)
    changed = x.clone()
    changed[:, 4:] = torch.randn(3, 2, 8)
    assert torch.equal(causal(changed)[:, :4], causal(x)[:, :4])
    assert not torch.allclose(causal(changed)[:, 4:], causal(x)[:, 4:])

    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(kw) or sdpa(*a, **kw))
    causal(x)
    assert calls == [{"attn_mask": None, "is_causal": True}]
    with pytest.raises(ValueError, match="takes no mask"):
        causal.attn(x, tril)


def test_options_and_width_check():
    attn = Attention(8, num_heads=4, qkv_bias=False)
    assert attn.qkv.bias is None and attn.proj.bias is not None and attn.head_dim == 2
    with pytest.raises(ValueError, match="num_heads"):
        Attention(10, num_heads=4)


def test_mlp_is_linear_gelu_tanh_linear():
    torch.manual_seed(0)
    mlp = Mlp(6, 12, out_dim=3)
    x = torch.randn(2, 5, 6)
    expected = mlp.fc2(F.gelu(mlp.fc1(x), approximate="tanh"))
    assert mlp(x).shape == (2, 5, 3)
    torch.testing.assert_close(mlp(x), expected)
    assert Mlp(6, 12)(x).shape == x.shape
