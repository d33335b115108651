"""VQAutoencoder: the VQGAN of taming-transformers / MUSE as a `TokenCodec` (genforge.tokenizers.standins).

image [B, C, H, W] --encoder--> [B, z, h, w] --quant_conv--> z --quantizer--> zq, ids [B, h, w]
      --post_quant_conv--> --decoder--> image [B, C, H, W]          with h = H / f, f = 2**(levels - 1)

The encoder and decoder are diffusers' VAE stacks (resnet blocks per level, a middle block with self-attention);
the quantizers are vector-quantize-pytorch's `VectorQuantize`, `LFQ` and `FSQ`.

The quantizer and its deferred EMA codebook update are the shared `genforge.nn.quantizers.Quantizing`.
"""

from __future__ import annotations

from diffusers.models.autoencoders.vae import Decoder, Encoder
from torch import Tensor, nn

from genforge.families.vqgan.config import VQGANConfig
from genforge.nn.quantizers import Quantizing


class VQAutoencoder(Quantizing):
    """TokenCodec: encode = ids of the quantized encoder output, decode = decoder(codes of the ids)."""

    def __init__(self, cfg: VQGANConfig, channels: int) -> None:
        super().__init__()
        levels, z = len(cfg.block_out_channels), cfg.z_channels
        self.downsample = 2 ** (levels - 1)
        arch = cfg.stack_kwargs()
        self.encoder = Encoder(in_channels=channels, out_channels=z, down_block_types=("DownEncoderBlock2D",) * levels,
                               double_z=False, **arch)
        self.quant_conv = nn.Conv2d(z, z, 1)
        self.init_quantizer(cfg.quantizer, z)  # .quantizer, and .pending for an EMA codebook
        self.post_quant_conv = nn.Conv2d(z, z, 1)
        self.decoder = Decoder(in_channels=z, out_channels=channels, up_block_types=("UpDecoderBlock2D",) * levels,
                               **arch)

    # --------------------------------------------------------------------------------------- pieces
    def encode_latent(self, image: Tensor) -> Tensor:
        """image [B, C, H, W] -> z [B, z, h, w] (before quantization)."""
        return self.quant_conv(self.encoder(image))

    def decode_latent(self, zq: Tensor) -> Tensor:
        """zq [B, z, h, w] -> image [B, C, H, W]."""
        return self.decoder(self.post_quant_conv(zq))

    # ----------------------------------------------------------------------------------- TokenCodec
    def encode(self, image: Tensor) -> Tensor:
        """image [B, C, H, W] in [-1, 1] -> token ids long [B, H/f, W/f] in [0, codebook_size)."""
        return self.quantize(self.encode_latent(image)).ids

    def decode(self, ids: Tensor) -> Tensor:
        """token ids long [B, h, w] -> image [B, C, h·f, w·f]."""
        return self.decode_latent(self.codes(ids))
