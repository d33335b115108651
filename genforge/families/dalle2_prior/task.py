"""dalle2_prior as a Task: DALL·E 2's diffusion prior (Ramesh et al. 2022, §2.2), as DALLE2-pytorch's `DiffusionPrior`
trains it.

Training: the CLIP image embedding of each training image (embedded each step, or read from a `genforge encode` cache
of the same clip run), L2-normalised and scaled by √D (so its entries have unit
variance; DALLE2-pytorch's `image_embed_scale`), is the x₀ of a Gaussian diffusion (cosine schedule); the network
predicts x₀ itself ("we found it better to train our prior to predict the unnoised CLIP image embedding directly",
§2.2) from x_t, t and the caption's CLIP text embedding and encodings (the text tower run each step, or its states
read from the cache), which are replaced by learned null conditions in `cond_drop_prob` of the rows
(classifier-free guidance). Sampling draws `candidates` embeddings per caption and keeps the one with the highest
dot product with the caption's text embedding (§2.2).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genforge.core.codec import TextTowerEmbedder
from genforge.core.config import SampleOptions
from genforge.core.errors import ConfigError
from genforge.core.family import BuildContext
from genforge.core.task import Batch, Task, heldout_captions, interleave_rows
from genforge.diffusion.build import build_objective, sample_diffusion, with_diffusion_defaults
from genforge.families.dalle2_prior.config import Dalle2PriorConfig, Dalle2PriorSampleOptions
from genforge.families.dalle2_prior.model import PriorNetwork
from genforge.nn.frozen import Frozen, held_on
from genforge.text.clip_embedder import PretrainedClipEmbedder
from genforge.text.encoders import use_cached_text_embeds

RETRIEVAL_BANK = 256  # held-out images whose nearest one to each predicted embedding the previews show


def rerank(candidates: Tensor, text_embed: Tensor) -> Tensor:
    """The candidate [n, k, D] (unit-norm) with the highest similarity to its caption's text embedding [n, D] (unit
    norm), for each caption: [n, D] (§2.2: "we generate two samples of z_i and select the one with a higher dot
    product with z_t")."""
    similarity = torch.einsum("nkd,nd->nk", candidates, text_embed.to(candidates))  # [n, k]
    best = similarity.argmax(dim=1)  # [n]
    return candidates[torch.arange(len(candidates), device=candidates.device), best]


class Dalle2PriorTask(Task):
    """Trains `PriorNetwork` on (caption, image) pairs embedded by a frozen CLIP; samples unit-norm image embeddings
    [n, D] for captions (`image_embeds_for`, a genforge.core.codec.TextToImageEmbedding)."""


    def __init__(self, cfg: Dalle2PriorConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.cfg = cfg
        self.heldout = ctx.heldout  # held-out captions (and images: the true embeddings, the retrieval bank)
        if cfg.embedder.source == "clip_run":
            self.embedder = ctx.codecs["model.embedder.path"][0]  # frozen; its weights saved with the prior's
        else:  # large and frozen: outside the module tree and checkpoints
            self.embedder = Frozen(PretrainedClipEmbedder(cfg.embedder.path))
        if not getattr(self.embedder, "has_text", False):
            raise ValueError(f"model.embedder.path={cfg.embedder.path}: the prior needs a CLIP with a text tower")
        self.embed_dim = int(self.embedder.embed_dim)
        self.scale = math.sqrt(self.embed_dim)  # x₀ = unit-norm embedding · √D
        text_dim = int(self.embedder.text_width) if cfg.text_encodings else 0
        self.model = PriorNetwork(self.embed_dim, cfg.width, cfg.depth, cfg.num_heads, text_dim, cfg.max_text_tokens)
        self.objective = build_objective(cfg.diffusion)
        self.use_cached_text = self._uses_cached_text(ctx)  # the text tower's states from the batches
        self._bank: tuple[Tensor, Tensor] | None = None  # (images, embeddings) of held-out images, built on use

    def _uses_cached_text(self, ctx: BuildContext) -> bool:
        """Whether the batches' `text_embed` / `text_mask` (a cache written by `genforge encode CLIP_RUN`: its text
        tower's states per caption) replace running the tower: only on a cache being trained on (a finished run is
        sampled from prompts and needs none), whose states the tower wrote (ConfigError otherwise)."""
        info = ctx.info
        if info.encoder_hash is None or info.text_encoder is None:
            return False
        if not isinstance(self.embedder, TextTowerEmbedder):  # e.g. a pretrained CLIP: the end-of-text token's
            raise ConfigError(f"the cache {ctx.data.path} holds text encodings, but the text embedding of "
                              f"model.embedder.path={self.cfg.embedder.path} is not pooled from them as stored; "
                              "train on the images")
        return use_cached_text_embeds(info.text_encoder, self.embedder.text_tower(), ctx.data.path, frozen=True,
                                      remedy=f"re-encode it without --text-encoder (genforge encode "
                                             f"{self.cfg.embedder.path} --out NEW_DIR stores the clip run's own text "
                                             "tower's), or train on the images")

    def ema_module(self) -> nn.Module:
        return self.model

    def parameters_for(self, phase: str) -> list[nn.Parameter]:
        return list(self.model.parameters())

    def train(self, mode: bool = True) -> "Dalle2PriorTask":
        """Train mode for the prior network; the CLIP stays frozen in eval mode."""
        super().train(mode)
        self.embedder.eval()
        return self

    # -------------------------------------------------------------------------------------------- conditions
    @torch.no_grad()
    def text_conditions(self, texts: list[str], device: torch.device) -> dict[str, Tensor]:
        """The network's caption inputs: the unit-norm CLIP text embedding [B, D] and, with text encodings, the text
        tower's per-token states [B, L, W_t] and mask [B, L]."""
        clip = held_on(self.embedder, device)
        if isinstance(clip, TextTowerEmbedder):  # the tower runs once; its states make both
            states, mask = clip.encode_texts(list(texts))
            return self.encoding_conditions(states.to(device), mask.to(device))
        kwargs = {"text_embed": F.normalize(clip.embed_texts(list(texts)).float(), dim=-1).to(device)}
        if self.cfg.text_encodings:
            tokens, mask = clip.encode_texts(list(texts))
            kwargs.update(text_tokens=tokens.float().to(device), text_mask=mask.bool().to(device))
        return kwargs

    @torch.no_grad()
    def encoding_conditions(self, states: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """`text_conditions` from the text tower's states [B, L, W_t] and mask [B, L] (live, or stored in a cache as
        float16): the text embedding pooled from them as the CLIP pools it (`embed_encodings`)."""
        kwargs = {"text_embed": held_on(self.embedder, states.device).embed_encodings(states, mask).float()}
        if self.cfg.text_encodings:
            kwargs.update(text_tokens=states.float(), text_mask=mask.bool())
        return kwargs

    def text_embeds(self, texts: list[str]) -> Tensor:
        """Its CLIP's unit-norm text embeddings [B, D] of captions (what a decoder checks it shares)."""
        return self.text_conditions(texts, next(self.model.parameters()).device)["text_embed"]

    @torch.no_grad()
    def image_embeds(self, images: Tensor) -> Tensor:
        """The frozen CLIP's unit-norm image embeddings [B, D] of images [B, C, H, W] in [-1, 1]."""
        return F.normalize(held_on(self.embedder, images.device).embed_images(images).float(), dim=-1)

    # -------------------------------------------------------------------------------------------------- loss
    def loss(self, batch: Batch, phase: str, step: int) -> tuple[Tensor, dict[str, Tensor]]:
        if "text" not in batch:
            raise ValueError("the prior trains on captioned images: the batch has no captions (an image folder "
                             "needs a <stem>.txt per image; shards a .txt)")
        rng = batch["rng"]
        if "image_embed" in batch:  # a cache of the clip run's image embeddings (genforge encode)
            x0 = F.normalize(batch["image_embed"].float(), dim=-1) * self.scale  # [B, D], entries of unit variance
        else:
            x0 = self.image_embeds(batch["image"]) * self.scale
        device = x0.device
        if self.use_cached_text and "text_embed" in batch:  # the tower's states [B, L, W_t] (the Batch field)
            kwargs = self.encoding_conditions(batch["text_embed"].to(device), batch["text_mask"].to(device))
        else:
            kwargs = self.text_conditions(batch["text"], device)
        kwargs["keep"] = rng.rand() >= self.cfg.cond_drop_prob  # [B] bool
        time, noise = self.objective.draw(rng, x0)
        terms = self.objective.training_losses(self.model, x0, time, noise, model_kwargs=kwargs)
        return terms["loss"].mean(), {k: terms[k].mean().detach() for k in ("mse",) if k in terms}

    # ---------------------------------------------------------------------------------------------- sampling
    def resolve(self, options: SampleOptions | None = None) -> Dalle2PriorSampleOptions:
        """`options` (a decoder hands its --prior-* options on as this family's options) with the unset sampler,
        steps, guidance scale and DDIM η from model.diffusion and candidates from model.candidates."""
        options = with_diffusion_defaults(super().resolve(options), self.cfg.diffusion)
        return options.filled(ddim_eta=self.cfg.diffusion.ddim_eta, candidates=self.cfg.candidates,
                              keep_candidates=False)

    def sampler_settings(self, options: Dalle2PriorSampleOptions) -> dict[str, Any]:
        return {"sampler": options.sampler, "steps": options.steps, "cfg_scale": options.cfg_scale,
                "ddim_eta": options.ddim_eta, "candidates": options.candidates}

    @torch.no_grad()
    def image_embed_candidates(self, texts: list[str], generator: torch.Generator,
                               options: Dalle2PriorSampleOptions, progress: bool = False) -> tuple[Tensor, Tensor]:
        """`options.candidates` = k unit-norm image embeddings per caption, [n, k, D] in the order drawn (caption
        i: rows i·k.. of the noise), guided against the null text conditions by cfg_scale, with DDIM's η =
        ddim_eta; and the captions' unit-norm text embeddings [n, D] (what `rerank` compares them with)."""
        device, n, k = next(self.model.parameters()).device, len(texts), options.candidates
        cond = self.text_conditions(texts, device)
        kwargs = {name: value.repeat_interleave(k, dim=0) for name, value in cond.items()}  # caption i: rows i·k..
        kwargs["keep"] = torch.ones(n * k, dtype=torch.bool, device=device)
        null = {"keep": torch.zeros(1, dtype=torch.bool, device=device)}
        x0 = sample_diffusion(self.cfg.diffusion.model_copy(update={"ddim_eta": options.ddim_eta}), model=self.model,
                              shape=(n * k, self.embed_dim), model_kwargs=kwargs, null_kwargs=null, clip=False,
                              sampler=options.sampler, steps=options.steps, cfg_scale=options.cfg_scale,
                              generator=generator, device=device, progress=progress)
        return F.normalize(x0.float(), dim=-1).view(n, k, self.embed_dim), cond["text_embed"]  # x₀ / √D, renormalised

    @torch.no_grad()
    def image_embeds_for(self, texts: list[str], generator: torch.Generator,
                         options: SampleOptions | None = None, progress: bool = False) -> Tensor:
        """Unit-norm image embeddings [n, D] for n captions: `image_embed_candidates`, the most similar to each
        caption's text embedding kept (`rerank`). `options`: this prior's sampling options (unset ones from the
        config)."""
        candidates, text_embed = self.image_embed_candidates(texts, generator, self.resolve(options), progress)
        return rerank(candidates, text_embed)

    def sample_conditions(self, n: int, generator: torch.Generator, options: SampleOptions) -> Batch:
        """The captions of n samples: `prompts` / `prompt` (cycled), or n held-out captions spread over the held-out
        split, with their images' true embeddings (`image_embed`) and labels; every caption's CLIP text embedding
        (`caption_embed` [n, D]) for evaluation (metric prior_similarity)."""
        device = generator.device
        texts = options.given_prompts(n)
        if texts:
            cond = Batch(text=texts)
        else:
            cond = heldout_captions(self.heldout, n, device, fields=("label", "image"))
            cond["image_embed"] = self.image_embeds(cond["image"])
        cond["caption_embed"] = self.text_conditions(cond["text"], device)["text_embed"]
        return Batch(**cond)

    @torch.no_grad()
    def sample(self, cond: Batch, generator: torch.Generator, n: int, options: Dalle2PriorSampleOptions,
               progress: bool = False) -> Tensor:
        """Image embeddings [n, D] (unit norm) for cond's captions, reranked; with `keep_candidates` every candidate,
        [n, k, D] in the order drawn."""
        candidates, text_embed = self.image_embed_candidates(list(cond["text"])[:n], generator, options, progress)
        return candidates if options.keep_candidates else rerank(candidates, text_embed)

    @torch.no_grad()
    def retrieval_bank(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """Held-out images [m, C, S, S] and their CLIP embeddings [m, D], made once."""
        if self._bank is None:
            images, why = None, "the data has no held-out split"
            try:
                if self.heldout is not None:
                    images, why = self.heldout.samples(RETRIEVAL_BANK, spread=True).get("image"), "no images in it"
            except ValueError as err:  # e.g. the cache the prior trained on is gone
                why = str(err)
            if images is None:
                raise ValueError(f"a prior's grid shows the held-out image nearest each predicted embedding, and there "
                                 f"are no held-out images to show ({why}); the embeddings themselves: "
                                 "load_run(RUN).sample(..., output='tensor'), or a decoder with --prior")
            images = images.to(device)
            self._bank = (images, self.image_embeds(images))
        images, embeds = self._bank
        return images.to(device), embeds.to(device)

    def preview(self, cond: Batch, images: Tensor) -> tuple[Tensor, int | None]:
        """What a predicted embedding looks like without a decoder: the held-out image nearest to it in CLIP space
        (cosine), each row of them below the row of the captions' true images when there are any; every candidate
        ([n, k, D], keep_candidates) beside the others of its caption."""
        bank, embeds = self.retrieval_bank(images.device)
        k = images.shape[1] if images.dim() == 3 else 1
        nearest = bank[(images.reshape(-1, embeds.shape[1]).to(embeds) @ embeds.T).argmax(dim=1)]  # [n·k, C, S, S]
        if "image" not in cond:
            return nearest, None
        return interleave_rows([cond["image"].to(nearest).repeat_interleave(k, dim=0), nearest])
