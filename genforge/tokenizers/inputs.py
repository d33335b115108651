"""The config section through which a generator names where its codes come from (`model.latent`, `model.tokens`):
a trained tokenizer run, a diffusers model folder (AutoencoderKL, VQModel), or a parameter-free stand-in of
genforge.tokenizers.standins (`build_standin`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from genforge.core.codec import InputRun
from genforge.core.config import StrictModel

STANDINS = {"space_to_depth": "latent", "colour": "tokens"}  # stand-in codec -> the kind of codes it makes
LOADED = ("tokenizer", "diffusers")  # codecs with weights, loaded by the application


class CodecInputConfig(StrictModel):
    """Where a generator's codes come from (`model.latent` of dit, `model.tokens` of maskgit): a trained tokenizer
    run (its latest checkpoint's EMA weights encode and decode; the generator's checkpoints keep a copy of them), a
    diffusers model folder (`codec: diffusers`, `pretrained`: e.g. the SD VAE; the generator's checkpoints refer to it
    by path and content hash instead of copying it), or a parameter-free stand-in. A subclass narrows `codec` to the
    sources of its kind and sets `kind` and `field`."""

    kind: ClassVar[str]  # "latent" or "tokens": what the generator models
    field: ClassVar[str]  # the config field, for messages: "model.latent"
    codec: str
    tokenizer: str | None = Field(None, description="codec=tokenizer: run directory of a trained tokenizer")
    pretrained: str | None = Field(None, description="codec=diffusers: a local diffusers model folder "
                                                     "(save_pretrained: AutoencoderKL for latents, VQModel for "
                                                     "tokens); checkpoints refer to it, so keep it where it is")
    factor: int = Field(2, ge=1, le=16, description="a stand-in's downsampling: pixels per position along each side")
    scale: float = Field(1.0, gt=0.0, description="codec=space_to_depth: latent = encode(x) * scale (a tokenizer "
                                                   "brings its own scale factor)")
    levels: int = Field(4, ge=2, le=16, description="codec=colour: levels per RGB channel (levels³ codes)")

    @model_validator(mode="after")
    def _fields_fit_the_codec(self) -> "CodecInputConfig":
        f = self.field
        if self.codec == "tokenizer" and not self.tokenizer:
            raise ValueError(f"{f}.tokenizer (a tokenizer run directory) is required when {f}.codec is 'tokenizer'")
        if self.codec != "tokenizer" and self.tokenizer:
            raise ValueError(f"{f}.tokenizer applies to {f}.codec=tokenizer")
        if self.codec == "diffusers" and not self.pretrained:
            raise ValueError(f"{f}.pretrained (a diffusers model folder) is required when {f}.codec is 'diffusers'")
        if self.codec != "diffusers" and self.pretrained:
            raise ValueError(f"{f}.pretrained applies to {f}.codec=diffusers")
        own = {"space_to_depth": ("factor", "scale"), "colour": ("factor", "levels")}.get(self.codec, ())
        for name in ("factor", "scale", "levels"):
            if name not in own and getattr(self, name) != type(self).model_fields[name].default:
                where = f"it applies to codec={'colour' if name == 'levels' else 'space_to_depth'}" \
                    if self.codec not in LOADED else "a loaded codec's downsampling and scale come with its weights"
                raise ValueError(f"{f}.{name} does not apply to {f}.codec={self.codec} ({where})")
        return self

    @property
    def loaded(self) -> bool:
        """Whether the codec is loaded (a tokenizer run or a diffusers folder) rather than a stand-in."""
        return self.codec in LOADED

    @property
    def source_field(self) -> str:
        """The config field naming the loaded codec: "model.latent.tokenizer" or "model.latent.pretrained"."""
        return f"{self.field}.{'pretrained' if self.codec == 'diffusers' else 'tokenizer'}"

    @property
    def source_path(self) -> str | None:
        """The run directory or diffusers folder of a loaded codec (None: a stand-in)."""
        return self.pretrained if self.codec == "diffusers" else self.tokenizer

    def input_runs(self) -> dict[str, InputRun]:
        """The tokenizer run or diffusers folder, when the codes come from one."""
        if not self.loaded:
            return {}
        return {self.source_field: InputRun(self.source_path, self.kind, "run" if self.codec == "tokenizer"
                                            else "diffusers")}


class LatentInputConfig(CodecInputConfig):
    """DiT's latents: a trained continuous tokenizer (a klvae run), or `space_to_depth`. The latent of an image is
    the posterior mean of the tokenizer, or with `sample_posterior` a sample of it, as DiT's train.py takes
    `vae.encode(x).latent_dist.sample()` (Peebles & Xie 2023)."""

    kind: ClassVar[str] = "latent"
    field: ClassVar[str] = "model.latent"
    codec: Literal["space_to_depth", "tokenizer", "diffusers"] = "space_to_depth"
    sample_posterior: bool = Field(False, description="a codec with a Gaussian posterior (klvae, AutoencoderKL): "
                                                      "train on mean + std · ε of q(z|x) (times the scale factor), ε from "
                                                      "the batch's random stream, a new sample every step (DiT); "
                                                      "false: the posterior mean. Needs images: a cache holds means")

    @model_validator(mode="after")
    def _posterior_of_a_tokenizer(self) -> "LatentInputConfig":
        if self.sample_posterior and not self.loaded:
            raise ValueError(f"{self.field}.sample_posterior applies to {self.field}.codec=tokenizer (a klvae run) or "
                             f"diffusers (an AutoencoderKL); the {self.codec} stand-in has no posterior")
        return self


class TokenInputConfig(CodecInputConfig):
    """MaskGIT's token ids: a trained discrete tokenizer (a vqgan or dvae run), a diffusers VQModel folder, or
    `colour` (tests)."""

    kind: ClassVar[str] = "tokens"
    field: ClassVar[str] = "model.tokens"
    codec: Literal["tokenizer", "diffusers", "colour"] = "tokenizer"


class VideoTokenInputConfig(TokenInputConfig):
    """Phenaki's token ids [B, t, h, w]: a trained video tokenizer (a cvivit run), or `colour` in C-ViViT's causal
    layout (the first frame, then blocks of `temporal_factor` frames; tests). diffusers has no video tokenizer."""

    codec: Literal["tokenizer", "colour"] = "tokenizer"

    temporal_factor: int = Field(2, ge=1, le=8, description="codec=colour: frames per token frame after the first "
                                                            "(a tokenizer's comes from its checkpoint)")

    @model_validator(mode="after")
    def _temporal_factor_is_the_standins(self) -> "VideoTokenInputConfig":
        if self.codec == "tokenizer" and self.temporal_factor != type(self).model_fields["temporal_factor"].default:
            raise ValueError(f"{self.field}.temporal_factor does not apply to {self.field}.codec=tokenizer (a "
                             "tokenizer's temporal patch comes from its checkpoint)")
        return self
