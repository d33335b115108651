"""dvae as a Task: DALL·E's discrete VAE objective (Ramesh et al. 2021, sec. 2.1; DALLE-pytorch `DiscreteVAE`).

    y = softmax((logits + g) / τ(step)),  g = −log(−log u),  u ~ U(0, 1) from batch["rng"]    (Gumbel-softmax)
    straight-through: forward one_hot(argmax y), gradient of y
    L = rec(decode_soft(y), x) + w_kl(step) · KL(q(z|x) ‖ uniform),  q = softmax(logits)
    KL = Σ_k q_k log(q_k · K), averaged over code positions and the batch (nats per position, in [0, log K])
    τ(step): temperature_schedule, by default DALL·E's cosine from temperature_start to temperature_min over
             temperature_anneal_steps (app. A.2: 1 -> 1/16 over 150 000 updates); DVAEConfig.temperature
    w_kl(step) = kl_weight · min(1, step / kl_warmup_steps)
Both schedules are functions of the optimizer step; the step the next training call will be at, with τ and
w_kl there, is the family's checkpoint state (`state_for_checkpoint`), checked on resume.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from genforge.core.status import console
from genforge.core.random import BatchRandom
from genforge.core.family import BuildContext
from genforge.core.task import Batch, interleave_rows
from genforge.eval.tokenizer_metrics import batch_codebook_usage
from genforge.families.dvae.config import DVAEConfig
from genforge.families.dvae.model import DiscreteVAE
from genforge.nn.sampling import gumbel
from genforge.tokenizers.task import TokenizerTask


def gumbel_softmax(logits: Tensor, uniform: Tensor, temperature: float, hard: bool) -> Tensor:
    """Relaxed one-hot sample over dim 1 of `logits` [B, K, ...] from uniform noise of the same shape;
    `hard`: the exact one-hot of its argmax in the forward pass, the soft sample's gradient in the backward."""
    soft = F.softmax((logits + gumbel(uniform)) / temperature, dim=1)
    if not hard:
        return soft
    one_hot = torch.zeros_like(soft).scatter_(1, soft.argmax(dim=1, keepdim=True), 1.0)
    return one_hot - soft.detach() + soft  # straight-through estimator


def kl_to_uniform(logits: Tensor) -> Tensor:
    """KL(softmax(logits) ‖ uniform over K = logits.shape[1]) per position [B, ...], in nats."""
    log_q = F.log_softmax(logits, dim=1)
    return (log_q.exp() * (log_q + math.log(logits.shape[1]))).sum(dim=1)


class DVAETask(TokenizerTask):
    """Trains a DiscreteVAE; its codec's token ids are what a token generator models."""


    cfg: DVAEConfig

    def __init__(self, cfg: DVAEConfig, ctx: BuildContext) -> None:
        super().__init__(cfg, ctx)
        if cfg.channels != ctx.info.channels:
            raise ValueError(f"model.channels={cfg.channels} but the images of data.source={ctx.data.source} have "
                             f"{ctx.info.channels} channels; genforge's image loaders read RGB, so model.channels=4 "
                             "(RGBA) needs a 4-channel data source")
        self.autoencoder = DiscreteVAE(cfg, ctx.info.channels)
        self.next_step = 0  # the optimizer step the next training call will be at

    # -------------------------------------------------------------------------------- schedules
    def temperature(self, step: int | None = None) -> float:
        return self.cfg.temperature(self.next_step if step is None else step)

    def state_for_checkpoint(self) -> dict[str, Any]:
        step = self.next_step
        return {"step": step, "temperature": self.cfg.temperature(step), "kl_weight": self.cfg.kl_weight_at(step)}

    def load_state_from_checkpoint(self, state: dict[str, Any]) -> None:
        step = int(state.get("step", 0))
        self.next_step = step
        for name, now in (("temperature", self.cfg.temperature(step)), ("kl_weight", self.cfg.kl_weight_at(step))):
            saved = state.get(name)
            if saved is not None and not math.isclose(saved, now, rel_tol=1e-9, abs_tol=1e-12):
                console().warning(f"dvae {name} at step {step} was {saved:.6g} in the checkpoint; the schedule of "
                                  f"this config gives {now:.6g} (model.temperature_*/anneal_rate/kl_* changed): "
                                  "continuing with the new schedule")

    # ------------------------------------------------------------------------------------ training
    def autoencode(self, image: Tensor, rng: BatchRandom, step: int,
                   keep: Tensor | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        codec = self.autoencoder
        logits = codec.logits(image).float()  # [B, K, h, w]
        tau = self.cfg.temperature(step)
        uniform = rng.rand_rows(*logits.shape[1:]).to(logits)  # [B, K, h, w]: only this micro-batch's rows
        weights = gumbel_softmax(logits, uniform, tau, hard=self.cfg.straight_through)
        recon = codec.decode_soft(weights)  # [B, C, H, W]
        kl = kl_to_uniform(logits).mean()
        kl_weight = self.cfg.kl_weight_at(step)
        if self.training and torch.is_grad_enabled():
            self.next_step = step + 1
        logs = {"temperature": torch.tensor(tau, device=logits.device), "kl": kl.detach(),
                "kl_weight": torch.tensor(kl_weight, device=logits.device),
                **batch_codebook_usage(logits.detach().argmax(dim=1), codec.codebook_size)}
        return recon, kl_weight * kl, logs

    def last_layer(self) -> Tensor:
        return self.autoencoder.decoder[-1].weight

    # ------------------------------------------------------------------------------------ previews
    @torch.no_grad()
    def soft_reconstruct(self, image: Tensor) -> Tensor:
        """Reconstruction through the code probabilities softmax(logits / τ) at the current temperature
        (no Gumbel noise): what the decoder sees in training, without the sampling."""
        logits = self.autoencoder.logits(image).float()
        return self.autoencoder.decode_soft(F.softmax(logits / self.temperature(), dim=1))

    @torch.no_grad()
    def preview(self, cond: Batch, images: Tensor) -> tuple[Tensor, int]:
        """Rows of 8 originals, each followed by their hard reconstructions (argmax codes, = `images`) and their
        soft reconstructions (softmax(logits / τ) mixed codebook vectors); in training previews then the hard
        reconstructions of the online weights (cond["online"])."""
        device = next(self.autoencoder.parameters()).device
        soft = self.soft_reconstruct(cond["image"].to(device)).float().clamp(-1, 1)
        return interleave_rows([cond["image"], images, soft, *self.online_rows(cond)])
