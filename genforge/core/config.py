"""The pydantic v2 sections of a run config that every layer may read: data, train, eval, log, and the base of a
family's `model` section (extra keys are errors). The whole RunConfig, which names every registered family, is
assembled above the families (genforge.app.config); nothing below the application layer sees it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterator, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model, field_validator, model_validator
from pydantic.fields import FieldInfo

from genforge.core.codec import InputRun
from genforge.core.errors import ConfigError
from genforge.core.precision import resolve_auto
from genforge.core.registry import DATA_SOURCES

__all__ = ["ConfigChange", "ConfigError", "DataConfig", "EmaConfig", "EvalConfig", "FamilyConfig", "JointImagesConfig",
           "LogConfig", "MAX_BATCH", "MAX_EVAL_SAMPLES", "MAX_GRID_SAMPLES", "MAX_SAMPLES", "OnResume", "OptimizerSettings",
           "PhaseConfig", "SampleOptions", "ShapesConfig", "StrictModel", "TrainConfig", "config_changes", "on_resume",
           "section_defaults"]


class OnResume(Enum):
    """What a resumed run may do with a config field (`config_changes`), marked on the field:
    `lr: Annotated[float, OnResume.CHANGE] = Field(...)`. A field without a marker may not change."""

    CHANGE = "change"  # it only acts from the resumed step on: any new value
    ADD = "add"  # it may go from None to a value: a part the checkpoint does not have yet, which starts fresh


# Sizes no run can mean (checked when a config is validated, before anything is created): they bound what would
# otherwise end in an out-of-memory error (a data set's per-epoch order holds 16 bytes a sample)
MAX_SAMPLES = 10_000_000  # the built-in data sets' samples (data.shapes.n; genforge data shapes --n)
MAX_BATCH = 1 << 20  # a global batch (train.batch_size); CLIP's 32k is far below
MAX_EVAL_SAMPLES = 1_000_000  # samples of one evaluation (eval.n, eval.ref_n, genforge eval --n); FID takes 50k
MAX_GRID_SAMPLES = 100_000  # samples of one `genforge sample` grid


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated, and no number is NaN or
    infinite (a weight decay of inf or a guidance of NaN is refused naming its field, before anything runs)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)
    # the rule of every field of a section that has one for all of them (eval, log); else each field's marker
    every_field_on_resume: ClassVar[OnResume | None] = None


def section_defaults(**defaults: Any) -> BeforeValidator:
    """A family's own defaults for a shared section, as metadata of its field:
    `gan: Annotated[GANConfig | None, section_defaults(penalty="wgan_gp")] = GANConfig(penalty="wgan_gp")`.
    A key the config leaves out of the section takes the family's default, not the shared class's, so a family that
    only changes defaults needs no subclass (one class, one set of fields, for every family that uses it)."""

    def fill(value: Any) -> Any:
        return {**defaults, **value} if isinstance(value, dict) else value

    return BeforeValidator(fill)


def on_resume(section: type[BaseModel], name: str) -> OnResume | None:
    """What a resume may do with the field `name` of `section`: the section's rule for every field, else the
    field's OnResume marker (None: it may not change)."""
    rule = getattr(section, "every_field_on_resume", None)
    field = section.model_fields.get(name)
    if rule is None and field is not None:
        rule = next((item for item in field.metadata if isinstance(item, OnResume)), None)
    return rule


@dataclass(frozen=True)
class ConfigChange:
    """A config field (dotted path) whose value differs from the run being resumed, and whether a resume may change it."""

    field: str
    old: Any
    new: Any
    allowed: bool

    def __str__(self) -> str:
        return f"{self.field}: {self.old!r} -> {self.new!r}"


def config_changes(old: BaseModel, new: BaseModel) -> list[ConfigChange]:
    """Every leaf field whose value differs between the config `old` (of the run being resumed) and `new`, with
    whether a resumed run may change it (the fields' OnResume markers, `on_resume`)."""
    return [ConfigChange(".".join(path), a, b, _may_change(new, path, a))
            for path, a, b in _differences(old.model_dump(mode="json"), new.model_dump(mode="json"), ())]


_ABSENT = "<absent>"


