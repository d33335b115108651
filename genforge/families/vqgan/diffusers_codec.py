"""A diffusers `VQModel` folder (a VQGAN saved with save_pretrained, aMUSEd's tokenizer, a `genforge export` of a
vqgan run) as a frozen TokenCodec, so MaskGIT trains on its token ids without a genforge tokenizer run.

image [B, 3, H, W] --encoder, quant_conv--> z [B, D, h, w] --nearest code--> ids [B, h, w]
ids --codebook--> z_q [B, D, h, w] --post_quant_conv, decoder--> image
"""

from __future__ import annotations

from pathlib import Path

from diffusers import VQModel
from torch import Tensor, nn


class VQModelCodec(nn.Module):
    """TokenCodec over a diffusers VQModel: the ids are `quantize`'s nearest-code indices of `encode(x).latents`,
    decoding looks them up in the codebook and runs the decoder on them unquantized again."""

    def __init__(self, vq: VQModel) -> None:
        super().__init__()
        self.vq = vq
        self.codebook_size = int(vq.config.num_vq_embeddings)
        self.code_dim = int(vq.config.vq_embed_dim or vq.config.latent_channels)
        self.downsample = 2 ** (len(vq.config.block_out_channels) - 1)

    def encode(self, image: Tensor) -> Tensor:
        """image [B, C, H, W] in [-1, 1] -> ids long [B, H/f, W/f]."""
        z = self.vq.encode(image).latents  # [B, D, h, w]
        _, _, (_, _, ids) = self.vq.quantize(z)
        return ids.reshape(z.shape[0], z.shape[2], z.shape[3])

    def decode(self, ids: Tensor) -> Tensor:
        """ids long [B, h, w] -> image [B, C, h·f, w·f]."""
        shape = (*ids.shape, self.code_dim)  # [B, h, w, D]
        if self.vq.config.lookup_from_codebook:  # decode() looks the ids up itself
            return self.vq.decode(ids.flatten(), force_not_quantize=True, shape=shape).sample
        z_q = self.vq.quantize.get_codebook_entry(ids.flatten(), shape)  # [B, D, h, w]
        return self.vq.decode(z_q, force_not_quantize=True).sample


def codec_from_diffusers(folder: Path) -> VQModelCodec:
    """The frozen codec of a diffusers VQModel folder (safetensors only, no download)."""
    try:
        vq = VQModel.from_pretrained(folder, local_files_only=True, use_safetensors=True)
    except OSError as err:  # no diffusion_pytorch_model.safetensors (a .bin is never unpickled)
        raise FileNotFoundError(f"{folder}: {err}") from None
    return VQModelCodec(vq.eval())
