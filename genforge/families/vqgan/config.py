"""Config of the `vqgan` family: the VQGAN of taming-transformers (Esser et al. 2021), trained by default with
taming's objective (LPIPS-style perceptual loss, adversarial weight 0.1 · ‖∇(rec + perceptual)‖/‖∇GAN‖) and
MUSE's gradient penalty on the discriminator; MUSE's own objective (lucidrains' muse-maskgit-pytorch `VQGanVAE`:
feature-MSE perceptual loss, adversarial weight 1.0 · ‖∇perceptual‖/‖∇GAN‖) is `perceptual.distance:
feature_mse` with `gan.adversarial_weight: adaptive_perceptual` (preset vqgan-muse). The quantizer is a choice:
vector quantization (van den Oord et al. 2017) with an EMA or a learnt codebook, optionally l2-normalised codes
(ViT-VQGAN, Yu et al. 2022); lookup-free quantization (LFQ, MAGVIT-v2, Yu et al. 2023, MUSE's default); finite
scalar quantization (FSQ, Mentzer et al. 2023)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from genforge.core.config import section_defaults
from genforge.nn.quantizers import QuantizerConfig
from genforge.tokenizers.config import ConvStackConfig, GANConfig


class VQGANConfig(ConvStackConfig):
    """Encoder/decoder (diffusers' resnet + attention blocks), the quantizer, and the shared tokenizer losses
    (perceptual, patch GAN: on by default, as in VQGAN)."""

    family: Literal["vqgan"] = "vqgan"
    block_out_channels: list[int] = Field([64, 128, 128], min_length=1, max_length=6,
                                          description="channels per level; downsampling 2**(levels - 1)")
    z_channels: int = Field(64, ge=1, le=1024, description="channels of the encoder's output and the decoder's "
                                                            "input (the quantizer works on these)")
    quantizer: QuantizerConfig = QuantizerConfig()
    # the patch GAN with muse-maskgit-pytorch VQGanVAE's gradient penalty by default, WGAN-GP's
    # λ · (‖∇D(x)‖ − 1)² on the real images, λ 10, every 4 discriminator steps; its adversarial weight stays taming's
    # unless `adversarial_weight: adaptive_perceptual` (MUSE's, with weight 1.0)
    gan: Annotated[GANConfig | None, section_defaults(penalty="wgan_gp")] = GANConfig(penalty="wgan_gp")
