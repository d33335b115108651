"""Config of the `phenaki` family: Phenaki's bidirectional masked-token transformer (Villegas et al. 2022, §2.2) over
the ids [t, h, w] of a C-ViViT run (or the colour stand-in), text conditioned, on video data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from torch import Tensor

from genforge.core.config import DataConfig, OnResume
from genforge.masked.config import MaskedSampleOptions, MaskedTokenConfig
from genforge.tokenizers.inputs import VideoTokenInputConfig


class PhenakiSampleOptions(MaskedSampleOptions):
    """Phenaki's sampling options: clip length and story mode."""

    frames: int | None = Field(None, ge=1, description="frames per clip (default: the training clips')")
    story: Path | list[str] | None = Field(
        None, description="text file, one chapter per line: 'prompt', or 'prompt | frames' or 'prompt | frames | "
                          "carried frames'; each sample is one story, a clip per chapter continuing the last",
        json_schema_extra={"read": "lines"})
    prime: Path | Tensor | None = Field(
        None, description="a video to continue: its last frames (1 + k·temporal patch, leaving a token frame to "
                          "generate) start the clip, re-encoded by the tokenizer; the rest is generated",
        json_schema_extra={"read": "video"})
    decode_order: Literal["parallel", "frames"] | None = Field(
        None, description="parallel: every token of the clip decoded together (MaskGIT); frames: one token frame "
                          "after the other, each conditioned on those before (default: model.decode_order)",
        json_schema_extra={"eval": True})


class PhenakiConfig(MaskedTokenConfig):
    """The shared masked-token transformer and decoding with factorised positions (learned per token of a frame,
    sin-cos over token frames, so any number of frames), over a video tokenizer's ids."""

    family: Literal["phenaki"] = "phenaki"
    tokens: VideoTokenInputConfig
    seq_len: int | None = Field(None, gt=0, description="tokens per clip (t·h·w at data.video.num_frames); must "
                                                        "equal the tokenizer's (default: taken from it)")
    cond_dropout_prob: float = Field(0.25, ge=0.0, lt=1.0, description="share of clips trained without text "
                                                                       "(classifier-free guidance): phenaki-pytorch's "
                                                                       "cond_drop_prob (maskgit's default: MUSE's 0.1)")
    sample_steps: Annotated[int, OnResume.CHANGE] = Field(
        12, gt=0, description="parallel decoding iterations (Phenaki: 12 to 48; phenaki-pytorch: 18, genforge keeps "
                              "the paper's 12, its figures' setting); with decode_order=frames, per token frame")
    decode_order: Annotated[Literal["parallel", "frames"], OnResume.CHANGE] = Field(
        "parallel", description="parallel: MaskGIT's decoding of every token of the clip together; frames: token "
                                "frame by token frame, each decoded with sample_steps iterations given the ones "
                                "before it (the conditional frame_order_prob trains)")
    positions: Literal["absolute", "rotary"] = Field(
        "absolute", description="absolute: learned per token of a frame + projected sin-cos of the token frame; "
                                "rotary: those plus 3-D rotary embeddings (RoPE) of (token frame, row, column) in "
                                "every self-attention, so attention can reach a token by its offset (motion)")
    frame_order_prob: Annotated[float, OnResume.CHANGE] = Field(
        0.0, ge=0.0, le=1.0, description="share of training clips masked in frame order: a random token frame partly "
                                         "hidden (γ(r)), the frames before it visible, those after it hidden; the "
                                         "rest masked as MaskGIT (uniformly)")
    first_frame_steps: Annotated[int, OnResume.CHANGE] = Field(
        0, ge=0, description="a curriculum: the first N optimizer steps train on each clip's first token frame alone "
                             "(text-to-image on the clips' own first frames, a third of a clip's tokens: appearance "
                             "first, Phenaki §3.1's image training), the steps after on whole clips (motion)")
    first_frame_every: Annotated[int, OnResume.CHANGE] = Field(
        0, ge=0, description="after the first_frame_steps, every k-th step trains on the clips' first token frames "
                             "again (0: never), so the clip steps do not overwrite the appearance the first frames "
                             "taught (Phenaki §3.1 trains on images and clips together)")

    def first_frame_step(self, step: int) -> bool:
        """Whether optimizer step `step` trains on the clips' first token frames alone (the curriculum's phase, then
        every first_frame_every-th step)."""
        if step < self.first_frame_steps:
            return True
        every = self.first_frame_every
        return bool(every) and (step - self.first_frame_steps) % every == every - 1

    def check_data(self, data: DataConfig) -> None:
        if data.source == "cache" and self.tokens.codec != "tokenizer":
            raise ValueError("data.source=cache needs model.tokens.codec=tokenizer and model.tokens.tokenizer set "
                             "to the cvivit run that wrote the cache (it decodes the samples)")
        if self.tokens.codec != "tokenizer":  # the stand-in's layout is known now; a tokenizer's once it is loaded
            self.check_tokens(data, self.tokens.factor, self.tokens.temporal_factor, self.tokens.levels**3,
                              "model.tokens")

    def check_tokens(self, data: DataConfig, downsample: int, temporal_downsample: int, codebook_size: int,
                     source: str) -> tuple[int, int]:
        """The token layout (token frames t, tokens per side) of data.video.num_frames × data.image_size² clips
        through a tokenizer; model.codebook_size / seq_len checked against it (ValueError naming both sides)."""
        frames, size = data.video.num_frames, data.image_size
        if size % downsample:
            raise ValueError(f"data.image_size={size} must be divisible by the spatial patch of {source} "
                             f"({downsample})")
        if (frames - 1) % temporal_downsample:
            raise ValueError(f"data.video.num_frames={frames}: num_frames - 1 must be divisible by the temporal "
                             f"patch of {source} ({temporal_downsample})")
        self.check_vocabulary(codebook_size, source)
        t, side = 1 + (frames - 1) // temporal_downsample, size // downsample
        if self.seq_len is not None and self.seq_len != t * side * side:
            raise ValueError(f"model.seq_len={self.seq_len} differs from the tokens per clip of {source} at "
                             f"data.video.num_frames={frames}, data.image_size={size} ({t}x{side}x{side} = "
                             f"{t * side * side}); set it to {t * side * side} or leave it out")
        return t, side
