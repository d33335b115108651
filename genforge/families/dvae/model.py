"""DiscreteVAE: DALL·E's discrete VAE (Ramesh et al. 2021) as a `TokenCodec`, in DALLE-pytorch's small form.

image [B, C, H, W] --encoder--> logits [B, K, h, w] --argmax--> ids [B, h, w] --codebook--> [B, D, h, w]
                                                                                  --decoder--> image [B, C, H, W]
with h = H / 2**num_layers. In training the task replaces the argmax by a Gumbel-softmax sample (soft, or hard
with a straight-through gradient) and decodes the probability-weighted mix of codebook vectors (`decode_soft`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from genforge.families.dvae.config import DVAEConfig


class ResBlock(nn.Module):
    """x + conv1x1(relu(conv3x3(relu(conv3x3(x))))) at constant width (DALLE-pytorch's ResBlock)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(dim, dim, 3, padding=1), nn.ReLU(),
            nn.Conv2d(dim, dim, 3, padding=1), nn.ReLU(),
            nn.Conv2d(dim, dim, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.net(x)


class DiscreteVAE(nn.Module):
    """TokenCodec: encode = argmax of the encoder's logits, decode = decoder(codebook[ids])."""

    def __init__(self, cfg: DVAEConfig, channels: int) -> None:
        super().__init__()
        hidden, layers = cfg.hidden_dim, cfg.num_layers
        self.codebook_size = cfg.num_tokens
        self.downsample = 2 ** layers
        self.channels = channels

        # encoder: [B, C, H, W] -> num_layers × (4x4 conv, stride 2, ReLU) -> [B, hidden, h, w]
        #          -> resblocks -> 1x1 conv -> logits [B, K, h, w]
        down: list[nn.Module] = []
        for i in range(layers):
            down += [nn.Conv2d(channels if i == 0 else hidden, hidden, 4, stride=2, padding=1), nn.ReLU()]
        self.encoder = nn.Sequential(
            *down,
            *[ResBlock(hidden) for _ in range(cfg.num_resnet_blocks)],
            nn.Conv2d(hidden, cfg.num_tokens, 1),
        )

        # codebook: K vectors of codebook_dim
        self.codebook = nn.Embedding(cfg.num_tokens, cfg.codebook_dim)

        # decoder: [B, D, h, w] -> 1x1 conv -> [B, hidden, h, w] -> resblocks
        #          -> num_layers × (4x4 transposed conv, stride 2, ReLU) -> [B, hidden, H, W] -> 1x1 conv -> [B, C, H, W]
        up: list[nn.Module] = []
        for _ in range(layers):
            up += [nn.ConvTranspose2d(hidden, hidden, 4, stride=2, padding=1), nn.ReLU()]
        self.decoder = nn.Sequential(
            nn.Conv2d(cfg.codebook_dim, hidden, 1),
            *[ResBlock(hidden) for _ in range(cfg.num_resnet_blocks)],
            *up,
            nn.Conv2d(hidden, channels, 1),
        )

    def logits(self, image: Tensor) -> Tensor:
        """image [B, C, H, W] in [-1, 1] -> unnormalised log-probabilities of the codes [B, K, h, w]."""
        return self.encoder(image)

    def encode(self, image: Tensor) -> Tensor:
        """image [B, C, H, W] in [-1, 1] -> token ids long [B, h, w] in [0, K): the most likely code."""
        return self.logits(image).argmax(dim=1)

    def decode_soft(self, weights: Tensor) -> Tensor:
        """weights over the codes [B, K, h, w] (one-hot or probabilities) -> image [B, C, H, W]."""
        vectors = torch.einsum("bkhw,kd->bdhw", weights.to(self.codebook.weight.dtype), self.codebook.weight)
        return self.decoder(vectors)

    def decode(self, ids: Tensor) -> Tensor:
        """token ids long [B, h, w] -> image [B, C, h·f, w·f] (the same as decode_soft of their one-hots)."""
        vectors = self.codebook(ids).permute(0, 3, 1, 2)  # [B, D, h, w]
        return self.decoder(vectors)
