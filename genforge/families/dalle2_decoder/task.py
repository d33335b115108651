"""dalle2_decoder as a Task: one phase per trained U-Net of the cascade (`unet1`, `unet2`, ...), each on its own
diffusion objective; sampling runs the cascade with classifier-free guidance at every conditioned stage.

Conditioning (DALL·E 2 §2.1) of the conditioned stages (by default the first alone): the CLIP image embedding of the
training image, L2-normalised, replaced by a learned null embedding in `image_embed_dropout` of the rows, and
optionally the caption's text encodings, dropped in `text_dropout` of the rows; upsamplers see the image at the
previous stage's size, blurred in `blur_prob` of the rows (App. C; Cascaded Diffusion Models, Ho et al. 2022, §3.1)
or BSR-degraded (`degradation: bsr`, App. C), and, with CDM's noise augmentation on (`lowres_noise_max`; off by
default, as in the paper), noised at a random level they are told (Ho et al. 2022, §4.2); with `crop_fraction` they
train on a random crop of the image and the same region of that input (App. C) and sample at full size.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from genforge.core.codec import TextToImageEmbedding
from genforge.core.config import SampleOptions
from genforge.core.family import BuildContext
from genforge.core.random import BatchRandom
from genforge.core.task import Batch, Task, heldout_captions, interleave_rows
from genforge.diffusion import GaussianDiffusion
from genforge.diffusion.build import build_diffusion, build_objective, sample_diffusion
from genforge.diffusion.config import DiffusionConfig
from genforge.families.dalle2_decoder.config import Dalle2DecoderConfig, Dalle2SampleOptions
from genforge.families.dalle2_decoder.degradation import BSRDraws, bsr_degrade, draw_bsr
from genforge.families.dalle2_decoder.model import DecoderCascade, crop_rows, gaussian_blur, resize
from genforge.nn.frozen import Frozen, held_on
from genforge.text.clip_embedder import PretrainedClipEmbedder
from genforge.text.encoders import attach_text_encoder, build_text_encoder
from genforge.tokenizers.standins import PooledPixelEmbedder

AUGMENTATION_STEPS = 1000  # the noise-augmentation schedule's steps (levels are shares of it)


def augmentation_process() -> GaussianDiffusion:
    """The forward process that noises an upsampler's low-resolution input (a linear 1000-step schedule)."""
    return build_diffusion(DiffusionConfig(num_timesteps=AUGMENTATION_STEPS, noise_schedule="linear", learn_sigma=False))


