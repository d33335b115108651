"""Config of the `dalle2_decoder` family: DALL·E 2's decoder (Ramesh et al. 2022, §2.1), a cascade of diffusion U-Nets
conditioned on CLIP image embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator
from torch import Tensor

from genforge.core.codec import InputRun
from genforge.core.config import DataConfig, FamilyConfig, OnResume, SampleOptions, StrictModel
from genforge.core.task import Task
from genforge.diffusion.config import DiffusionConfig
from genforge.nn.unet import UNetConfig
from genforge.text.config import TextEncoderConfig


BLUR_SIGMA = 0.6  # DALLE2-pytorch's blur σ (pixels) of an upsampler's low-res input; DALL·E 2 gives none
LOWRES_NOISE_SAMPLE = 0.05  # the sampling level of CDM's noise augmentation when on (docs/dalle2_decoder.md: measured)


class StageConfig(StrictModel):
    """One U-Net of the cascade: its output size, network and diffusion, whether it is conditioned on the image
    embedding (DALL·E 2 §2.1: the base model is, its upsamplers are unconditional ADMNets sampled without guidance),
    and (upsamplers) how they train (DALL·E 2, App. C): on random crops of the image (`crop_fraction`), with
    attention only where `unet` asks for it (an upsampler's default: none, so the convolutional U-Net trained on
    crops samples at full size), and with the low-resolution conditioning image degraded: Gaussian blur in
    `blur_prob` of the rows (Cascaded Diffusion Models, Ho et al. 2022, §3.1: half of them) or BSR degradation
    (`degradation: bsr`, DALL·E 2's second upsampler). Optionally (`lowres_noise_max`; off by default, as in DALL·E 2,
    App. C, and DALLE2-pytorch) the degraded image is then noised to a random level the U-Net is told: CDM's Gaussian
    conditioning augmentation (Ho et al. 2022, §4.2), which Imagen also uses."""

    image_size: int = Field(gt=0, description="side of this stage's output; the last stage's is data.image_size")
    unet: UNetConfig = UNetConfig()
    diffusion: DiffusionConfig = DiffusionConfig(noise_schedule="cosine", sampler="ddim", sample_steps=50,
                                                 cfg_scale=3.0)
    conditioned: bool | None = Field(None, description="condition this U-Net on the image embedding (and "
                                                       "model.text), guided at sampling; false: no embedding or "
                                                       "text inputs at all, sampled without guidance (one forward "
                                                       "per step); None: true for the first stage, false for "
                                                       "upsamplers (DALL·E 2 §2.1)")
    blur_sigma: tuple[float, float] = Field(
        (BLUR_SIGMA, BLUR_SIGMA), description="upsamplers: σ (pixels) of the training blur of the low-res image, drawn "
                                              "uniformly in [lo, hi] (DALL·E 2 gives none; DALLE2-pytorch: 0.6)")
    blur_kernel: int = Field(3, ge=1, le=15, description="upsamplers: blur kernel side (odd; DALLE2-pytorch: 3)")
    blur_prob: Annotated[float, OnResume.CHANGE] = Field(
        0.5, ge=0.0, le=1.0, description="upsamplers: share of training rows whose low-res image is blurred, drawn "
                                         "per row (Cascaded Diffusion Models §3.1, DALLE2-pytorch: 0.5; the others "
                                         "are clean, as at sampling); 1: every row")
    lowres_noise_max: float | None = Field(
        None, ge=0.0, le=1.0, description="upsamplers: CDM's noise augmentation of the low-res input (Cascaded "
                                          "Diffusion Models, Ho et al. 2022): in training a level drawn uniformly "
                                          "in [0, this) (share of the augmentation schedule's 1000 steps), which the "
                                          "U-Net is told; None: off, the input as degraded, told level 0 (DALL·E 2 "
                                          "App. C; DALLE2-pytorch's use_noise_for_lowres_cond=False)")
    lowres_noise_sample: Annotated[float | None, OnResume.CHANGE] = Field(
        None, ge=0.0, le=1.0, description="upsamplers with lowres_noise_max: the augmentation level used when "
                                          "sampling (DALLE2-pytorch: 0.2); None: 0.05 with lowres_noise_max (written "
                                          "resolved), nothing without it")
    crop_fraction: Annotated[float | None, OnResume.CHANGE] = Field(
        None, gt=0.0, le=1.0, description="upsamplers: train on random square crops of side crop_fraction · "
                                          "image_size, each with the same region of its low-resolution input "
                                          "(side crop_fraction · the previous stage's image_size), drawn per row; "
                                          "sampling runs at full size (DALL·E 2 App. C: 0.25, crops a quarter of "
                                          "the target's side); None: whole images")
    degradation: Literal["blur", "bsr"] | None = Field(
        None, description="upsamplers: how the low-resolution training input is degraded: blur (the Gaussian blur "
                          "of blur_prob, blur_sigma, blur_kernel) or bsr (BSRGAN's blur, resize, noise and JPEG, "
                          "Zhang et al. 2021, as DALL·E 2's second upsampler, App. C); None: blur for the first "
                          "upsampler, bsr for later ones (written resolved into config.yaml)")

    @model_validator(mode="after")
    def _lowres_degradation(self) -> "StageConfig":
        lo, hi = self.blur_sigma
        if not 0 <= lo <= hi:
            raise ValueError(f"blur_sigma={list(self.blur_sigma)} must be [lo, hi] with 0 <= lo <= hi")
        if self.blur_kernel % 2 == 0:
            raise ValueError(f"blur_kernel={self.blur_kernel} must be odd")
        if self.lowres_noise_max is None and self.lowres_noise_sample is not None:
            raise ValueError(f"lowres_noise_sample={self.lowres_noise_sample} is a level of CDM's noise augmentation, "
                             "which is off (lowres_noise_max unset): set lowres_noise_max too, or unset both")
        return self


class EmbedderConfig(StrictModel):
    """Where the image embeddings come from: a genforge `clip` run (its EMA weights, frozen), a pretrained CLIP
    (transformers' CLIPModel in a local directory: OpenAI's or LAION's weights, kept out of the checkpoints), the data
    itself
    (`.npy` embeddings next to each image in webdataset shards, DALLE2-pytorch's precomputed layout), or the
    parameter-free `pooled` stand-in (each image pooled to grid×grid colours; tests and smoke runs)."""

    source: Literal["clip_run", "clip_pretrained", "data", "pooled"] = "clip_run"
    path: str | None = Field(None, description="source=clip_run: the run directory of a trained clip model; "
                                               "clip_pretrained: a local transformers CLIPModel checkpoint directory")
    dim: int | None = Field(None, gt=0, description="source=data: the embeddings' width D")
    grid: int = Field(4, ge=1, le=16, description="source=pooled: pooled colours per side (D = 3·grid²)")
    normalize: bool = Field(True, description="L2-normalise every image embedding before it conditions the U-Nets, "
                                              "whatever its source (.npy in shards, a cache, the embedder, a "
                                              "prompt), as CLIP's are; false: each as its source gives it (the "
                                              "embedders' are unit vectors, data and caches as stored)")

    @model_validator(mode="after")
    def _fields_fit_the_source(self) -> "EmbedderConfig":
        with_path = ("clip_run", "clip_pretrained")
        if self.source in with_path and not self.path:
            raise ValueError(f"model.embedder.path (a clip run directory or a local CLIPModel checkpoint) is required "
                             f"when model.embedder.source is {self.source!r}")
        if self.source not in with_path and self.path is not None:
            raise ValueError(f"model.embedder.path applies to model.embedder.source=clip_run or clip_pretrained, not "
                             f"{self.source}")
        if (self.source == "data") != (self.dim is not None):
            raise ValueError("model.embedder.dim (the width of the .npy embeddings) is required with, and only "
                             "with, model.embedder.source='data'")
        return self


class Dalle2SampleOptions(SampleOptions):
    """The decoder's sampling options: variations of a given image, part of the cascade, text-to-image through a
    prior."""

    image: Path | Tensor | None = Field(None, description="an image file whose variations to make (or which a later "
                                                 "--start-stage upsamples)", json_schema_extra={"read": "image"})
    start_stage: int | None = Field(None, ge=1, description="the first stage of the cascade to run (a later one "
                                                            "upsamples --image)")
    stop_stage: int | None = Field(None, ge=1, description="the last stage of the cascade to run")
    prior: Path | Task | None = Field(
        None, description="a dalle2_prior run over the same CLIP: --prompt (or the held-out captions) becomes image "
                          "embeddings through it (DALL·E 2 §2.2), text-to-image",
        json_schema_extra={"read": "run", "eval": True})
    from_captions: bool = Field(False, description="decode held-out captions (their labels kept for the judge) "
                                                   "instead of making variations of held-out images: through "
                                                   "--prior, else CLIP's text embedding (the shortcut)",
                                json_schema_extra={"eval": True})
    # prior_X: the prior's own sampling option X (its --steps, --cfg-scale, --ddim-eta, --candidates) when --prior
    # drives the decoder; unset: the prior run's config
    prior_steps: int | None = Field(None, ge=1, description="with --prior: the prior's sampling steps",
                                    json_schema_extra={"eval": True})
    prior_cfg_scale: float | None = Field(None, ge=1.0, description="with --prior: the prior's guidance scale",
                                          json_schema_extra={"eval": True})
    prior_ddim_eta: float | None = Field(None, ge=0.0, le=1.0, description="with --prior: the prior's DDIM η (0: "
                                                                            "deterministic given the noise, 1: "
                                                                            "ancestral)",
                                         json_schema_extra={"eval": True})
    prior_candidates: int | None = Field(None, ge=1, le=64, description="with --prior: image embeddings the prior "
                                                                        "draws per caption, the most similar to it "
                                                                        "kept", json_schema_extra={"eval": True})

    def prior_options(self) -> dict[str, Any]:
        """The prior's sampling options given as --prior-X, by the prior's names X: {"steps": 32, ...}."""
        return {name.removeprefix("prior_"): getattr(self, name) for name in type(self).model_fields
                if name.startswith("prior_") and getattr(self, name) is not None}


class Dalle2DecoderConfig(FamilyConfig):
    """The decoder cascade: `stages` from the base U-Net up, each trained as its own phase (`unet1`, `unet2`, ...)
    with its optimizer (`train.phases.unet2.lr`) and EMA; `train_unets` picks the ones this run trains."""

    family: Literal["dalle2_decoder"] = "dalle2_decoder"
    stages: list[StageConfig] = Field(min_length=1)
    train_unets: Annotated[list[int] | None, OnResume.CHANGE] = Field(
        None, description="1-based stages this run trains (DALLE2-pytorch's unet_training_mask); the others stay "
                          "bit-for-bit as they are; default: all")
    embedder: EmbedderConfig
    text: TextEncoderConfig | None = Field(None, description="also condition the conditioned U-Nets on the "
                                                             "caption's text encodings (GLIDE's text context); "
                                                             "None: image embeddings only")
    text_phase: int = Field(1, ge=1, description="the 1-based stage whose phase trains a trainable text encoder "
                                                 "(model.text.kind=tiny) with its optimizer; the other phases use it "
                                                 "as it is, and a run that does not train that stage leaves it as "
                                                 "loaded")
    image_embed_dropout: float = Field(0.1, ge=0.0, lt=1.0, description="share of training rows with the null image "
                                                                        "embedding, for guidance (DALL·E 2 §2.1)")
    text_dropout: float = Field(0.5, ge=0.0, lt=1.0, description="share of rows with the caption dropped (§2.1)")

    @model_validator(mode="before")
    @classmethod
    def _attention_free_upsamplers(cls, raw: Any) -> Any:
        """An upsampler's U-Net without attention_levels / mid_attention in its section has none (DALL·E 2 App. C:
        convolutions only, so crops train it for the full size); written resolved into config.yaml."""
        stages = raw.get("stages") if isinstance(raw, dict) else None
        if isinstance(stages, list):
            raw = {**raw, "stages": [
                {**stage, "unet": {"attention_levels": [], "mid_attention": False, **stage.get("unet", {})}}
                if i > 0 and isinstance(stage, dict) and isinstance(stage.get("unet", {}), dict) else stage
                for i, stage in enumerate(stages)]}
        return raw

    @model_validator(mode="after")
    def _cascade(self) -> "Dalle2DecoderConfig":
        sizes = [stage.image_size for stage in self.stages]
        if any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"model.stages image sizes {sizes} must increase from one stage to the next")
        if self.stages[0].conditioned is False:
            raise ValueError("model.stages[0].conditioned=false: the first stage makes the image from the image "
                             "embedding alone and must be conditioned on it (only upsamplers may be unconditional)")
        for i, stage in enumerate(self.stages):
            if stage.conditioned is None:  # resolved: the written config says what was built
                stage.conditioned = i == 0
            if stage.lowres_noise_max is not None and stage.lowres_noise_sample is None:
                stage.lowres_noise_sample = LOWRES_NOISE_SAMPLE
            if i > 0:
                self._resolve_upsampler(i, stage)
            elif stage.crop_fraction is not None or stage.degradation is not None:
                what = "crop_fraction" if stage.crop_fraction is not None else "degradation"
                raise ValueError(f"model.stages[0].{what} applies to upsamplers (stages 1..): the base stage makes "
                                 "the whole image from the embedding")
        if not 1 <= self.text_phase <= len(self.stages):
            raise ValueError(f"model.text_phase={self.text_phase} must name a stage among 1..{len(self.stages)}")
        if self.text is not None and not self.stages[self.text_phase - 1].conditioned:
            raise ValueError(f"model.text_phase={self.text_phase}: model.stages[{self.text_phase - 1}] is not "
                             "conditioned (no text input), so its phase cannot train the text encoder; name a "
                             "conditioned stage, or set its model.stages[i].conditioned=true")
        for i, stage in enumerate(self.stages):
            if stage.image_size % stage.unet.downsample:
                raise ValueError(f"model.stages[{i}].image_size={stage.image_size} must be divisible by "
                                 f"{stage.unet.downsample} (its U-Net has {len(stage.unet.dim_mults)} levels)")
        if self.train_unets is not None:
            bad = [n for n in self.train_unets if not 1 <= n <= len(self.stages)]
            if bad or not self.train_unets or len(set(self.train_unets)) != len(self.train_unets):
                raise ValueError(f"model.train_unets={self.train_unets} must name distinct stages among "
                                 f"1..{len(self.stages)}")
        return self

    def _resolve_upsampler(self, i: int, stage: StageConfig) -> None:
        """An upsampler's degradation, resolved (the written config says what was built): blur for the first
        upsampler, BSR for later ones; its crops checked."""
        if stage.degradation is None:
            stage.degradation = "blur" if i == 1 else "bsr"
        if stage.crop_fraction is not None:
            previous = self.stages[i - 1].image_size
            sides = {"image_size": stage.image_size * stage.crop_fraction,
                     f"previous image_size ({previous})": previous * stage.crop_fraction}
            bad = [f"{name} · {stage.crop_fraction} = {side:g}" for name, side in sides.items()
                   if side != int(side) or side < 1]
            if stage.image_size % previous:
                bad.append(f"image_size {stage.image_size} is not a whole multiple of the previous {previous}")
            elif int(sides["image_size"]) % stage.unet.downsample:
                bad.append(f"the crop side {int(sides['image_size'])} is not divisible by {stage.unet.downsample} "
                           f"(its U-Net has {len(stage.unet.dim_mults)} levels)")
            if bad:
                raise ValueError(f"model.stages[{i}].crop_fraction={stage.crop_fraction}: {bad[0]}; crops need whole "
                                 "sides at both sizes")

    def crop_sides(self, i: int) -> tuple[int, int] | None:
        """Stage i's training crop sides (low-resolution input, output), None when it trains on whole images."""
        stage = self.stages[i]
        if stage.crop_fraction is None:
            return None
        return round(self.stages[i - 1].image_size * stage.crop_fraction), round(stage.image_size * stage.crop_fraction)

    def takes_prompts(self) -> bool:
        """--prompt drives the decoder through a prior (--prior, a dalle2_prior run: DALL·E 2's text-to-image) or,
        without one, by the prompt's CLIP text embedding (the shortcut; needs an embedder with a text tower)."""
        return True

    def trained_stages(self) -> list[int]:
        """0-based indices of the stages this run trains, in cascade order."""
        return sorted(n - 1 for n in self.train_unets) if self.train_unets else list(range(len(self.stages)))

    def check_data(self, data: DataConfig) -> None:
        if self.stages[-1].image_size != data.image_size:
            raise ValueError(f"model.stages[-1].image_size={self.stages[-1].image_size} must equal "
                             f"data.image_size={data.image_size} (the cascade ends at the data's resolution)")
        if data.source == "cache" and self.embedder.source != "clip_run":
            raise ValueError("data.source=cache needs model.embedder.source=clip_run, naming the clip run that wrote "
                             "the cache (`genforge encode RUN`): its embeddings are checked against it")
        if self.embedder.source == "data" and data.source != "shards":
            raise ValueError("model.embedder.source='data' reads .npy embeddings from webdataset shards: set "
                             f"data.source=shards (got {data.source})")

    def input_runs(self) -> dict[str, InputRun]:
        if self.embedder.source != "clip_run":
            return {}
        return {"model.embedder.path": InputRun(self.embedder.path, "image_embed")}
