"""Config of the `cvivit` family: Phenaki's C-ViViT video tokenizer (Villegas et al. 2022, §2.1), trained with the
shared tokenizer losses (genforge.tokenizers) and any shared quantizer (VQ, LFQ, FSQ: genforge.nn.quantizers).
Its defaults are the paper's loss weights: L2 reconstruction and the perceptual loss at 0.1 (the shared tokenizer
defaults, L1 and 1.0, stay reachable by these keys; a run's config.yaml holds both, so a run keeps what it was
trained with). The paper's video perceptual term (I3D features, weight 1.0) reads a file the user supplies
(eval.i3d_weights, the one FVD reads), so it is off by default and on in the `cvivit-paper` preset."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from genforge.core.config import DataConfig, EvalConfig, StrictModel, section_defaults
from genforge.nn.quantizers import QuantizerConfig
from genforge.tokenizers.config import GANConfig, PerceptualConfig, ReconstructionLoss, TokenizerConfig


class VideoPerceptualConfig(StrictModel):
    """Phenaki's video perceptual loss L_VP on the I3D features of whole clips (genforge.nn.perceptual
    .VideoPerceptualLoss), read from `eval.i3d_weights`; weight 0 turns it off."""

    weight: float = Field(0.0, ge=0.0, description="1.0: Phenaki's (Villegas et al. 2022); 0: off (the default: it "
                                                   "needs the user's I3D file, eval.i3d_weights)")


class CViViTConfig(TokenizerConfig):
    """Patch sizes, widths and depths of the encoder (spatial, then causal temporal transformer blocks) and its
    mirrored decoder."""

    video: ClassVar[bool] = True

    family: Literal["cvivit"] = "cvivit"
    dim: int = Field(256, gt=0, description="transformer width")
    patch_size: int = Field(8, ge=1, description="spatial patch side (Phenaki: 8)")
    temporal_patch_size: int = Field(2, ge=1, description="frames per tubelet after the first frame (Phenaki: 2)")
    spatial_depth: int = Field(4, ge=1, description="spatial transformer blocks of the encoder (and the decoder)")
    temporal_depth: int = Field(4, ge=1, description="causal temporal transformer blocks of the encoder (and decoder)")
    num_heads: int = Field(8, ge=1)
    mlp_ratio: float = Field(4.0, gt=0.0)
    pixel_norm: bool = Field(False, description="LayerNorm over each raw pixel patch before its linear embedding "
                                                "(Dual PatchNorm, as phenaki-pytorch); it takes each patch's mean "
                                                "and contrast away, so a flat patch's colour cannot be encoded")
    stem_channels: int = Field(0, ge=0, description="per-frame 3x3 conv stem of this many channels before the "
                                                    "patches are cut (0: the paper's linear patch embedding)")
    head_channels: int = Field(0, ge=0, description="per-frame 3x3 conv head of this many channels after the "
                                                    "patches are put back (0: the paper's linear output)")
    reconstruction_loss: ReconstructionLoss = Field("mse", description="mse: L2, Phenaki's (Villegas et al. "
                                                                       "2022); l1: cvivit's default before")
    # the shared perceptual loss at Phenaki's weight 0.1 (Villegas et al. 2022), also when a config names the section
    # without a weight; 1.0: the shared tokenizers' default, cvivit's before; 0: off
    perceptual: Annotated[PerceptualConfig, section_defaults(weight=0.1)] = PerceptualConfig(weight=0.1)
    video_perceptual: VideoPerceptualConfig = VideoPerceptualConfig()
    quantizer: QuantizerConfig = QuantizerConfig(codebook_size=1024)
    gan: GANConfig | None = GANConfig()

    def downsample(self) -> int:
        return self.patch_size

    def check_data(self, data: DataConfig) -> None:
        super().check_data(data)
        if self.dim % self.num_heads:
            raise ValueError(f"model.dim={self.dim} must be divisible by model.num_heads={self.num_heads}")
        if self.dim % 4:
            raise ValueError(f"model.dim={self.dim} must be divisible by 4 (2-D sin-cos positions)")
        if self.video_perceptual.weight > 0 and data.video.min_frames is not None:
            raise ValueError(f"model.video_perceptual.weight={self.video_perceptual.weight} scores whole clips, "
                             f"padding included: it does not take padded clips (data.video.min_frames="
                             f"{data.video.min_frames}); set model.video_perceptual.weight=0")
        frames = data.video.num_frames
        if (frames - 1) % self.temporal_patch_size:
            raise ValueError(f"data.video.num_frames={frames}: num_frames - 1 must be divisible by "
                             f"model.temporal_patch_size={self.temporal_patch_size} (the first frame is a patch of "
                             f"its own, then tubelets of {self.temporal_patch_size} frames), e.g. "
                             f"{1 + self.temporal_patch_size * max(1, (frames - 1) // self.temporal_patch_size)}")

    def check_eval(self, eval: EvalConfig) -> None:
        if self.video_perceptual.weight > 0 and eval.i3d_weights is None:
            raise ValueError(f"model.video_perceptual.weight={self.video_perceptual.weight} needs eval.i3d_weights: "
                             "the TorchScript I3D that metric fvd reads (StyleGAN-V's i3d_torchscript.pt; genforge "
                             "downloads nothing); set it, or model.video_perceptual.weight=0")
