"""Config of the `dvae` family: DALL·E's discrete VAE (Ramesh et al. 2021, sec. 2.1; lucidrains DALLE-pytorch's
`DiscreteVAE` and `train_vae.py`), trained with the Gumbel-softmax relaxation and a KL to the uniform prior."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from genforge.tokenizers.config import PerceptualConfig, TokenizerConfig


class DVAEConfig(TokenizerConfig):
    """Architecture, the Gumbel temperature schedule and the KL weight schedule."""

    default_metrics: ClassVar[tuple[str, ...]] = ("psnr", "ssim", "codebook")
    roles: ClassVar[tuple[str, ...]] = ("tokenizer", "discrete")
    family: Literal["dvae"] = "dvae"
    # DALL·E trained with MSE-like (logit-Laplace) likelihoods and DALLE-pytorch with MSE or smooth L1: no l1 here
    reconstruction_loss: Literal["mse", "smooth_l1"] = "mse"
    perceptual: PerceptualConfig = PerceptualConfig(weight=0.0)  # DALL·E had none
    channels: Literal[3, 4] = Field(3, description="image channels: 3 (RGB) or 4 (RGBA, needs 4-channel data)")
    num_layers: int = Field(3, ge=1, le=5, description="stride-2 convolutions; downsampling 2**num_layers")
    num_resnet_blocks: int = Field(0, ge=0, le=8, description="resnet blocks after the encoder's convolutions "
                                                              "and before the decoder's")
    hidden_dim: int = Field(64, ge=4, le=1024)
    codebook_dim: int = Field(512, ge=1, le=4096)
    num_tokens: int = Field(512, ge=2, le=65536, description="codebook size K")
    straight_through: bool = Field(False, description="forward the hard one-hot of the Gumbel sample, "
                                                      "backpropagate through the soft one")
    temperature_start: float = Field(1.0, gt=0.0, description="Gumbel-softmax temperature at step 0")
    temperature_min: float = Field(0.5, gt=0.0, description="its floor (DALLE-pytorch 0.5; DALL·E 1/16)")
    anneal_rate: float = Field(1e-6, ge=0.0, description="τ(step) = max(temperature_min, temperature_start · "
                                                         "exp(−anneal_rate · step))")
    kl_weight: float = Field(0.0, ge=0.0, description="weight of KL(q(z|x) ‖ uniform) in nats per code position "
                                                      "(DALLE-pytorch's kl_div_loss_weight · h · w)")
    kl_warmup_steps: int = Field(0, ge=0, description="the KL weight rises linearly from 0 over these steps")

    @model_validator(mode="after")
    def _temperatures_ordered(self) -> "DVAEConfig":
        if self.temperature_min > self.temperature_start:
            raise ValueError(f"model.temperature_min={self.temperature_min} must be <= "
                             f"model.temperature_start={self.temperature_start}")
        return self

    def downsample(self) -> int:
        return 2 ** self.num_layers

    def temperature(self, step: int) -> float:
        """The Gumbel-softmax temperature τ at optimizer step `step`."""
        return max(self.temperature_min, self.temperature_start * math.exp(-self.anneal_rate * step))

    def kl_weight_at(self, step: int) -> float:
        """The KL weight at `step`: linear warm-up from 0 over kl_warmup_steps, then kl_weight."""
        if self.kl_warmup_steps == 0:
            return self.kl_weight
        return self.kl_weight * min(1.0, step / self.kl_warmup_steps)