def _differences(old: Any, new: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            yield from _differences(old.get(key, _ABSENT), new.get(key, _ABSENT), (*path, str(key)))
    elif (isinstance(old, list) and isinstance(new, list) and len(old) == len(new)
          and all(isinstance(item, dict) for item in old + new)):  # e.g. the stages of a cascade
        for i, (a, b) in enumerate(zip(old, new)):
            yield from _differences(a, b, (*path, str(i)))
    elif old != new:
        yield path, old, new


def _may_change(config: Any, path: tuple[str, ...], old: Any) -> bool:
    """Whether a section on `path` through `config` (the new config) lets its field change on resume: a field
    marked OnResume.CHANGE, with everything below it, or the last field of `path` marked OnResume.ADD and None in
    the old config."""
    for depth, key in enumerate(path):
        if isinstance(config, StrictModel):
            rule = on_resume(type(config), key)
            if rule is OnResume.CHANGE or (rule is OnResume.ADD and old is None and depth == len(path) - 1):
                return True
            config = getattr(config, key, None)
        elif isinstance(config, dict):
            config = config.get(key)
        elif isinstance(config, list) and key.isdigit() and int(key) < len(config):
            config = config[int(key)]
        else:
            return False
    return False


class ShapesConfig(StrictModel):
    """The built-in procedural `shapes` data set (genforge.data.shapes)."""

    n: int = Field(20_000, gt=0, le=MAX_SAMPLES, description="number of distinct images (index range)")
    seed: int = Field(0, ge=0)
    min_shapes: int = Field(1, ge=1, le=3)
    max_shapes: int = Field(3, ge=1, le=3)
    textured_fraction: float = Field(0.5, ge=0.0, le=1.0)
    paths: Literal["inside", "from_centre"] = Field(
        "inside", description="moving_shapes: inside = a path of 30-45% of the side wherever it fits (the start "
                              "position hints at the direction); from_centre = every shape starts near the centre "
                              "and travels 20-26% (only the caption says the direction)")

    @model_validator(mode="after")
    def _min_le_max(self) -> "ShapesConfig":
        if self.min_shapes > self.max_shapes:
            raise ValueError(f"min_shapes={self.min_shapes} must be <= max_shapes={self.max_shapes}")
        return self


class VideoConfig(StrictModel):
    """How clips are cut from videos (`data.source: video_folder | moving_shapes`): `num_frames` frames,
    every `frame_stride`-th frame of the source or resampled to `fps`, from a random start (a temporal crop); with
    `min_frames`, shorter videos give padded clips with a frame mask instead of being skipped."""

    num_frames: int = Field(17, ge=1, le=1024, description="frames per clip (Phenaki: 17 = 1 + 16)")
    frame_stride: int = Field(1, ge=1, description="take every n-th source frame (when fps is not set)")
    fps: float | None = Field(None, gt=0.0, description="resample each clip to this frame rate instead of a stride")
    random_start: bool = Field(True, description="a random temporal crop; false: every clip starts at frame 0")
    min_frames: int | None = Field(None, ge=1, description="video files: a clip shorter than num_frames but of at "
                                                           "least this many frames is padded to num_frames (its "
                                                           "last frame repeated), and every clip carries frame_mask "
                                                           "(True = a real frame), which the video families' losses "
                                                           "honour; unset: shorter clips are skipped (skipped.jsonl)")

    @model_validator(mode="after")
    def _min_frames_fit(self) -> "VideoConfig":
        if self.min_frames is not None and self.min_frames > self.num_frames:
            raise ValueError(f"data.video.min_frames={self.min_frames} must be at most data.video.num_frames="
                             f"{self.num_frames}")
        return self


class JointImagesConfig(StrictModel):
    """Images trained on beside a video source, each as a 1-frame clip [C, 1, H, W] (Phenaki §3.1 trains C-ViViT and
    the transformer on images and videos together). A step's batch is all images or all clips; `ratio` of the steps
    are image steps, spread evenly (step s is an image step when floor((s + 1)·ratio) > floor(s·ratio)), so the mix
    is a pure function of the step and resumes exactly. Every other data setting (image_size, flip, shapes, splits,
    workers) is the video section's."""

    source: str = Field("shapes", description="an image source: shapes, folder, shards")
    path: str | None = Field(None, description="its data.path (an image folder, shards)")
    ratio: float = Field(0.25, gt=0.0, le=1.0, description="share of optimizer steps whose batch is images (1: "
                                                           "images only, phenaki-pytorch's train_on_images; the "
                                                           "video source still gives the held-out clips and captions)")


class DataConfig(StrictModel):
    """Where samples come from and how they are preprocessed."""

    source: str = Field("shapes", description="a registered data source (genforge.data): shapes, folder, shards, "
                                              "parquet, arrow, cache")
    path: str | None = Field(None, description="image folder (source=folder), webdataset shards: a path or URL "
                                               "with braces, e.g. data/train-{000000..000127}.tar, several "
                                               "joined by '::' (source=shards), parquet files: paths, globs "
                                               "or brace patterns (source=parquet), a folder written by "
                                               "datasets' save_to_disk (source=arrow), or a folder written by "
                                               "`genforge encode` (source=cache)")
    image_size: int = Field(32, ge=8, le=4096)
    flip: bool = Field(True, description="random horizontal flip")
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="held-out validation share: of the images (a "
                                                                  "folder, by a hash of each path) or of the shards "
                                                                  "(shards, by a seeded permutation)")
    test_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="held-out test share, split like val_fraction")
    split_seed: int = Field(0, ge=0, description="seed of the train / val / test split (folder, shards)")
    split: str = Field("train", pattern=r"^\w+(\.\w+)*$",
                       description="the named split that trains, of data with splits as Hugging Face datasets names "
                                   "them (folder, parquet, arrow: split folders train/ validation/ test/, files named "
                                   "by split, data/<split>-NNNNN-of-NNNNN.parquet, a save_to_disk DatasetDict); "
                                   "held-out images (evaluation, FID's reference) come from its test split, else "
                                   "its validation split")
    num_workers: Annotated[int, OnResume.CHANGE] = Field(2, ge=0, le=64,
                                                         description="decoding worker processes per rank")
    max_bad_fraction: Annotated[float, OnResume.CHANGE] = Field(
        0.1, ge=0.0, le=1.0, description="stop when more than this share of samples read was unreadable")
    max_image_pixels: Annotated[int, OnResume.CHANGE] = Field(
        89_478_485, gt=0, description="larger images are refused as decompression bombs")
    shuffle_buffer: int = Field(1000, ge=0, le=1_000_000,
                                description="source=shards: records shuffled within each worker's "
                                                        "stream (0: shard order only)")
    image_embeds: str | None = Field(None, description="source=shards: a folder of per-shard image-embedding files "
                                                       "<prefix>_<shard number>.npy (DALLE2-pytorch's / clip-retrieval's "
                                                       "img_emb layout): row int(key[-embed_index_width:]) of the file "
                                                       "numbered like the record's shard is its image_embed")
    embed_index_width: int = Field(4, ge=1, le=12, description="source=shards with image_embeds: digits of a record "
                                                                "key that give its row (img2dataset: 4)")
    image_column: str = Field("image", min_length=1, description="source=parquet / arrow: the column of the encoded "
                                                                 "images (a Hugging Face Image: a struct of bytes and "
                                                                 "path, or binary); a folder's metadata: its file "
                                                                 "column, file_name for image, else <image_column>"
                                                                 "_file_name")
    caption_column: str = Field("text", min_length=1, description="source=parquet / arrow, and a folder's metadata: "
                                                                  "the caption column, strings or lists of strings "
                                                                  "(one drawn per sample; data without it has no "
                                                                  "captions)")
    label_column: str | None = Field(None, min_length=1, description="source=parquet / arrow, and a folder's "
                                                                     "metadata: the class-label column (unset: a "
                                                                     "folder's class sub-folders when it has no "
                                                                     "metadata, a table's one ClassLabel column)")
    shapes: ShapesConfig = ShapesConfig()
    video: VideoConfig = VideoConfig()
    images: JointImagesConfig | None = Field(
        None, description="video sources: images trained on as 1-frame clips in a share of the steps (joint image + "
                          "video, Phenaki §3.1); kept though it did not help phenaki on moving shapes "
                          "(docs/phenaki.md): real clips are scarcer than images, the case it was made for")

    @model_validator(mode="before")
    @classmethod
    def _sections_of_the_source(cls, given: Any) -> Any:
        """Drop the sub-sections a registered source does not read (`DataSource.sections`): they mean nothing for
        it, and its config keeps its own keys only. Joint images asked for (`images` set) stay, to be refused by
        `joint_images` naming the source."""
        source = given.get("source", cls.model_fields["source"].default) if isinstance(given, dict) else None
        if not isinstance(source, str) or source not in DATA_SOURCES:
            return given
        unread = DATA_SOURCES.get(source).unread_sections()
        return {k: v for k, v in given.items() if k not in unread or (k == "images" and v is not None)}

    @model_validator(mode="after")
    def _source_checks(self) -> "DataConfig":
        """The shares' sum, then the checks of a registered source (genforge.data registers the built-in ones, and
        each refuses the fields of other sources it does not read; an unknown name is reported where the whole run
        config is validated, once every plug-in is loaded)."""
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(f"data.val_fraction + data.test_fraction = {self.val_fraction + self.test_fraction:g} "
                             "must be < 1 (something must be left to train on)")
        if self.source in DATA_SOURCES:
            DATA_SOURCES.get(self.source).check(self)
        if self.images is not None:
            self.joint_images()  # checks the images' section
        return self

    def joint_images(self) -> "DataConfig | None":
        """The data section of `images` (joint image + video training): this one with the images' source and path,
        None without images. ValueError unless this source makes clips and that one images."""
        if self.images is None:
            return None
        for name, source, field in (("data.source", self.source, "video"), ("data.images.source", self.images.source,
                                                                             "image")):
            if source in DATA_SOURCES and DATA_SOURCES.get(source).field != field:
                raise ValueError(f"data.images (joint image + video training) needs {name} to give "
                                 f"{'clips' if field == 'video' else 'images'}; {source!r} does not")
        update = {"source": self.images.source, "path": self.images.path, "images": None}
        return DataConfig.model_validate({**self.model_dump(), **update})


