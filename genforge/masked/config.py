"""Config fields every masked-token generator shares (maskgit over image ids, phenaki over video ids)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from genforge.core.codec import InputRun
from genforge.core.config import FamilyConfig, OnResume, SampleOptions, StrictModel
from genforge.core.task import FamilyTraits
from genforge.tokenizers.inputs import TokenInputConfig
from genforge.text.config import TextEncoderConfig


class TokenCriticConfig(StrictModel):
    """Token-Critic (Lezama et al. 2022, "Improved Masked Image Generation with Token-Critic"; phenaki-pytorch's
    critic): a second transformer, trained as the phase `critic`, that tells the tokens the generator sampled into a
    masked sequence from the real ones; decoding then re-masks the tokens it finds most likely sampled (any token but
    given ones, so a wrong early choice can be revised) instead of the generator's least confident new ones."""

    depth: int | None = Field(None, gt=0, description="layers of a separate critic (default: 2)")
    width: int | None = Field(None, gt=0, description="default: model.width")
    num_heads: int | None = Field(None, gt=0, description="default: model.num_heads")
    kind: Literal["separate", "self"] = Field(
        "separate", description="separate: its own transformer (Token-Critic); self: one linear head on the "
                                "generator's own hidden states (phenaki-pytorch's self_token_critic, after Nijkamp et "
                                "al. 2021), trained jointly with it")
    training: Literal["phase", "joint"] = Field(
        "phase", description="phase: its own phase `critic`, optimised apart (resume a finished generator with "
                             "train_phases [critic]); joint: one loss, the generator's + loss_weight × the critic's, "
                             "in the generator's step (phenaki-pytorch's Phenaki.forward)")
    loss_weight: float | None = Field(
        None, gt=0.0, description="training=joint: the critic loss's weight in the sum (phenaki-pytorch's "
                                  "critic_loss_weight; default 1)")
    noise: Annotated[float, OnResume.CHANGE] = Field(
        1.0, ge=0.0, description="Gumbel noise on the critic's scores when choosing what to re-mask, annealed "
                                 "linearly to 0")
    sample: Annotated[bool, OnResume.CHANGE] = Field(
        True, description="decode with the critic (genforge sample/eval --critic/--no-critic)")
    guidance: Annotated[bool, OnResume.CHANGE] = Field(
        False, description="guide the critic's scores as the generator's logits, u + cfg_scale·(c − u) "
                           "(--critic-guidance); phenaki-pytorch guides them, genforge's default does not, since a "
                           "critic trained in its own phase sees no null condition unless cond_dropout_prob > 0")
    cond_dropout_prob: Annotated[float, OnResume.CHANGE] = Field(
        0.0, ge=0.0, lt=1.0, description="training=phase: share of the critic's samples trained without the "
                                         "condition, so that it can be guided; phenaki-pytorch's critic drops the "
                                         "generator's share (0.25), genforge's default 0 keeps it as it trained")

    @model_validator(mode="after")
    def _training(self) -> "TokenCriticConfig":
        if self.kind == "self":
            if self.training != "joint":
                raise ValueError("model.critic.kind=self shares the generator's transformer, so it trains with it: "
                                 "set model.critic.training=joint")
            sizes = [name for name in ("depth", "width", "num_heads") if getattr(self, name) is not None]
            if sizes:
                raise ValueError(f"model.critic.{sizes[0]}: a self critic (model.critic.kind=self) is a head on the "
                                 "generator and has no transformer of its own; leave it out")
        if self.training == "phase" and self.loss_weight is not None:
            raise ValueError("model.critic.loss_weight weighs the critic in a joint loss: set "
                             "model.critic.training=joint, or leave loss_weight out")
        if self.training == "joint" and self.cond_dropout_prob:
            raise ValueError("model.critic.cond_dropout_prob: a critic trained jointly drops the condition of the "
                             "generator's unconditional rows (model.cond_dropout_prob); leave it out")
        if self.guidance:
            self.check_guidance("model.critic.guidance")
        return self

    def check_guidance(self, name: str) -> None:
        """ValueError naming `name` when the critic never trained without the condition, so guidance would use an
        untrained unconditional branch (phase training with cond_dropout_prob 0)."""
        if self.training == "phase" and not self.cond_dropout_prob:
            raise ValueError(f"{name}: this critic trained in its own phase with the condition always given "
                             "(model.critic.cond_dropout_prob=0), so its unconditional scores are untrained; train it "
                             "with e.g. --set model.critic.cond_dropout_prob=0.25 (phenaki-pytorch's share), or "
                             "jointly (model.critic.training=joint)")

    @property
    def joint_weight(self) -> float:
        """The critic loss's weight in the generator's step (0: trained in its own phase)."""
        return 0.0 if self.training == "phase" else (self.loss_weight or 1.0)


