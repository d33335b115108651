"""Config of the `dvae` family: DALL·E's discrete VAE (Ramesh et al. 2021, sec. 2.1; lucidrains DALLE-pytorch's
`DiscreteVAE` and `train_vae.py`), trained with the Gumbel-softmax relaxation and a KL to the uniform prior."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from genforge.tokenizers.config import PerceptualConfig, TokenizerConfig


SEED_ANNEAL_EVERY = 100  # DALLE-pytorch's train_vae.py anneals τ after each 100th batch of an epoch (`i % 100 == 0`)


class DVAEConfig(TokenizerConfig):
    """Architecture, the Gumbel temperature schedule and the KL weight schedule."""

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
    temperature_schedule: Literal["cosine", "exponential", "legacy_exp", "compounding"] = Field(
        "cosine", description="Gumbel temperature τ(step): cosine or exponential from temperature_start to "
                              "temperature_min over temperature_anneal_steps, then constant (DALL·E: cosine, 1 -> "
                              "1/16 over 150 000 updates); legacy_exp: max(temperature_min, temperature_start · "
                              "exp(−anneal_rate · step)) (genforge's before this key; an old run's config.yaml means "
                              "it); compounding: DALLE-pytorch train_vae.py's, τ multiplied by exp(−anneal_rate · g) "
                              "after every 100th step g of each epoch (anneal_epoch_steps), floored at "
                              "temperature_min")
    temperature_start: float = Field(1.0, gt=0.0, description="Gumbel-softmax temperature at step 0")
    temperature_min: float = Field(1 / 16, gt=0.0, description="the final τ of cosine/exponential, the floor of "
                                                               "legacy_exp (DALL·E 1/16; DALLE-pytorch 0.5)")
    temperature_anneal_steps: int = Field(150_000, ge=1, description="cosine/exponential: optimizer steps from "
                                                                     "temperature_start to temperature_min (DALL·E "
                                                                     "150 000)")
    anneal_rate: float = Field(1e-6, ge=0.0, description="legacy_exp and compounding: the rate r of their "
                                                         "exponentials (DALLE-pytorch 1e-6); setting it needs "
                                                         "temperature_schedule set too")
    anneal_epoch_steps: int | None = Field(
        None, ge=1, description="compounding: the optimizer steps of one epoch of the seed's loop (DALLE-pytorch "
                                "train_vae.py counts its 100 steps by the batch index i within each epoch, `if i % "
                                "100 == 0`: B batches per epoch anneal after the global steps e·B + 100·j, 100·j < B; "
                                "one process: B = ⌈images / batch size⌉); unset: one endless epoch, after the global "
                                "steps 0, 100, 200, ... (the same whenever B is a multiple of 100)")
    kl_weight: float = Field(0.0, ge=0.0, description="weight of KL(q(z|x) ‖ uniform) in nats per code position "
                                                      "(DALLE-pytorch's kl_div_loss_weight · h · w)")
    kl_warmup_steps: int = Field(0, ge=0, description="the KL weight rises linearly from 0 over these steps")

    @model_validator(mode="after")
    def _temperatures_ordered(self) -> "DVAEConfig":
        if self.temperature_min > self.temperature_start:
            raise ValueError(f"model.temperature_min={self.temperature_min} must be <= "
                             f"model.temperature_start={self.temperature_start}")
        if "anneal_rate" in self.model_fields_set and "temperature_schedule" not in self.model_fields_set:
            raise ValueError("model.anneal_rate is the rate of two schedules; name one: "
                             "model.temperature_schedule=compounding (DALLE-pytorch train_vae.py's: exp(−rate · g) "
                             "after every 100th step g, compounding) or legacy_exp (genforge's closed form "
                             "exp(−rate · step), which leaves τ near 1 at the seed's rate)")
        rated = self.temperature_schedule in ("legacy_exp", "compounding")
        for name, applies, where in (("anneal_rate", rated, "legacy_exp and compounding"),
                                     ("temperature_anneal_steps", not rated, "cosine and exponential"),
                                     ("anneal_epoch_steps", self.temperature_schedule == "compounding",
                                      "compounding")):
            default = type(self).model_fields[name].default
            if not applies and getattr(self, name) != default:
                raise ValueError(f"model.{name}={getattr(self, name)} applies to model.temperature_schedule={where} "
                                 f"only, not {self.temperature_schedule} (leave it at its default {default})")
        return self

    def downsample(self) -> int:
        return 2 ** self.num_layers

    def temperature(self, step: int) -> float:
        """The Gumbel-softmax temperature τ at optimizer step `step`, with p = min(1, step / anneal_steps):
        cosine       τ = τ_min + (τ_start − τ_min) · ½(1 + cos(π·p))     (DALL·E, Ramesh et al. 2021, app. A.2)
        exponential  τ = τ_start · (τ_min / τ_start)^p                    (geometric: a constant ratio per step)
        legacy_exp   τ = max(τ_min, τ_start · exp(−anneal_rate · step))   (DALLE-pytorch's rate in closed form)
        compounding  τ = max(τ_min, τ_start · exp(−anneal_rate · Σ g))     (DALLE-pytorch train_vae.py: τ ← τ ·
                     exp(−r·g) after each annealing step g before `step`, `seed_anneal_sum`; the floor commutes
                     with the products since τ only falls)"""
        start, end = self.temperature_start, self.temperature_min
        if self.temperature_schedule == "legacy_exp":
            return max(end, start * math.exp(-self.anneal_rate * step))
        if self.temperature_schedule == "compounding":
            return max(end, start * math.exp(-self.anneal_rate * self.seed_anneal_sum(step)))
        progress = min(1.0, step / self.temperature_anneal_steps)
        if self.temperature_schedule == "cosine":
            return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return start * (end / start) ** progress

    def seed_anneal_sum(self, step: int) -> int:
        """Σ g over the global steps g < `step` after which DALLE-pytorch's train_vae.py anneals τ by exp(−r·g): those
        whose batch index i within its epoch has i % 100 == 0, i.e. g = e·B + 100·j with 100·j < B for epochs of
        B = anneal_epoch_steps batches. Closed form, with t = step − 1 = E·B + o the last step taken and J = ⌈B/100⌉
        anneals per epoch: Σ_(e<E) (J·e·B + 100·J(J − 1)/2) + Σ_(j ≤ ⌊o/100⌋) (E·B + 100·j). Unset B: one endless
        epoch, g = 0, 100, ..., 100·K with K = ⌊t/100⌋, Σ g = 100·K(K + 1)/2."""
        if step <= 0:
            return 0
        every, epoch = SEED_ANNEAL_EVERY, self.anneal_epoch_steps
        if epoch is None:
            k = (step - 1) // every
            return every * k * (k + 1) // 2
        epochs, offset = divmod(step - 1, epoch)
        per_epoch = -(-epoch // every)  # i = 0, 100, ... < B
        done = per_epoch * epoch * epochs * (epochs - 1) // 2 + epochs * every * per_epoch * (per_epoch - 1) // 2
        m = offset // every  # this epoch's anneals so far: i = 0, 100, ..., 100·m
        return done + (m + 1) * epochs * epoch + every * m * (m + 1) // 2

    def kl_weight_at(self, step: int) -> float:
        """The KL weight at `step`: linear warm-up from 0 over kl_warmup_steps, then kl_weight."""
        if self.kl_warmup_steps == 0:
            return self.kl_weight
        return self.kl_weight * min(1.0, step / self.kl_warmup_steps)