class OptimizerSettings(StrictModel):
    """The optimizer settings of the train section that a phase may set apart (`PhaseConfig`); each only acts from
    the step it is set on, so a resume may change it."""

    lr: Annotated[float, OnResume.CHANGE] = Field(1e-4, gt=0.0, le=1.0)
    weight_decay: Annotated[float, OnResume.CHANGE] = Field(0.0, ge=0.0)
    betas: Annotated[tuple[float, float], OnResume.CHANGE] = (0.9, 0.999)
    warmup_steps: Annotated[int, OnResume.CHANGE] = Field(0, ge=0)
    lr_schedule: Annotated[Literal["constant", "cosine", "exponential"], OnResume.CHANGE] = Field(
        "constant", description="after the warm-up: constant; cosine to min_lr_ratio at train.steps; exponential: "
                                "times lr_decay_rate every lr_decay_every steps (DALLE-pytorch train_vae.py's "
                                "ExponentialLR, gamma 0.98 stepped every 100 steps), floored at min_lr_ratio")
    min_lr_ratio: Annotated[float, OnResume.CHANGE] = Field(0.0, ge=0.0, le=1.0, description="floor of the cosine "
                                                            "and exponential schedules as a share of lr")
    lr_decay_rate: Annotated[float, OnResume.CHANGE] = Field(0.98, gt=0.0, le=1.0, description="lr_schedule="
                                                             "exponential: the factor of each decay (DALLE-pytorch "
                                                             "0.98)")
    lr_decay_every: Annotated[int, OnResume.CHANGE] = Field(100, ge=1, description="lr_schedule=exponential: "
                                                            "optimizer steps between decays (DALLE-pytorch 100)")
    grad_clip: Annotated[float | None, OnResume.CHANGE] = Field(
        None, ge=0.0, description="max global grad norm; 0: no clipping; unset: the family's default "
                                  "(FamilyTraits.grad_clip: its seed trainer's where that sets one, else 1.0; the "
                                  "README's family table), written resolved into config.yaml")
    ema_decay: Annotated[float, OnResume.CHANGE] = Field(0.9999, ge=0.0, lt=1.0, description="the decay of "
                                                         "train.ema.kind=exponential (unused by kind=power)")


