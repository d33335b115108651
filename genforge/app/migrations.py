"""Migrations of run configs to today's schema: every raw config mapping (a run directory's config.yaml, a user's
YAML file, a preset) passes through `migrate` before it is validated, so an old spelling keeps loading.

A config says its schema in a top-level `schema_version:` (an int, written by `to_yaml`); one without it is version
0, older than the versions or written by hand, and goes through every step. `MIGRATIONS[n]` takes a version-n
mapping to version n + 1; each step changes only what its old spelling names, so it leaves a config already
spelled the new way as it is. A value a step cannot carry over is a ValueError naming the field.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from genforge.core.family import canonical_family
from genforge.core.status import console

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

Migration = Callable[[dict[str, Any]], dict[str, Any]]


def _model(raw: dict[str, Any], family: str | None = None) -> dict[str, Any] | None:
    """The `model` section of `raw` when it is a mapping (of `family`, when given)."""
    model = raw.get("model")
    if not isinstance(model, dict) or (family is not None and model.get("family") != family):
        return None
    return model


def _former_family_names(raw: dict[str, Any]) -> dict[str, Any]:
    """1: a former family name (`model.family: dit`) means the family that took it over (`diffusion`)."""
    model = _model(raw)
    if model is not None and "family" in model:
        model["family"] = canonical_family(str(model["family"]))
    return raw


def _gan_penalty(raw: dict[str, Any]) -> dict[str, Any]:
    """2: model.gan.r1_weight / r1_every (the keys before `penalty`) -> penalty, penalty_weight, penalty_every:
    r1_weight > 0 is penalty: r1 with that weight, 0 (its default) penalty: none."""
    model = _model(raw)
    gan = model.get("gan") if model is not None else None
    if not isinstance(gan, dict) or not {"r1_weight", "r1_every"} & gan.keys():
        return raw
    newer = [k for k in ("penalty", "penalty_weight", "penalty_every") if k in gan]
    if newer:
        raise ValueError(f"model.gan.r1_weight / r1_every are the former keys of penalty: r1; set "
                         f"model.gan.{newer[0]} and the other penalty_* keys instead of both")
    weight, every = gan.pop("r1_weight", 0.0), gan.pop("r1_every", 4)
    try:
        on = float(weight) > 0
    except (TypeError, ValueError):
        raise ValueError(f"model.gan.r1_weight={weight!r} must be a number") from None
    gan.update(penalty="r1" if on else "none", penalty_weight=weight, penalty_every=every)
    return raw


# the model keys every dvae run's resolved config.yaml holds, the schedule's among them
_DVAE_RESOLVED_KEYS = frozenset({"anneal_rate", "temperature_start", "temperature_min", "num_tokens", "codebook_dim",
                                 "hidden_dim", "num_layers"})


def _dvae_schedule(raw: dict[str, Any]) -> dict[str, Any]:
    """3: a dvae run written before temperature_schedule (a resolved config: anneal_rate among every other key, no
    schedule) trained with legacy_exp, so it resumes with the temperatures it trained with. A hand-written config
    that sets anneal_rate alone is left to the config's refusal, which names both schedules of that rate."""
    model = _model(raw, "dvae")
    if model is not None and _DVAE_RESOLVED_KEYS <= model.keys() and "temperature_schedule" not in model:
        model["temperature_schedule"] = "legacy_exp"
    return raw


# the model keys of a dalle2_decoder run's resolved config.yaml written before `text_phase`
_DALLE2_OLD_RESOLVED_KEYS = frozenset({"stages", "train_unets", "embedder", "text", "image_embed_dropout",
                                       "text_dropout"})


def _dalle2_cascade(raw: dict[str, Any]) -> dict[str, Any]:
    """4: a dalle2_decoder run written before `conditioned`, `blur_prob`, `text_phase` and `embedder.normalize`
    (a resolved config: these six keys and no text_phase) keeps what it trained with: every stage conditioned,
    every row blurred, embeddings as their source gives them."""
    model = _model(raw, "dalle2_decoder")
    if model is None or not _DALLE2_OLD_RESOLVED_KEYS <= model.keys() or "text_phase" in model:
        return raw
    if isinstance(model["stages"], list):
        model["stages"] = [{"conditioned": True, "blur_prob": 1.0, **stage} if isinstance(stage, dict) else stage
                           for stage in model["stages"]]
    if isinstance(model["embedder"], dict):
        model["embedder"] = {"normalize": False, **model["embedder"]}
    return raw


def _phenaki_frame_order_loss(raw: dict[str, Any]) -> dict[str, Any]:
    """5: phenaki's `frame_order_loss` is gone (scoring only the decoded frame did not help: docs/phenaki.md); a
    frame-ordered clip scores every hidden token, as `all` did. A run trained with `frame` loads and samples as it
    did (the key never acted on sampling) and resumes scoring every hidden token, a change a resume could always
    make."""
    model = _model(raw, "phenaki")
    if model is not None and model.pop("frame_order_loss", "all") != "all":
        console().warning("model.frame_order_loss was removed (scoring only the decoded frame did not help, "
                          "docs/phenaki.md): a frame-ordered clip scores every hidden token")
    return raw


