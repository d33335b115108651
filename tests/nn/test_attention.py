import torch

from genforge.nn.attention import Attention


def test_matches_naive_softmax_attention():
    torch.manual_seed(0)
    attn = Attention(16, num_heads=4)
    x = torch.randn(2, 5, 16)
    q, k, v = attn.qkv(x).view(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
    weights = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)  # sqrt(head dim 4) = 2
    naive = attn.proj((weights @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(attn(x), naive, rtol=1e-5, atol=1e-6)


def test_mask_blocks_positions():
    attn = Attention(8, num_heads=2)
    x = torch.randn(1, 4, 8)
    mask = torch.tensor([True, True, False, False]).expand(4, 4)
    changed = x.clone()
    changed[:, 2:] += 5.0  # masked-out keys/values must not matter
    torch.testing.assert_close(attn(x, mask)[:, :2], attn(changed, mask)[:, :2])