def all_optional(settings: type[StrictModel]) -> type[StrictModel]:
    """A section with every field of `settings`, optional: its constraints and markers, default None (unset)."""
    fields: dict[str, Any] = {name: (info.annotation | None, FieldInfo.merge_field_infos(info, default=None))
                              for name, info in settings.model_fields.items()}
    return create_model(f"Optional{settings.__name__}", __base__=StrictModel, __module__=__name__, **fields)


class PhaseConfig(all_optional(OptimizerSettings)):  # type: ignore[misc]
    """Optimizer settings of one phase of a task (`train.phases.<phase>`), overriding the train section's: e.g. each
    U-Net of a cascade (dalle2_decoder: unet1, unet2) or vqgan's discriminator with its own learning rate. Unset
    fields take the train section's value; warmup_steps counts this phase's own optimizer steps and ema_decay is
    that of the weights this phase trains."""


POWER_EMA_SIGMA_RELS = (0.05, 0.10)  # EDM2's two tracked averages (Karras et al. 2024, §3)
MAX_SIGMA_REL = (1 / 12) ** 0.5  # σ_rel of γ = 0 (a plain running mean): the widest power-function EMA


class EmaConfig(StrictModel):
    """Which EMA of the weights a run keeps (`train.ema`). exponential (the default): one average of decay
    `train.ema_decay` (with `train.ema_warmup`), as every run before. power: EDM2's power-function EMAs (Karras et al.
    2024, "Analyzing and Improving the Training Dynamics of Diffusion Models", §3), one per relative width in
    `sigma_rels` (the first is what previews, eval, sample and export use), and snapshots of them every
    `snapshot_every` steps into RUN/ema_snapshots/, from which `genforge ema RUN --sigma-rel X` synthesises the
    average of any width after training (docs/ema.md)."""

    kind: Literal["exponential", "power"] = "exponential"
    sigma_rels: list[float] | None = Field(
        None, min_length=1, max_length=8, description="kind=power: the relative widths σ_rel of the tracked averages "
        f"(default {list(POWER_EMA_SIGMA_RELS)}); each in (0, 0.2887); the first is the run's EMA weights")
    snapshot_every: Annotated[int | None, OnResume.CHANGE] = Field(
        None, ge=1, description="kind=power: steps between snapshots (default train.checkpoint_every, 500 when that "
                                "is 0); the last step always has one")

    @model_validator(mode="after")
    def _consistent(self) -> "EmaConfig":
        if self.kind == "exponential":
            given = [name for name in ("sigma_rels", "snapshot_every") if getattr(self, name) is not None]
            if given:
                raise ValueError(f"train.ema.{given[0]} applies to train.ema.kind=power, not exponential (whose decay "
                                 "is train.ema_decay)")
            return self
        for i, sigma_rel in enumerate(self.sigma_rels or ()):
            if not 0.0 < sigma_rel < MAX_SIGMA_REL:
                raise ValueError(f"train.ema.sigma_rels[{i}]={sigma_rel} must be in (0, {MAX_SIGMA_REL:.4f}) (σ_rel of "
                                 "a power-function EMA: its width relative to the training so far)")
        if self.sigma_rels is not None and len(set(self.sigma_rels)) != len(self.sigma_rels):
            raise ValueError(f"train.ema.sigma_rels={self.sigma_rels} names one width twice")
        return self

    @property
    def widths(self) -> tuple[float, ...]:
        """The σ_rel of each tracked power-function EMA (kind=power), the run's EMA weights' first."""
        return tuple(self.sigma_rels) if self.sigma_rels is not None else POWER_EMA_SIGMA_RELS