class Dalle2DecoderTask(Task):
    """The cascade of `Dalle2DecoderConfig.stages`, trained stage by stage as phases."""


    def __init__(self, cfg: Dalle2DecoderConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.cfg = cfg
        self.heldout = ctx.heldout  # the held-out images whose variations previews and evaluation make
        self.channels = ctx.info.channels
        self.embedder: nn.Module | None = None  # a frozen ImageEmbedder (genforge.core.codec); None: the data's
        if cfg.embedder.source == "clip_run":
            self.embedder = ctx.codecs["model.embedder.path"][0]
        elif cfg.embedder.source == "clip_pretrained":  # large and frozen: outside the module tree and checkpoints
            self.embedder = Frozen(PretrainedClipEmbedder(cfg.embedder.path))
        elif cfg.embedder.source == "pooled":
            self.embedder = PooledPixelEmbedder(cfg.embedder.grid, ctx.data.image_size, self.channels)
        embed_dim = self.embedder.embed_dim if self.embedder is not None else cfg.embedder.dim
        self.embed_dim = int(embed_dim)
        # the batch's own embeddings: .npy in the shards, or a cache the configured clip run wrote (hash-checked)
        self.embeds_in_data = cfg.embedder.source == "data" or ctx.info.kind == "image_embed"
        text_dim = 0
        if cfg.text is not None:
            encoder = build_text_encoder(cfg.text)
            attach_text_encoder(self, "text_encoder", encoder)  # a trainable one trains with model.text_phase's
            text_dim = encoder.dim
        self.cascade = DecoderCascade(cfg, embed_dim, text_dim, self.channels)
        self.objectives = [build_objective(stage.diffusion) for stage in cfg.stages]
        self.augmentation = augmentation_process()
        self.stage_of = {f"unet{i + 1}": i for i in range(len(cfg.stages))}
        self.phases = tuple(f"unet{i + 1}" for i in cfg.trained_stages())
        self.conditioned = [stage.conditioned for stage in cfg.stages]  # on the image embedding (and text)
        self.text_phase = f"unet{cfg.text_phase}"  # the phase whose optimizer trains a trainable text encoder

    # ------------------------------------------------------------------------------------------------ phases
    def phase_names(self) -> tuple[str, ...]:
        return tuple(self.stage_of)

    def parameters_for(self, phase: str) -> list[nn.Parameter]:
        """The phase's U-Net, and for the phase of model.text_phase a trainable text encoder (in a run that does not
        train that phase, no optimizer has it: it stays as loaded)."""
        params = list(self.cascade[self.stage_of[phase]].parameters())
        if phase == self.text_phase and self.trains_text():
            params += list(self.text_encoder.parameters())
        return params

    def trains_text(self) -> bool:
        """Whether the text encoder is trainable (a phase's optimizer updates it)."""
        text = getattr(self, "text_encoder", None)
        return isinstance(text, nn.Module) and text.trainable

    # -------------------------------------------------------------------------------------------- conditions
    def image_embeds(self, batch: Batch) -> Tensor:
        """The image embeddings [B, D] of a batch: the data's (.npy in shards, or a `genforge encode` cache of the
        configured clip run) or the frozen embedder's."""
        if self.embeds_in_data:
            if "image_embed" not in batch:
                raise ValueError("the batch has no image_embed (model.embedder.source='data' needs .npy embeddings "
                                 "next to each image in the shards, or data.image_embeds)")
            return batch["image_embed"].float()
        return self.embed_images(batch["image"])

    @torch.no_grad()
    def embed_images(self, images: Tensor) -> Tensor:
        """The frozen embedder's embeddings [B, D] of images [B, C, H, W] in [-1, 1]."""
        if self.embedder is None:
            raise ValueError("model.embedder.source='data' has no image embedder: give embeddings, not images")
        return self.embedder_on(images.device).embed_images(images).float()

    def embedder_on(self, device: torch.device) -> nn.Module:
        """The frozen embedder, on `device` (a pretrained CLIP is held outside the module tree: it follows the
        inputs)."""
        return held_on(self.embedder, device)

    def unit_embeddings(self, embeds: Tensor) -> Tensor:
        """The one normalisation of every image embedding [B, D] the U-Nets see, whatever its source: L2 to unit
        length, as CLIP's (model.embedder.normalize; false: as given)."""
        embeds = embeds.float()
        return F.normalize(embeds, dim=-1) if self.cfg.embedder.normalize else embeds

    def conditioning(self, cond: Batch, embeds: Tensor, image_keep: Tensor, text_keep: Tensor,
                     train_text: bool = False) -> dict[str, Tensor]:
        """U-Net kwargs of the conditioned stages: the image embeddings [B, D], normalised (`unit_embeddings`), and,
        with a text encoder, the encodings of cond's captions (with gradients only when `train_text`: the phase
        that trains the encoder); rows with a False `*_keep` get the null condition."""
        embeds = self.unit_embeddings(embeds)
        kwargs = {"image_embed": embeds, "image_keep": image_keep}
        if self.cfg.text is not None:
            with nullcontext() if train_text else torch.no_grad():
                text_embed, text_mask = self.text_encoder.encode_on(cond["text"], embeds.device)
            kwargs.update(text_embed=text_embed, text_mask=text_mask, text_keep=text_keep)
        return kwargs

    def lowres_input(self, image: Tensor, stage: int, noise: Tensor | None, level: Tensor | None,
                     sigma: Tensor | None = None, blur: Tensor | None = None, bsr: BSRDraws | None = None) -> dict:
        """The upsampler's low-resolution input: `image` at the previous stage's size, degraded in training (blurred
        by σ [B] in the rows where `blur` (bool [B]; None: every row) holds, or BSR-degraded from the stage's size by
        `bsr`'s draws), then noised to augmentation `level` [B] (long, in 0..999) with `noise` (CDM's conditioning
        augmentation); `level` None: not noised (the augmentation is off), the U-Net told level 0."""
        cfg, previous = self.cfg.stages[stage], self.cfg.stages[stage - 1].image_size
        if bsr is not None:
            low = bsr_degrade(resize(image, cfg.image_size), previous, bsr)  # [B, C, S_{i-1}, S_{i-1}]
        else:
            low = resize(image, previous)
        if sigma is not None and cfg.blur_kernel > 1:
            blurred = gaussian_blur(low, sigma, cfg.blur_kernel)
            low = blurred if blur is None else torch.where(blur[:, None, None, None], blurred, low)
        if level is None:
            return {"lowres": low, "lowres_noise_level": torch.zeros(len(low), device=low.device)}
        return {"lowres": self.augmentation.q_sample(low, level, noise.to(low.dtype)),
                "lowres_noise_level": level.float()}

    def draw_lowres(self, rng: BatchRandom, stage: int) -> dict[str, Any]:
        """An upsampler's training degradation of the low-res image, from the batch's random stream, as keywords of
        `lowres_input`: CDM's augmentation level and noise (`draw_augmentation`; None when it is off), and
        (degradation blur) blur σ [B] in blur_sigma and which rows are blurred (bool [B], with probability blur_prob;
        drawn last, so blur_prob = 1 leaves the other draws as they were before it) or (bsr) the BSR draws."""
        cfg, previous = self.cfg.stages[stage], self.cfg.stages[stage - 1].image_size
        if cfg.degradation == "bsr":
            augmentation = self.draw_augmentation(rng, stage)
            return {**augmentation, "bsr": draw_bsr(rng, self.channels, previous, cfg.image_size / previous)}
        lo, hi = cfg.blur_sigma
        sigma = lo + (hi - lo) * rng.rand()  # [B]
        augmentation = self.draw_augmentation(rng, stage)
        return {"sigma": sigma, **augmentation, "blur": rng.rand() < cfg.blur_prob}

    def draw_augmentation(self, rng: BatchRandom, stage: int) -> dict[str, Tensor | None]:
        """CDM's noise augmentation of an upsampler's low-res input: a level [B] in 0..999, below lowres_noise_max of
        the schedule, and its noise [B, C, h, w], from the batch's random stream; both None when lowres_noise_max is
        unset (off, DALL·E 2 App. C), yet drawn, so the stream's other draws do not depend on it."""
        cfg, previous = self.cfg.stages[stage], self.cfg.stages[stage - 1].image_size
        level = (rng.rand() * (cfg.lowres_noise_max or 0.0) * AUGMENTATION_STEPS).long()  # [B] in 0..999
        noise = rng.randn(self.channels, previous, previous)
        if cfg.lowres_noise_max is None:
            return {"level": None, "noise": None}
        return {"level": level, "noise": noise}

    def draw_crop(self, rng: BatchRandom, stage: int) -> Tensor | None:
        """A training crop per row, in the previous stage's pixels: (top, left) long [B, 2], uniform over the
        positions of a crop of the stage's low-resolution side (`Dalle2DecoderConfig.crop_sides`); None: whole
        images."""
        sides = self.cfg.crop_sides(stage)
        if sides is None:
            return None
        return rng.randint(self.cfg.stages[stage - 1].image_size - sides[0] + 1, 2)

    # -------------------------------------------------------------------------------------------------- loss
    def loss(self, batch: Batch, phase: str, step: int) -> tuple[Tensor, dict[str, Tensor]]:
        i = self.stage_of[phase]
        stage, rng = self.cfg.stages[i], batch["rng"]
        x0 = resize(batch["image"], stage.image_size)  # [B, C, S_i, S_i]
        corner = self.draw_crop(rng, i) if i > 0 else None  # [B, 2] in low-res pixels; None: the whole image
        if corner is not None:  # App. C: a random crop, the U-Net convolutional; its low-res input cropped alike
            low_side, side = self.cfg.crop_sides(i)
            scale = side // low_side
            x0 = crop_rows(x0, corner[:, 0] * scale, corner[:, 1] * scale, side)  # [B, C, side, side]
        time, noise = self.objectives[i].draw(rng, x0)
        kwargs: dict[str, Tensor] = {}
        if self.conditioned[i]:
            image_keep = rng.rand() >= self.cfg.image_embed_dropout  # [B] bool
            text_keep = rng.rand() >= self.cfg.text_dropout
            kwargs = self.conditioning(batch, self.image_embeds(batch), image_keep, text_keep,
                                       train_text=phase == self.text_phase)
        if i > 0:
            lowres = self.lowres_input(batch["image"], i, **self.draw_lowres(rng, i))
            if corner is not None:
                lowres["lowres"] = crop_rows(lowres["lowres"], corner[:, 0], corner[:, 1], low_side)
            kwargs.update(lowres)
        terms = self.objectives[i].training_losses(self.cascade[i], x0, time, noise, model_kwargs=kwargs)
        logs = {k: terms[k].mean().detach() for k in ("mse", "vb") if k in terms}
        return terms["loss"].mean(), logs

    # ---------------------------------------------------------------------------------------------- sampling
    def sample_conditions(self, n: int, generator: torch.Generator, options: Dalle2SampleOptions) -> Batch:
        """What `n` samples decode: image embeddings of the text `prompt` (`text_image_embeds`: through `prior`, or
        CLIP's text tower), of held-out captions (with `prior` or `from_captions`; their labels kept for the judge), of
        `image` (a tensor [k, C, H, W] in [-1, 1], e.g. `genforge sample --image`), or else of `n` held-out images
        (with their labels and captions, for the judge and text conditioning), spread evenly over the held-out
        split."""
        device = generator.device
        if options.negative_prompt:
            raise ValueError("--negative-prompt does not apply to dalle2_decoder (guidance is against the null "
                             "image embedding)")
        texts = options.given_prompts(n)
        if texts:
            return Batch(image_embed=self.text_image_embeds(texts, generator, options), text=texts)
        if options.prior is not None or options.from_captions:  # held-out captions, text-to-image
            cond = heldout_captions(self.heldout, n, device)
            cond["image_embed"] = self.text_image_embeds(cond["text"], generator, options)
            return cond
        if options.image is not None:
            image = resize(options.image, self.cfg.stages[-1].image_size)
            cond = Batch(image=image.repeat((n + len(image) - 1) // len(image), 1, 1, 1)[:n])
        else:
            # evenly spread over the held-out split (a folder lists its classes in turn); a cache: its images'
            if self.heldout is None:
                raise ValueError("no held-out images to make variations of: pass --image or --prompt")
            cond = self.heldout.samples(n, spread=True)
            cond = {k: v for k, v in cond.items() if k in ("image", "label", "text", "image_embed")}
            if len(cond["image"]) < n:  # a small held-out split: cycle through it
                index = torch.arange(n) % len(cond["image"])
                cond = {k: v[index] if isinstance(v, Tensor) else [v[j] for j in index.tolist()]
                        for k, v in cond.items()}
        if self.cfg.text is not None and "text" not in cond:
            cond["text"] = [""] * n
        cond = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in cond.items()}
        if "image_embed" in cond:
            cond["image_embed"] = cond["image_embed"].float()
        elif self.conditioned_in(options):  # unconditioned upsamplers alone need none
            cond["image_embed"] = self.embed_images(cond["image"])
        return Batch(**cond)

    def text_image_embeds(self, texts: list[str], generator: torch.Generator, options: Dalle2SampleOptions) -> Tensor:
        """Image embeddings [n, D] for captions: drawn by `options.prior` (DALL·E 2 §2.2: a TextToImageEmbedding,
        e.g. a dalle2_prior run's task, over the same CLIP) with the --prior-* options, or without one the captions'
        CLIP text embeddings (the shortcut: text embeddings lie outside the region of image embeddings the decoder
        was trained on)."""
        device, prior = generator.device, options.prior
        if prior is None:
            if self.embedder is None or not self.embedder.has_text:
                raise ValueError("--prompt needs --prior (a dalle2_prior run) or an embedder with a text tower "
                                 "(model.embedder.source=clip_run or clip_pretrained)")
            return self.embedder_on(device).embed_texts(texts).float().to(device)
        if not isinstance(prior, TextToImageEmbedding):
            raise ValueError(f"--prior: a {type(prior).__name__} does not map captions to image embeddings; give a "
                             "dalle2_prior run")
        if prior.embed_dim != self.embed_dim:
            raise ValueError(f"--prior makes {prior.embed_dim}-d image embeddings, this decoder takes {self.embed_dim}")
        if self.embedder is not None and getattr(self.embedder, "has_text", False):
            probe = ["a probe caption"]
            ours = self.embedder_on(device).embed_texts(probe).float().cpu()
            theirs = prior.text_embeds(probe).float().cpu()
            if not torch.allclose(F.normalize(ours, dim=-1), theirs, atol=1e-4):
                raise ValueError("--prior: the prior was trained over another CLIP than this decoder's "
                                 f"(model.embedder.path={self.cfg.embedder.path}); they must share one")
        return prior.image_embeds_for(list(texts), generator, prior_options(options)).float().to(device)

    def conditioned_in(self, options: Dalle2SampleOptions) -> bool:
        """Whether a stage the resolved `options` run (start_stage..stop_stage) is conditioned on the image
        embedding."""
        return any(self.conditioned[options.start_stage - 1 : options.stop_stage])

    def resolve(self, options: SampleOptions | None = None) -> Dalle2SampleOptions:
        """Unset stages from the whole cascade (1 to the last), checked; sampler, steps and guidance scale stay unset
        when not given: each stage has its own defaults (`stage_plans`)."""
        options = Dalle2SampleOptions.of(options).filled(start_stage=1, stop_stage=len(self.cfg.stages))
        given = list(options.prior_options())
        if given and options.prior is None:
            raise ValueError(f"--prior-{given[0].replace('_', '-')} applies to the prior: give --prior PRIOR_RUN")
        start, stop = options.start_stage, options.stop_stage
        if not 1 <= start <= stop <= len(self.cfg.stages):
            raise ValueError(f"--start-stage {start} / --stop-stage {stop}: need 1 <= start <= stop <= "
                             f"{len(self.cfg.stages)}")
        return options

    def stage_plans(self, options: Dalle2SampleOptions) -> list[StagePlan]:
        """How each stage samples: --sampler/--steps for every stage, --cfg-scale for every conditioned one (an
        unconditioned stage is not guided: 1), else the stage's own model.diffusion defaults."""
        return [StagePlan(options.sampler or s.diffusion.sampler, options.steps or s.diffusion.sample_steps,
                          (options.cfg_scale or s.diffusion.cfg_scale) if s.conditioned else 1.0)
                for s in self.cfg.stages]

    def sampler_settings(self, options: Dalle2SampleOptions) -> dict[str, Any]:
        """Per stage: sampler, steps and guidance scale (`stage_plans`), and the stages run (--start-stage,
        --stop-stage; 1-based)."""
        plans = self.stage_plans(options)
        return {"sampler": [p.sampler for p in plans], "steps": [p.steps for p in plans],
                "cfg_scale": [p.cfg_scale for p in plans], "start_stage": options.start_stage,
                "stop_stage": options.stop_stage, **self.prior_settings(options)}

    def prior_settings(self, options: Dalle2SampleOptions) -> dict[str, Any]:
        """{"prior": what the prior samples with (its steps, guidance, η, candidates)} when --prior drives the
        decoder, for the record (`genforge eval`'s "sampler"); {} otherwise."""
        prior = options.prior
        if not isinstance(prior, TextToImageEmbedding):
            return {}
        return {"prior": prior.sampler_settings(prior.resolve(prior_options(options)))}

    @torch.no_grad()
    def sample(self, cond: Batch, generator: torch.Generator, n: int, options: Dalle2SampleOptions,
               progress: bool = False) -> Tensor:
        """Run the cascade from `start_stage` (a later start upsamples `cond["image"]`, a real low-resolution
        image) to `stop_stage`, each conditioned stage guided against the null conditions, each unconditioned one
        (by default the upsamplers) unguided, one forward per step; images in [-1, 1] at the stop stage's size."""
        plans = self.stage_plans(options)
        device = next(self.cascade.parameters()).device
        keep = torch.ones(n, dtype=torch.bool, device=device)
        cond = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in cond.items()}
        kwargs, null = {}, {"image_keep": keep[:1] & False}
        if self.conditioned_in(options):
            kwargs = self.conditioning(cond, cond["image_embed"], keep, keep)
        if self.cfg.text is not None:
            null["text_keep"] = keep[:1] & False
        x = None if options.start_stage == 1 else cond["image"]
        for i in range(options.start_stage - 1, options.stop_stage):
            stage, plan = self.cfg.stages[i], plans[i]
            stage_kwargs = dict(kwargs) if self.conditioned[i] else {}
            if i > 0:
                previous = self.cfg.stages[i - 1].image_size
                noise = torch.randn((n, self.channels, previous, previous), generator=generator, device=generator.device)
                level = None  # CDM's augmentation off: the input as it is (the noise is drawn all the same)
                if stage.lowres_noise_max is not None:
                    level = torch.full((n,), round(stage.lowres_noise_sample * (AUGMENTATION_STEPS - 1)), device=device)
                stage_kwargs.update(self.lowres_input(x, i, noise.to(device), level, sigma=None))
            x = sample_diffusion(stage.diffusion, model=self.cascade[i], shape=(n, self.channels, stage.image_size,
                                 stage.image_size), model_kwargs=stage_kwargs,
                                 null_kwargs=null if self.conditioned[i] else None, clip=True,
                                 sampler=plan.sampler, steps=plan.steps, cfg_scale=plan.cfg_scale,
                                 generator=generator, device=device, progress=progress)
        return x.clamp(-1, 1)

    def preview(self, cond: Batch, images: Tensor) -> tuple[Tensor, int | None]:
        """Rows of source images, each followed by the row of their variations (real | generated pairs)."""
        if "image" not in cond:
            return images, None
        return interleave_rows([resize(cond["image"].to(images), images.shape[-1]), images])


class StagePlan(NamedTuple):
    """How one stage of the cascade samples."""

    sampler: str
    steps: int
    cfg_scale: float


def prior_options(options: Dalle2SampleOptions) -> SampleOptions:
    """The decoder's --prior-X options as the prior's own options object (its family's `traits.sample_options`,
    validated: a value the prior refuses raises naming it)."""
    return options.prior.traits.sample_options.model_validate(options.prior_options())
