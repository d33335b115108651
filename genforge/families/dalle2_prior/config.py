"""Config of the `dalle2_prior` family: DALL·E 2's diffusion prior (Ramesh et al. 2022, §2.2), a causal transformer
that maps a caption to a CLIP image embedding, trained beside the decoder (DALLE2-pytorch's `DiffusionPrior`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from genforge.core.codec import InputRun
from genforge.core.config import DataConfig, FamilyConfig, OnResume, SampleOptions, StrictModel
from genforge.diffusion.config import DiffusionConfig


class PriorEmbedderConfig(StrictModel):
    """The CLIP whose space the prior maps into: a genforge `clip` run (its EMA weights, frozen, copied into the
    prior's checkpoints) or a pretrained CLIP (transformers' CLIPModel in a local folder, kept out of the
    checkpoints). Both towers are used: the image tower makes the targets, the text tower the conditions."""

    source: Literal["clip_run", "clip_pretrained"] = "clip_run"
    path: str = Field(description="clip_run: the run directory of a trained clip model; clip_pretrained: a local "
                                  "transformers CLIPModel checkpoint directory")


class Dalle2PriorSampleOptions(SampleOptions):
    """The prior's sampling options beside the common ones (steps, sampler, cfg_scale); unset: the run's config
    (model.diffusion.ddim_eta, model.candidates). A decoder driven by the prior takes them as --prior-steps,
    --prior-cfg-scale, --prior-ddim-eta and --prior-candidates (genforge.families.dalle2_decoder)."""

    ddim_eta: float | None = Field(None, ge=0.0, le=1.0, description="DDIM's η (Song et al. 2021, eq. 16): 0 makes "
                                                                      "each embedding a deterministic function of its "
                                                                      "starting noise, 1 adds the DDPM posterior's "
                                                                      "noise at every step (DALLE2-pytorch's prior: "
                                                                      "1); sampler ddim only",
                                   json_schema_extra={"eval": True})
    candidates: int | None = Field(None, ge=1, le=64, description="image embeddings drawn per caption, the one most "
                                                                  "similar to its text embedding kept (§2.2: 2)",
                                   json_schema_extra={"eval": True})
    keep_candidates: bool | None = Field(None, description="return every candidate, [n, candidates, D] in the "
                                                            "order drawn, instead of the reranked [n, D] (the "
                                                            "prior_similarity metric draws so, to report the "
                                                            "similarity of one candidate and of the reranked one)")


class Dalle2PriorConfig(FamilyConfig):
    """A decoder-only transformer over [text encodings, text embedding, timestep, noised image embedding, query]
    with a causal mask; the query's output is the predicted (unit-norm, √D-scaled) image embedding x₀."""

    family: Literal["dalle2_prior"] = "dalle2_prior"
    embedder: PriorEmbedderConfig
    width: int = Field(256, gt=0, description="transformer width")
    depth: int = Field(6, gt=0, description="transformer blocks")
    num_heads: int = Field(4, gt=0)
    text_encodings: bool = Field(True, description="also attend to the caption's per-token text encodings "
                                                   "(DALLE2-pytorch: condition_on_text_encodings); false: the "
                                                   "pooled text embedding only")
    max_text_tokens: int = Field(32, ge=1, le=512, description="text encodings kept per caption (the first ones)")
    cond_drop_prob: float = Field(0.1, ge=0.0, lt=1.0, description="share of training rows whose text conditions "
                                                                   "are replaced by learned null ones (§2.2: 10 %), "
                                                                   "for classifier-free guidance")
    candidates: Annotated[int, OnResume.CHANGE] = Field(
        2, ge=1, le=64, description="image embeddings drawn per caption; the one most similar to the caption's text "
                                    "embedding is kept (§2.2: 2)")
    diffusion: DiffusionConfig = DiffusionConfig(noise_schedule="cosine", prediction="x0", learn_sigma=False,
                                                 sampler="ddim", sample_steps=64, cfg_scale=1.0)

    @model_validator(mode="after")
    def _widths(self) -> "Dalle2PriorConfig":
        if self.width % self.num_heads:
            raise ValueError(f"model.width={self.width} must be divisible by model.num_heads={self.num_heads}")
        if self.diffusion.learn_sigma:
            raise ValueError("model.diffusion.learn_sigma=true: the prior predicts the embedding itself (one output "
                             "per dimension); set it to false")
        return self

    def takes_prompts(self) -> bool:
        return True

    def check_data(self, data: DataConfig) -> None:
        if data.source == "cache" and self.embedder.source != "clip_run":
            raise ValueError("data.source=cache needs model.embedder.source=clip_run, naming the clip run that wrote "
                             "the cache (`genforge encode RUN`): its image embeddings are checked against it")

    def input_runs(self) -> dict[str, InputRun]:
        if self.embedder.source != "clip_run":
            return {}
        return {"model.embedder.path": InputRun(self.embedder.path, "image_embed")}