class TrainConfig(OptimizerSettings):
    """Optimisation and cadences; every count is in optimizer steps. A resumed run may lengthen the run, change the
    optimizer's settings and schedule, the cadences and the precision; not the batch, the seed or the EMA's warm-up
    (they define what was trained so far); nor does init_from matter to a resume, which loads the run's own
    checkpoint."""

    steps: Annotated[int, OnResume.CHANGE] = Field(1000, gt=0, description="total optimizer steps")
    batch_size: int = Field(32, gt=0, le=MAX_BATCH, description="global batch (all ranks x accumulation)")
    grad_accum: Annotated[int, OnResume.CHANGE] = Field(1, ge=1)
    precision: Annotated[Literal["no", "bf16", "fp16"], OnResume.CHANGE] = Field(
        "no", description="autocast of the networks: no (float32), bf16, fp16 (CUDA, with a grad scaler); auto: bf16 "
                          "where the device runs it natively (a CUDA GPU with bf16, a CPU with AVX-512-BF16 / AMX), "
                          "else no, written resolved into config.yaml")
    sharding: Literal["none", "fsdp"] = Field(
        "none", description="none: every process holds all weights (DDP); fsdp: the trained weights, gradients, "
                            "optimizer state and EMA are split over the processes (FSDP2, docs/scaling.md)")
    compile: Annotated[bool, OnResume.CHANGE] = Field(
        False, description="torch.compile (inductor) each trained block of the network: fused kernels, faster steps "
                           "on GPUs, a first step that compiles (about a minute per block kind on a CPU); "
                           "docs/performance.md")
    seed: int = Field(0, ge=0)
    init_from: Annotated[str | None, OnResume.CHANGE] = Field(
        None, min_length=1,
        description="a run directory (its newest usable checkpoint) or one checkpoint folder "
                    "(checkpoints/step-NNNNNN): a fresh run starts from its model and EMA weights with a fresh "
                    "optimizer and step 0 (fine-tuning); ignored once this run has its own checkpoint (a resume)")
    ema_warmup: bool = Field(True, description="decay ramps as min(decay, (1+n)/(10+n)), n = the updates of the "
                                               "phase whose weights are averaged (a phase first trained in a "
                                               "resumed run warms up from its own first update)")
    ema_start: int = Field(0, ge=0, description="updates of a phase before EMA starts averaging its weights (it "
                                                "copies until then)")
    ema: EmaConfig = Field(default_factory=EmaConfig, description="exponential (train.ema_decay) or EDM2's "
                           "power-function EMAs with snapshots for post-hoc synthesis (docs/ema.md)")
    log_every: Annotated[int, OnResume.CHANGE] = Field(10, gt=0)
    sample_every: Annotated[int, OnResume.CHANGE] = Field(500, ge=0, description="0: only at the end")
    num_samples: Annotated[int, OnResume.CHANGE] = Field(16, gt=0, le=256,
                                                          description="images in each preview grid")
    sample_frames: Annotated[int | None, OnResume.CHANGE] = Field(
        None, gt=0, description="frames of a video generator's preview clips, e.g. more than the training clips' "
                                "(default: theirs)")
    checkpoint_every: Annotated[int, OnResume.CHANGE] = Field(500, ge=0, description="0: only at the end")
    keep_last: Annotated[int, OnResume.CHANGE] = Field(2, ge=2, description="checkpoints kept (at least 2)")
    keep_best: Annotated[str | None, OnResume.CHANGE] = Field(
        None, description="also keep the checkpoint with the best value of this eval result (e.g. judge_accuracy); "
                          "needs eval.every")
    keep_best_mode: Annotated[Literal["max", "min"], OnResume.CHANGE] = "max"
    max_nonfinite_skips: Annotated[int, OnResume.CHANGE] = Field(
        10, ge=1, description="consecutive non-finite steps before the run stops")
    on_nonfinite: Annotated[Literal["stop", "rollback"], OnResume.CHANGE] = Field(
        "stop", description="after max_nonfinite_skips: stop, or reload the last checkpoint and skip the data "
                            "that led to the failure")
    max_rollbacks: Annotated[int, OnResume.CHANGE] = Field(3, ge=0,
                                                           description="rollbacks allowed before the run stops")
    dist_timeout_s: Annotated[int, OnResume.CHANGE] = Field(
        600, ge=10, description="collective timeout: a dead or hung rank ends the run")
    check_consistency: Annotated[bool, OnResume.CHANGE] = Field(
        True, description="after each checkpoint, check that every rank holds the same weights, buffers and EMA (a "
                          "hash per tensor; several processes only)")
    phases: Annotated[dict[str, PhaseConfig], OnResume.CHANGE] = Field(
        default_factory=dict, description="per-phase optimizer settings by phase name (the task's phases, e.g. "
                                          "train.phases.unet2.lr); unset fields take this section's")

    @field_validator("precision", mode="before")
    @classmethod
    def _yaml_no(cls, value: Any) -> Any:
        """`precision: no` in YAML (and `--set train.precision=no`) reads as the boolean false (YAML 1.1); `auto`
        is resolved for this machine's device (core.precision.resolve_auto)."""
        return "no" if value is False else resolve_auto(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        if self.sharding == "fsdp" and self.precision == "fp16":
            raise ValueError("train.sharding=fsdp takes train.precision=bf16 or no, not fp16 (its grad scaler does "
                             "not work on sharded gradients)")
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"train.batch_size={self.batch_size} must be divisible by train.grad_accum={self.grad_accum}"
            )
        if self.ema.kind == "power":  # train.ema_decay, which every preset sets, is left unused (docs/ema.md)
            decays = [(name, phase.ema_decay) for name, phase in self.phases.items() if phase.ema_decay is not None]
            if decays:
                raise ValueError(f"train.phases.{decays[0][0]}.ema_decay={decays[0][1]} is a decay of "
                                 "train.ema.kind=exponential; train.ema.kind=power averages every phase with "
                                 "train.ema.sigma_rels instead: set one of them")
        for where, betas in [("train.betas", self.betas)] + [(f"train.phases.{name}.betas", phase.betas)
                                                              for name, phase in self.phases.items()]:
            for i, beta in enumerate(betas or ()):
                if not 0.0 <= beta < 1.0:
                    raise ValueError(f"{where}[{i}]={beta} must be in [0, 1)")
        return self

    @property
    def snapshot_every(self) -> int:
        """Steps between power-function EMA snapshots: train.ema.snapshot_every, default train.checkpoint_every
        (500 when that is 0)."""
        return self.ema.snapshot_every or self.checkpoint_every or 500

    def for_phase(self, phase: str, grad_clip: float | None = None) -> "TrainConfig":
        """This section with `train.phases.<phase>`'s settings in place of its own; `grad_clip` is the clipping of
        a section that leaves it unset (a section built by hand, not through a run config: the family's,
        FamilyTraits.grad_clip)."""
        update = {"grad_clip": grad_clip} if self.grad_clip is None and grad_clip is not None else {}
        overrides = self.phases.get(phase)
        if overrides is not None:
            update.update(overrides.model_dump(exclude_none=True))
        return self.model_copy(update=update) if update else self

    def check_phases(self, phases: tuple[str, ...]) -> None:
        """ConfigError when `train.phases` names a phase the task does not have."""
        unknown = [name for name in self.phases if name not in phases]
        if unknown:
            raise ConfigError(f"train.phases.{unknown[0]}: this model has no phase {unknown[0]!r}; its phases are "
                              f"{', '.join(phases)}")


