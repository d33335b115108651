"""The config section through which a generator names where its codes come from (`model.latent`, `model.tokens`):
a trained tokenizer run, or a parameter-free stand-in of genforge.tokenizers.standins (`build_standin`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from genforge.core.codec import InputRun
from genforge.core.config import StrictModel

STANDINS = {"space_to_depth": "latent", "colour": "tokens"}  # stand-in codec -> the kind of codes it makes


class CodecInputConfig(StrictModel):
    """Where a generator's codes come from (`model.latent` of dit, `model.tokens` of maskgit): a trained tokenizer
    run (its latest checkpoint's EMA weights encode and decode), or a parameter-free stand-in. A subclass narrows
    `codec` to the stand-in of its kind and sets `kind` and `field`."""

    kind: ClassVar[str]  # "latent" or "tokens": what the generator models
    field: ClassVar[str]  # the config field, for messages: "model.latent"
    codec: str
    tokenizer: str | None = Field(None, description="codec=tokenizer: run directory of a trained tokenizer")
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
        own = {"space_to_depth": ("factor", "scale"), "colour": ("factor", "levels")}.get(self.codec, ())
        for name in ("factor", "scale", "levels"):
            if name not in own and getattr(self, name) != type(self).model_fields[name].default:
                where = "a tokenizer's downsampling and scale come from its checkpoint" if self.codec == "tokenizer" \
                    else f"it applies to codec={'colour' if name == 'levels' else 'space_to_depth'}"
                raise ValueError(f"{f}.{name} does not apply to {f}.codec={self.codec} ({where})")
        return self

    def input_runs(self) -> dict[str, InputRun]:
        """The tokenizer run, when the codes come from one."""
        if self.codec != "tokenizer":
            return {}
        return {f"{self.field}.tokenizer": InputRun(self.tokenizer, self.kind)}


class LatentInputConfig(CodecInputConfig):
    """DiT's latents: a trained continuous tokenizer (a klvae run), or `space_to_depth`. The latent of an image is
    the posterior mean of the tokenizer, or with `sample_posterior` a sample of it, as DiT's train.py takes
    `vae.encode(x).latent_dist.sample()` (Peebles & Xie 2023)."""

    kind: ClassVar[str] = "latent"
    field: ClassVar[str] = "model.latent"
    codec: Literal["space_to_depth", "tokenizer"] = "space_to_depth"
    sample_posterior: bool = Field(False, description="codec=tokenizer with a Gaussian posterior (klvae): train on "
                                                      "mean + std · ε of q(z|x) (times the scale factor), ε from "
                                                      "the batch's random stream, a new sample every step (DiT); "
                                                      "false: the posterior mean. Needs images: a cache holds means")

    @model_validator(mode="after")
    def _posterior_of_a_tokenizer(self) -> "LatentInputConfig":
        if self.sample_posterior and self.codec != "tokenizer":
            raise ValueError(f"{self.field}.sample_posterior applies to {self.field}.codec=tokenizer (a klvae run); "
                             f"the {self.codec} stand-in has no posterior")
        return self


class TokenInputConfig(CodecInputConfig):
    """MaskGIT's token ids: a trained discrete tokenizer (a vqgan or dvae run), or `colour` (tests)."""

    kind: ClassVar[str] = "tokens"
    field: ClassVar[str] = "model.tokens"
    codec: Literal["tokenizer", "colour"] = "tokenizer"


class VideoTokenInputConfig(TokenInputConfig):
    """Phenaki's token ids [B, t, h, w]: a trained video tokenizer (a cvivit run), or `colour` in C-ViViT's causal
    layout (the first frame, then blocks of `temporal_factor` frames; tests)."""

    temporal_factor: int = Field(2, ge=1, le=8, description="codec=colour: frames per token frame after the first "
                                                            "(a tokenizer's comes from its checkpoint)")

    @model_validator(mode="after")
    def _temporal_factor_is_the_standins(self) -> "VideoTokenInputConfig":
        if self.codec == "tokenizer" and self.temporal_factor != type(self).model_fields["temporal_factor"].default:
            raise ValueError(f"{self.field}.temporal_factor does not apply to {self.field}.codec=tokenizer (a "
                             "tokenizer's temporal patch comes from its checkpoint)")
        return self