# the DiT's keys, flat on the diffusion family's model section before `model.backbone` held them
_DIT_KEYS = ("size", "depth", "hidden_size", "num_heads", "patch_size", "mlp_ratio")


def _diffusion_backbone(raw: dict[str, Any]) -> dict[str, Any]:
    """6: the diffusion family's backbone is one section, `model.backbone`, of `kind` dit or unet. Before, the
    DiT's keys (size, depth, hidden_size, num_heads, patch_size, mlp_ratio) were flat on `model`, the U-Net's in
    `model.unet`, and `model.backbone` was the name of the one used (dit by default): its keys move into
    `model.backbone` and the other's, which it ignored, are dropped. An old key beside a `model.backbone` section
    (e.g. `--set model.depth=3` on a preset of today) sets that key of the section when it is of that backbone."""
    model = _model(raw, "diffusion")
    if model is None:
        return raw
    old = {"dit": {key: model.pop(key) for key in _DIT_KEYS if key in model}}
    if "unet" in model:
        old["unet"] = model.pop("unet")
    if not isinstance(old.get("unet", {}), dict):
        raise ValueError(f"model.unet={old['unet']!r} must be a section (today model.backbone with kind: unet)")
    backbone = model.get("backbone", "dit" if old["dit"] or "unet" in old else None)
    if isinstance(backbone, str):  # the old spelling throughout: the named backbone's keys, the other's dropped
        model["backbone"] = {"kind": backbone, **old.get(backbone, {})}
    elif isinstance(backbone, dict):
        kind = backbone.get("kind", "dit")
        for other, keys in old.items():
            if other != kind and keys:
                where = "model.unet" if other == "unet" else f"model.{next(iter(keys))}"
                raise ValueError(f"{where} sets the {other} backbone's keys, but model.backbone.kind is {kind}; "
                                 f"they are model.backbone's keys now, with model.backbone.kind={other}")
        model["backbone"] = {**backbone, **old.get(kind, {})}
    return raw


def _gan_adversarial_weight(raw: dict[str, Any]) -> dict[str, Any]:
    """7: model.gan.adaptive (true / false, the key before `adversarial_weight`) -> adversarial_weight: adaptive /
    fixed; the same weight either way."""
    model = _model(raw)
    gan = model.get("gan") if model is not None else None
    if not isinstance(gan, dict) or "adaptive" not in gan:
        return raw
    if "adversarial_weight" in gan:
        raise ValueError("model.gan.adaptive is the former key of model.gan.adversarial_weight (adaptive / fixed); "
                         "set adversarial_weight alone")
    adaptive = gan.pop("adaptive")
    if not isinstance(adaptive, bool):
        raise ValueError(f"model.gan.adaptive={adaptive!r} must be true or false (today: model.gan.adversarial_weight "
                         "adaptive or fixed)")
    gan["adversarial_weight"] = "adaptive" if adaptive else "fixed"
    return raw


# the keys of every stage in a dalle2_decoder run's resolved config.yaml written before `degradation`
_DALLE2_RESOLVED_STAGE_KEYS = frozenset({"image_size", "unet", "diffusion", "conditioned", "blur_sigma", "blur_kernel",
                                         "blur_prob", "lowres_noise_max", "lowres_noise_sample"})


# the U-Net's attention defaults before upsamplers had none by default
_FORMER_UNET_ATTENTION = {"attention_levels": [1, 2], "mid_attention": True}


def _dalle2_upsampler_degradation(raw: dict[str, Any]) -> dict[str, Any]:
    """8: a dalle2_decoder run written before `degradation` (a resolved config: every stage with each of its keys
    then, none with degradation) blurred every upsampler's low-res input, the second and later ones included (today
    BSR by default): its upsamplers keep `degradation: blur`; and an upsampler's `unet` without attention_levels /
    mid_attention (written before the key existed) keeps the U-Net's former default for it (levels 1, 2; middle
    attention), not today's attention-free upsampler."""
    model = _model(raw, "dalle2_decoder")
    stages = model.get("stages") if model is not None else None
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        return raw
    if all(_DALLE2_RESOLVED_STAGE_KEYS <= s.keys() and "degradation" not in s for s in stages):
        for stage in stages[1:]:
            stage["degradation"] = "blur"
            if isinstance(stage["unet"], dict):
                stage["unet"] = {**_FORMER_UNET_ATTENTION, **stage["unet"]}
    return raw


MIGRATIONS: tuple[Migration, ...] = (_former_family_names, _gan_penalty, _dvae_schedule, _dalle2_cascade,
                                     _phenaki_frame_order_loss, _diffusion_backbone, _gan_adversarial_weight,
                                     _dalle2_upsampler_degradation)
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy of the config mapping `raw` brought from its `schema_version` (0 when absent) to SCHEMA_VERSION.
    ValueError for a version that is not one of 0..SCHEMA_VERSION, or a value a step cannot carry over."""
    version = raw.get("schema_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= SCHEMA_VERSION:
        raise ValueError(f"schema_version={version!r}: this genforge reads configs of schema versions 0 to "
                         f"{SCHEMA_VERSION} (a later one was written by a newer genforge)")
    raw = copy.deepcopy(raw)
    for step in MIGRATIONS[version:]:
        raw = step(raw)
    raw["schema_version"] = SCHEMA_VERSION
    return raw