class EvalConfig(StrictModel):
    """Periodic evaluation during training (also the defaults of `genforge eval`); a resume may change any of it."""

    every_field_on_resume: ClassVar[OnResume | None] = OnResume.CHANGE

    every: int = Field(0, ge=0, description="0: no evaluation during training")
    metrics: list[str] | None = Field(None, description="registered metrics (genforge.eval); default: the family's "
                                                         "(generators: judge; tokenizers: psnr, ssim, and codebook if "
                                                         "discrete)")
    n: int = Field(256, gt=0, le=MAX_EVAL_SAMPLES, description="samples each evaluation draws")
    ref: str | None = Field(None, description="real images for fid/kid/prdc: an image folder, or a statistics file "
                                              "(.safetensors written by genforge, .npz with mu and sigma); "
                                              "default: the held-out split of the run's data")
    ref_n: int | None = Field(None, gt=1, le=MAX_EVAL_SAMPLES, description="reference images used (default: eval.n)")
    is_weights: str | None = Field(None, description="file with the Inception-v3 logits layer (fc.weight "
                                                     "[1008, 2048]) for metric 'is'; the FID network lacks it")
    i3d_weights: str | None = Field(None, description="TorchScript I3D file for metric 'fvd' (StyleGAN-V's "
                                                      "i3d_torchscript.pt); genforge downloads nothing")
    zero_shot_prompt: str = Field("a {}", description="metric zero_shot: the prompt of each class, {} its name")
    val_loss_batches: int = Field(0, ge=0, le=10_000,
                                  description="at each evaluation, also the loss of every phase on this "
                                                       "many held-out batches of train.batch_size, with fixed noise "
                                                       "(val_loss, val/<phase>/loss; train.keep_best may name "
                                                       "val_loss with keep_best_mode=min); 0: none")