class MaskedSampleOptions(SampleOptions):
    """Sampling options of the masked-token generators."""

    critic: bool | None = Field(None, description="with a token critic (model.critic): decode with it or not "
                                                  "(default: model.critic.sample)", json_schema_extra={"eval": True})
    temperature: float | None = Field(None, gt=0.0, description="softmax temperature of the sampled tokens "
                                                             "(default: model.temperature)", json_schema_extra={"eval": True})
    choice_temperature: float | None = Field(None, ge=0.0, description="Gumbel noise on the confidences that choose "
                                                                      "which tokens to keep (default: "
                                                                      "model.choice_temperature)",
                                             json_schema_extra={"eval": True})
    temperature_anneal: Literal["constant", "linear"] | None = Field(
        None, description="constant: the temperature at every iteration; linear: annealed to 0 over the iterations, "
                          "as phenaki-pytorch decodes (default: model.temperature_anneal)",
        json_schema_extra={"eval": True})
    critic_guidance: bool | None = Field(None, description="with a token critic: guide its scores with the "
                                                           "unconditional ones at cfg_scale, as phenaki-pytorch does "
                                                           "(default: model.critic.guidance)",
                                         json_schema_extra={"eval": True})


# what the masked-token generators are (register_family's traits): a stack of MaskTransformerBlocks whose loss
# normaliser counts the real positions of the whole global batch
MASKED_TRAITS = FamilyTraits(metrics=("judge",), sample_options=MaskedSampleOptions,
                             block_types=("genforge.masked.transformer:MaskTransformerBlock",),
                             global_fields=("frame_mask",))