class LogConfig(StrictModel):
    """Where scalars and images go besides metrics.jsonl and samples/; a resume may change any of it."""

    every_field_on_resume: ClassVar[OnResume | None] = OnResume.CHANGE

    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "genforge"
    progress: bool = True


class SampleOptions(StrictModel):
    """The sampling options every family takes, declared once: `genforge sample` / `genforge eval` make a flag of each
    field (cfg_scale -> --cfg-scale; a bool -> --name/--no-name) and `Run.sample` / `Run.evaluate` a keyword; a
    family's subclass adds its own (its `FamilyTraits.sample_options`). Unset (None) options take the run's config
    defaults in the task's `resolve`, which hands the task one object. A field's `json_schema_extra` may say `read:
    image` (the value names an image file, read and resized like the training images: a tensor [1, C, S, S] in
    [-1, 1] replaces it), `read: video` (a clip [1, C, T, S, S]), `read: lines` (a text file: its non-empty lines)
    or `read: run` (a run directory: the run's task, with its EMA weights), and `eval: true` (`genforge eval` takes
    it too)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)  # what `read` fields hold once read: tensors, tasks

    steps: int | None = Field(None, ge=1, description="sampling steps (respaced)", json_schema_extra={"eval": True})
    sampler: str | None = Field(None, description="diffusion sampler: ddpm, ddim (objective ddpm), euler, heun, "
                                                  "euler_ancestral, dpmpp_2m", json_schema_extra={"eval": True})
    cfg_scale: float | None = Field(None, ge=1.0, description="classifier-free guidance scale",
                                    json_schema_extra={"eval": True})
    label: int | None = Field(None, ge=0, description="class label for every sample")
    prompt: str | None = Field(None, description="text prompt for every sample (text-conditioned families)")
    negative_prompt: str | None = Field(None, description="what guidance steers away from (replaces the "
                                                          "unconditional branch)")
    prompts: Path | list[str] | None = Field(None, description="text file, one prompt per line; samples cycle "
                                                               "through them", json_schema_extra={"read": "lines"})

    @classmethod
    def of(cls, options: "SampleOptions | None") -> Any:
        """`options` as this class (None: none set): itself when it is one, else the options it sets, validated."""
        if isinstance(options, cls):
            return options
        return cls.model_validate(options.model_dump(exclude_unset=True) if options is not None else {})

    def filled(self, **defaults: Any) -> "SampleOptions":
        """A copy with each option of `defaults` that is unset (None) set to its default (the config's)."""
        return self.model_copy(update={k: v for k, v in defaults.items() if getattr(self, k) is None})

    def given_prompts(self, n: int) -> list[str] | None:
        """The captions of `n` samples from `prompts` / `prompt` (cycled over the n), None when neither is set."""
        prompts = self.prompts or ([self.prompt] if self.prompt else None)
        return [prompts[i % len(prompts)] for i in range(n)] if prompts else None


class FamilyConfig(StrictModel):
    """Base of every family's `model` section. A family's subclass sets `family` to a Literal of its name (the tag
    RunConfig's union discriminates on) and says which metrics apply to it through `roles`: a metric applies when
    the roles it requires are among the family's (genforge.eval.metrics)."""

    family: str
    grad_checkpointing: Annotated[bool, OnResume.CHANGE] = Field(
        False, description="recompute each block's activations in backward instead of keeping them: less memory, "
                           "one more forward per step")

    def takes_prompts(self) -> bool:
        """Whether `genforge sample --prompt` applies (text-conditioned models)."""
        return getattr(self, "conditioning", None) == "text"

    def check_data(self, data: DataConfig) -> None:
        """Cross-field checks against the data section (raise ValueError naming the fields)."""

    def check_eval(self, eval: EvalConfig) -> None:
        """Cross-field checks against the eval section, e.g. a loss that reads one of its feature networks (raise
        ValueError naming the fields)."""

    def input_runs(self) -> dict[str, InputRun]:
        """Earlier runs this model is built from (a frozen tokenizer), by config field; resolved by the application
        layer and handed to the family's builder."""
        return {}