class MaskedTokenConfig(FamilyConfig):
    """The masked-token transformer (MUSE base, Chang et al. 2023), MaskGIT's objective and decoding (Chang et al.
    2022), and the conditioning with dropout for classifier-free guidance: what maskgit and phenaki share."""

    tokens: TokenInputConfig
    codebook_size: int | None = Field(None, gt=1, description="vocabulary; must equal the tokenizer's codebook "
                                                               "size (default: taken from it)")
    seq_len: int | None = Field(None, gt=0, description="tokens per image; must equal the tokenizer's latent grid "
                                                        "(h·w) at data.image_size (default: taken from it)")
    depth: int = Field(8, gt=0)
    width: int = Field(256, gt=0)
    num_heads: int = Field(8, gt=0)
    mlp_ratio: float = Field(4.0, gt=0.0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    conditioning: Literal["text", "class", "none"] = "text"
    adaln: bool = Field(False, description="the pooled condition (mean of the text tokens, or the class embedding) "
                                           "also modulates every block (adaLN: DiT §3.2), beside cross-attention; "
                                           "zero-initialised, so training starts from the plain model")
    text: TextEncoderConfig = TextEncoderConfig()
    num_classes: int | None = Field(None, gt=0, description="conditioning=class: default from the data set")
    cond_dropout_prob: float = Field(0.1, ge=0.0, lt=1.0, description="share of samples trained unconditionally "
                                                                      "(classifier-free guidance)")
    mask_schedule: Literal["cosine", "linear", "square"] = Field(
        "cosine", description="γ(r), the masked share at r ~ U(0, 1) (MaskGIT §3.3: cosine)")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    sample_steps: Annotated[int, OnResume.CHANGE] = Field(12, gt=0, description="parallel decoding iterations")
    cfg_scale: Annotated[float, OnResume.CHANGE] = Field(
        3.0, ge=1.0, description="classifier-free guidance scale (1: none)")
    temperature: Annotated[float, OnResume.CHANGE] = Field(
        1.0, gt=0.0, description="softmax temperature of the sampled tokens")
    choice_temperature: Annotated[float, OnResume.CHANGE] = Field(
        4.5, ge=0.0, description="Gumbel noise on the confidences, annealed linearly to 0 (MaskGIT's re-masking)")
    temperature_anneal: Annotated[Literal["constant", "linear"], OnResume.CHANGE] = Field(
        "constant", description="constant: `temperature` at every decoding iteration (MaskGIT's reference); linear: "
                                "temperature·(1 − (t+1)/steps), 0 (greedy) at the last (phenaki-pytorch, from 0.9); "
                                "genforge keeps constant, the decoding its figures were measured with")
    sample_prompts: Annotated[list[str] | None, OnResume.CHANGE] = Field(
        None, description="prompts of preview grids and of evaluation without --prompt (default: the data's held-out "
                          "captions)")
    critic: Annotated[TokenCriticConfig | None, OnResume.ADD] = Field(
        None, description="an optional token critic, trained as the phase `critic` (Token-Critic)")
    train_phases: Annotated[list[Literal["main", "critic"]] | None, OnResume.CHANGE] = Field(
        None, description="the phases this run trains (default: every one): [main] first, then resume with [critic] "
                          "to train the critic on the finished generator (phenaki-pytorch's only_train_generator / "
                          "only_train_critic)")

    @model_validator(mode="after")
    def _widths(self) -> "MaskedTokenConfig":
        if self.width % self.num_heads:
            raise ValueError(f"model.width={self.width} must be divisible by model.num_heads={self.num_heads}")
        if self.conditioning != "class" and self.num_classes is not None:
            raise ValueError("model.num_classes applies to model.conditioning=class")
        if self.critic is not None and self.critic_size()[0] % self.critic_size()[2]:
            raise ValueError(f"model.critic.width={self.critic_size()[0]} must be divisible by model.critic.num_heads="
                             f"{self.critic_size()[2]}")
        if self.train_phases is not None:
            if not self.train_phases or len(set(self.train_phases)) != len(self.train_phases):
                raise ValueError(f"model.train_phases={self.train_phases} must name distinct phases: main, critic")
            if "critic" in self.train_phases and self.critic is None:
                raise ValueError("model.train_phases names critic, but there is no model.critic; add e.g. "
                                 "--set model.critic.depth=2")
            if "critic" in self.train_phases and self.critic.training == "joint":
                raise ValueError("model.train_phases names critic, but model.critic.training=joint trains the critic "
                                 "in the generator's step (phase main); set model.critic.training=phase")
        return self

    def critic_size(self) -> tuple[int, int, int]:
        """(width, depth, heads) of the token critic (model.critic, its unset sizes the generator's)."""
        c = self.critic or TokenCriticConfig()
        return c.width or self.width, c.depth or 2, c.num_heads or self.num_heads

    def phase_names(self) -> tuple[str, ...]:
        """Every phase of the model: main, and critic with a token critic trained in a phase of its own."""
        return ("main", "critic") if self.critic is not None and self.critic.training == "phase" else ("main",)

    def input_runs(self) -> dict[str, InputRun]:
        return self.tokens.input_runs()

    def check_vocabulary(self, codebook_size: int, source: str) -> None:
        """model.codebook_size against the tokenizer's (ValueError naming both sides)."""
        if self.codebook_size is not None and self.codebook_size != codebook_size:
            raise ValueError(f"model.codebook_size={self.codebook_size} differs from the codebook size of "
                             f"{source} ({codebook_size}); set it to {codebook_size} or leave it out")
