"""diffusion -> diffusers (docs/interoperability.md has the tables and the measured differences).

- DiT backbone -> `DiTTransformer2DModel`, key for key: the fused qkv is split into to_q/to_k/to_v, each block's
  adaLN regression is `norm1.linear`, the timestep and label embedders are copied into every block's `norm1.emb`,
  the final layer is proj_out_1 (adaLN) / proj_out_2 (linear). The label table is padded to diffusers' DiT layout,
  labels 0..999 and the null class 1000 (DiTPipeline's hard-coded null label); rows from the run's class count
  up are the run's null row. Known difference: diffusers' `CombinedTimestepLabelEmbeddings` embeds t with
  `downscale_freq_shift=1`, genforge's DiT (as facebookresearch/DiT) with 0, and no config key changes it.
- ADM U-Net backbone -> `UNet2DModel` (resnet up/down-sampling, scale-shift norm, class embedding), exact only when
  every GroupNorm has the same group count and every attention width is a multiple of head_dim (else ExportError).
- The objective -> a scheduler: ddpm -> `DDIMScheduler` (genforge's `ddim` sampler, η = 0) with the run's β
  schedule and prediction; flow -> `FlowMatchEulerDiscreteScheduler`; edm -> none (stated in the notes).
- A latent run on a klvae tokenizer, on the ddpm objective, with at most 1000 classes -> a `DiTPipeline` folder
  (transformer + vae + scheduler). Otherwise the models and scheduler in sub-folders, and notes saying why not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import (DDIMScheduler, DiTPipeline, DiTTransformer2DModel, FlowMatchEulerDiscreteScheduler,
                       UNet2DModel)
from torch import Tensor, nn

from genforge.core.codec import DiffusersAutoencoder
from genforge.core.export import Exported, ExportError
from genforge.diffusion.config import DiffusionConfig
from genforge.families.diffusion.config import DiffusionModelConfig
from genforge.families.diffusion.dit import DiT
from genforge.families.diffusion.task import DiffusionTask
from genforge.nn.unet import AttentionBlock, ResBlock, UNet, UNetConfig

NULL_CLASS = 1000  # DiTPipeline's null label (ImageNet's class count), hard-coded in its __call__
PREDICTION_TYPES = {"eps": "epsilon", "x0": "sample", "v": "v_prediction"}  # genforge -> diffusers' prediction_type
TIMESTEP_SHIFT_NOTE = (
    "DiTTransformer2DModel embeds the timestep with downscale_freq_shift=1 (frequencies 10000^(-i/127)); genforge's "
    "DiT, like facebookresearch/DiT, with 0 (10000^(-i/128)). No config key changes it, so diffusers' outputs differ "
    "slightly from genforge's (docs/interoperability.md: measured); for genforge's exact outputs set "
    "`block.norm1.emb.time_proj.downscale_freq_shift = 0` on every transformer block after loading")


# --------------------------------------------------------------------------------------------------- DiT
def _linear(weights: dict[str, Tensor], name: str, layer: nn.Module) -> None:
    """`name`.weight (and .bias) <- the layer's (a Conv1d of kernel 1 becomes the Linear it is)."""
    for kind, tensor in layer.state_dict().items():
        weights[f"{name}.{kind}"] = tensor.squeeze(-1) if isinstance(layer, nn.Conv1d) else tensor


def dit_label_table(dit: DiT) -> Tensor:
    """The label table in diffusers' layout [max(K, 1000) + 1, D]: the run's K classes, then its null row in every
    row after them (so label K, genforge's null, and label 1000, DiTPipeline's, both mean "no class"). An
    unconditional DiT's table is zeros (diffusers' DiT always adds a label embedding)."""
    k, width = dit.num_classes, dit.x_embedder.proj.out_channels
    table = torch.zeros(max(k, NULL_CLASS) + 1, width)
    if dit.y_embedder is not None:
        own = dit.y_embedder.embedding_table.weight.detach().float().cpu()  # [K + 1, D], null row last
        table[:k] = own[:k]
        table[k:] = own[k]
    return table


def dit_state_dict(dit: DiT) -> dict[str, Tensor]:
    """genforge DiT weights under DiTTransformer2DModel's names (the mapping in the module docstring)."""
    weights: dict[str, Tensor] = {}
    _linear(weights, "pos_embed.proj", dit.x_embedder.proj)
    table = dit_label_table(dit)
    for i, block in enumerate(dit.blocks):
        pre = f"transformer_blocks.{i}"
        _linear(weights, f"{pre}.norm1.emb.timestep_embedder.linear_1", dit.t_embedder.mlp[0])
        _linear(weights, f"{pre}.norm1.emb.timestep_embedder.linear_2", dit.t_embedder.mlp[2])
        weights[f"{pre}.norm1.emb.class_embedder.embedding_table.weight"] = table
        _linear(weights, f"{pre}.norm1.linear", block.adaLN_modulation[1])
        qkv = block.attn.qkv  # rows: q | k | v, each head's channels contiguous (genforge.nn.attention)
        for name, w, b in zip(("to_q", "to_k", "to_v"), qkv.weight.chunk(3), qkv.bias.chunk(3)):
            weights[f"{pre}.attn1.{name}.weight"], weights[f"{pre}.attn1.{name}.bias"] = w, b
        _linear(weights, f"{pre}.attn1.to_out.0", block.attn.proj)
        _linear(weights, f"{pre}.ff.net.0.proj", block.mlp.fc1)
        _linear(weights, f"{pre}.ff.net.2", block.mlp.fc2)
    _linear(weights, "proj_out_1", dit.final_layer.adaLN_modulation[1])
    _linear(weights, "proj_out_2", dit.final_layer.linear)
    return weights


def dit_transformer(dit: DiT) -> DiTTransformer2DModel:
    """The DiTTransformer2DModel of `dit`, loaded strictly (every key mapped); ExportError for an MLP width other
    than diffusers' 4 × hidden."""
    width, heads = dit.x_embedder.proj.out_channels, dit.blocks[0].attn.num_heads
    if dit.blocks[0].mlp.fc1.out_features != 4 * width:
        raise ExportError(f"model.backbone.mlp_ratio={dit.blocks[0].mlp.fc1.out_features / width:g}: "
                          "DiTTransformer2DModel's feed-forward is 4 x the width (mlp_ratio 4)")
    model = DiTTransformer2DModel(
        num_attention_heads=heads, attention_head_dim=width // heads, in_channels=dit.in_channels,
        out_channels=dit.out_channels, num_layers=len(dit.blocks), sample_size=dit.input_size,
        patch_size=dit.patch_size, num_embeds_ada_norm=max(dit.num_classes, NULL_CLASS), norm_eps=1e-6)
    model.load_state_dict(dit_state_dict(dit))
    return model.eval()


# ------------------------------------------------------------------------------------------------- U-Net
def unet_groups(unet: UNet) -> int:
    """The one GroupNorm group count of `unet` (genforge's group_norm takes gcd(channels, 32) per layer); ExportError
    listing the widths when they differ: UNet2DModel has one `norm_num_groups`."""
    counts: dict[int, set[int]] = {}
    for module in unet.modules():
        if isinstance(module, nn.GroupNorm):
            counts.setdefault(module.num_groups, set()).add(module.num_channels)
    if len(counts) != 1:
        found = "; ".join(f"{groups} groups at widths {sorted(widths)}" for groups, widths in sorted(counts.items()))
        raise ExportError(f"the U-Net's GroupNorm group counts differ ({found}): UNet2DModel has one norm_num_groups, "
                          "so the mapping is not exact; every width (model.backbone.dim x each dim_mults, and the "
                          "concatenated skips) must share gcd(width, 32), e.g. model.backbone.dim a multiple of 32")
    return next(iter(counts))


def unet_model(unet: UNet, cfg: UNetConfig, sample_size: int) -> UNet2DModel:
    """The UNet2DModel of genforge's ADM U-Net (ResnetDownsample/AttnDown blocks with resnet down-sampling,
    scale-shift norm, a class embedding of K + 1 rows), loaded strictly; ExportError where it is not exact."""
    if unet.lowres or unet.image_embed_dim or unet.text_dim:
        raise ExportError("a U-Net with image-embedding, text or low-resolution conditioning has no UNet2DModel "
                          "counterpart")
    for block in unet.modules():
        if isinstance(block, AttentionBlock) and block.heads * cfg.head_dim != block.qkv.in_channels:
            raise ExportError(f"attention width {block.qkv.in_channels} is not a multiple of model.backbone.head_dim="
                              f"{cfg.head_dim}: UNet2DModel's heads have head_dim channels each")
    groups, levels = unet_groups(unet), range(len(cfg.dim_mults))
    attn = set(cfg.attention_levels)
    classes = unet.label_embed.num_embeddings if unet.label_embed is not None else None  # K + 1 (the null class)
    model = UNet2DModel(
        sample_size=sample_size, in_channels=unet.in_channels, out_channels=unet.out_channels,
        time_embedding_type="positional", freq_shift=0, flip_sin_to_cos=True,
        down_block_types=tuple("AttnDownBlock2D" if lv in attn else "ResnetDownsampleBlock2D" for lv in levels),
        up_block_types=tuple("AttnUpBlock2D" if lv in attn else "ResnetUpsampleBlock2D" for lv in reversed(levels)),
        block_out_channels=tuple(cfg.dim * m for m in cfg.dim_mults), layers_per_block=cfg.num_res_blocks,
        downsample_type="resnet", upsample_type="resnet", dropout=cfg.dropout, act_fn="silu",
        attention_head_dim=cfg.head_dim, norm_num_groups=groups, attn_norm_num_groups=groups, norm_eps=1e-6,
        resnet_time_scale_shift="scale_shift", num_class_embeds=classes, add_attention=cfg.mid_attention)
    model.load_state_dict(unet_state_dict(unet, cfg))
    return model.eval()


def unet_state_dict(unet: UNet, cfg: UNetConfig) -> dict[str, Tensor]:
    """genforge U-Net weights under UNet2DModel's names: level l's k-th block of the way down is
    down_blocks.l.resnets.k (+ attentions.k), its down-sampling block down_blocks.l.downsamplers.0; the way up
    mirrors it (up_blocks.u, u = levels - 1 - l, with upsamplers.0); middle.0/1/2 -> mid_block resnets.0,
    attentions.0, resnets.1 (without mid_attention: middle.0/1 -> resnets.0/1)."""
    weights: dict[str, Tensor] = {}
    _linear(weights, "time_embedding.linear_1", unet.time_embed[0])
    _linear(weights, "time_embedding.linear_2", unet.time_embed[2])
    if unet.label_embed is not None:
        weights["class_embedding.weight"] = unet.label_embed.weight
    _linear(weights, "conv_in", unet.input_conv)
    _linear(weights, "conv_norm_out", unet.out[0])
    _linear(weights, "conv_out", unet.out[2])
    blocks = iter(unet.down)
    for level in range(len(cfg.dim_mults)):
        for k in range(cfg.num_res_blocks):
            _level_block(weights, f"down_blocks.{level}", k, next(blocks))
        if level < len(cfg.dim_mults) - 1:
            _resblock(weights, f"down_blocks.{level}.downsamplers.0", next(blocks)[0])
    _resblock(weights, "mid_block.resnets.0", unet.middle[0])
    if cfg.mid_attention:
        _attention(weights, "mid_block.attentions.0", unet.middle[1])
    _resblock(weights, "mid_block.resnets.1", unet.middle[-1])
    blocks = iter(unet.up)
    for u in range(len(cfg.dim_mults)):
        for k in range(cfg.num_res_blocks + 1):
            _level_block(weights, f"up_blocks.{u}", k, next(blocks))
    return weights


def _level_block(weights: dict[str, Tensor], prefix: str, k: int, layers: nn.ModuleList) -> None:
    """A level's k-th ResBlock (+ AttentionBlock) (+ the up-sampling ResBlock) -> resnets.k (attentions.k,
    upsamplers.0)."""
    for layer in layers:
        if isinstance(layer, AttentionBlock):
            _attention(weights, f"{prefix}.attentions.{k}", layer)
        elif layer.resample == "up":
            _resblock(weights, f"{prefix}.upsamplers.0", layer)
        else:
            _resblock(weights, f"{prefix}.resnets.{k}", layer)


def _resblock(weights: dict[str, Tensor], prefix: str, block: ResBlock) -> None:
    """ResBlock -> ResnetBlock2D (time_embedding_norm="scale_shift"): in_layers.0 -> norm1, in_conv -> conv1,
    emb_layers.1 -> time_emb_proj, out_norm -> norm2, out_layers.2 -> conv2, skip (1x1) -> conv_shortcut."""
    pairs = [("norm1", block.in_layers[0]), ("conv1", block.in_conv), ("time_emb_proj", block.emb_layers[1]),
             ("norm2", block.out_norm), ("conv2", block.out_layers[2])]
    if isinstance(block.skip, nn.Conv2d):
        pairs.append(("conv_shortcut", block.skip))
    for name, layer in pairs:
        _linear(weights, f"{prefix}.{name}", layer)


def _attention(weights: dict[str, Tensor], prefix: str, block: AttentionBlock) -> None:
    """AttentionBlock -> Attention: norm -> group_norm, the 1x1 qkv conv's rows q | k | v -> to_q / to_k / to_v,
    proj -> to_out.0."""
    _linear(weights, f"{prefix}.group_norm", block.norm)
    w, b = block.qkv.weight.squeeze(-1), block.qkv.bias
    for name, wi, bi in zip(("to_q", "to_k", "to_v"), w.chunk(3), b.chunk(3)):
        weights[f"{prefix}.{name}.weight"], weights[f"{prefix}.{name}.bias"] = wi, bi
    _linear(weights, f"{prefix}.to_out.0", block.proj)


# --------------------------------------------------------------------------------------------- schedulers
UNBOUNDED_THRESHOLD = 1e30  # diffusers bounds the dynamic threshold s by sample_max_value; genforge does not


def diffusers_scheduler(cfg: DiffusionConfig, clip: bool) -> tuple[Any | None, list[str]]:
    """The diffusers scheduler of the run's objective and what to know about it: ddpm -> DDIMScheduler with the
    run's β schedule (IDDPM's linear 1e-4..0.02 scaled by 1000/T, or the cosine = squaredcos_cap_v2), prediction
    and clipping (pixels: x̂₀ clipped to [-1, 1], or with model.diffusion.dynamic_threshold diffusers' own dynamic
    thresholding at that quantile, s not bounded above); flow -> FlowMatchEulerDiscreteScheduler (x_t = (1 − σ)x₀ +
    σε, model time 1000σ, velocity ε − x₀: genforge's convention); edm -> None."""
    if cfg.objective == "ddpm":
        scale = 1000.0 / cfg.num_timesteps
        schedule = ({"beta_schedule": "linear", "beta_start": scale * 1e-4, "beta_end": scale * 0.02}
                    if cfg.noise_schedule == "linear" else {"beta_schedule": "squaredcos_cap_v2"})
        threshold = ({"thresholding": True, "dynamic_thresholding_ratio": cfg.dynamic_threshold,
                      "sample_max_value": UNBOUNDED_THRESHOLD} if clip and cfg.dynamic_threshold else {})
        scheduler = DDIMScheduler(num_train_timesteps=cfg.num_timesteps, **schedule, clip_sample=clip,
                                  clip_sample_range=1.0, set_alpha_to_one=True, steps_offset=0,
                                  prediction_type=PREDICTION_TYPES[cfg.prediction], timestep_spacing="leading",
                                  **threshold)
        return scheduler, [
            "DDIMScheduler (eta 0) takes the steps of genforge's `--sampler ddim`: the same timesteps for N steps "
            f"whenever the stride T // N gives exactly N of them (ceil(T / (T // N)) == N, e.g. any N that divides "
            f"T={cfg.num_timesteps})"]
    if cfg.objective == "flow":
        unclipped = ([f"FlowMatchEulerDiscreteScheduler does not threshold x̂₀: model.diffusion.dynamic_threshold="
                      f"{cfg.dynamic_threshold} is not applied"] if clip and cfg.dynamic_threshold else [])
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=cfg.flow_shift), [
            "FlowMatchEulerDiscreteScheduler matches genforge's flow convention (x_t = (1 − t)·x₀ + t·ε, model time "
            "1000·t, velocity ε − x₀, the same shift); its time steps are spaced differently from genforge's "
            "(which start at t = 0.999 and end at 0), so samples agree only as the step count grows", *unclipped]
    return None, [
        "objective=edm: no diffusers scheduler matches genforge's EDM: the network is exported raw (F of D = "
        "c_skip·x + c_out·F(c_in·x; c_noise)), and genforge feeds it 1000·c_noise where diffusers' EDM "
        "schedulers feed c_noise = ln(σ)/4"]


# ------------------------------------------------------------------------------------------------- export
def pipeline_blockers(cfg: DiffusionModelConfig, num_classes: int, has_vae: bool) -> list[str]:
    """Why this run cannot be a DiTPipeline folder (empty: it can)."""
    why = []
    if cfg.backbone.kind != "dit":
        why.append("DiTPipeline runs a DiT; diffusers' UNet2DModel pipelines take neither class labels nor "
                   "learned-variance channels")
    if not has_vae:
        why.append("DiTPipeline always decodes with an AutoencoderKL and this run " +
                   ("models pixels" if cfg.latent is None else
                    f"uses the {cfg.latent.codec} stand-in codec, which no diffusers model decodes"))
    if cfg.diffusion.objective != "ddpm":
        why.append(f"DiTPipeline steps a DDPM-family scheduler; objective={cfg.diffusion.objective} needs the "
                   "transformer stepped with the scheduler exported next to it")
    if num_classes > NULL_CLASS:
        why.append(f"{num_classes} classes: DiTPipeline's null class is label {NULL_CLASS}")
    return why


def to_diffusers(task: DiffusionTask, cfg: DiffusionModelConfig, out: Path) -> Exported:
    """Write the run as diffusers folders (a DiTPipeline where `pipeline_blockers` finds nothing against it)."""
    d = cfg.diffusion
    notes: list[str] = []
    if cfg.backbone.kind == "dit":
        name, model = "transformer", dit_transformer(task.model)
        notes.append(TIMESTEP_SHIFT_NOTE)
    else:
        if cfg.backbone.magnitude_preserving:
            raise ExportError("model.backbone.magnitude_preserving: EDM2's magnitude-preserving U-Net (normalised "
                              "weights, no biases or group norms) has no diffusers model to hold it; sample with "
                              "genforge, or export an ADM U-Net run (magnitude_preserving false)")
        name, model = "unet", unet_model(task.model, cfg.backbone, task.input_size)
    codec = task.latent_codec
    vae = codec.diffusers_autoencoder() if isinstance(codec, DiffusersAutoencoder) else None
    scheduler, scheduler_notes = diffusers_scheduler(d, clip=codec is None)
    notes += scheduler_notes
    if d.guidance_interval is not None:
        notes.append(f"model.diffusion.guidance_interval={list(d.guidance_interval)} is not applied by diffusers' "
                     "pipelines (they guide at every step)")
    if d.guidance_channels is not None:
        notes.append(f"model.diffusion.guidance_channels={d.guidance_channels} is not applied by diffusers' "
                     "DiTPipeline (it guides every latent channel)")
    blockers = pipeline_blockers(cfg, task.num_classes, vae is not None)
    parts = {name: model, "vae": vae, "scheduler": scheduler}
    folders = {part: type(obj).__name__ for part, obj in parts.items() if obj is not None}
    if not blockers:
        DiTPipeline(transformer=model, vae=vae, scheduler=scheduler).save_pretrained(out, safe_serialization=True)
        folders = {".": "DiTPipeline", **folders}
    else:
        for part, obj in parts.items():
            if obj is not None:
                obj.save_pretrained(out / part, safe_serialization=True)
        notes.append("no DiTPipeline: " + "; ".join(blockers))
    null = (NULL_CLASS if task.num_classes <= NULL_CLASS else task.num_classes) if cfg.backbone.kind == "dit" \
        else task.num_classes
    details = {"num_classes": task.num_classes, "null_class": null if task.num_classes else None,
               "objective": d.objective, "prediction": d.prediction if d.objective == "ddpm" else None,
               "cfg_scale": d.cfg_scale, "sample_steps": d.sample_steps, "sampler": d.sampler,
               "sample_size": task.input_size, "channels": task.channels}
    if cfg.backbone.kind == "dit" and not task.num_classes:
        details["class_labels"] = "unconditional: pass any label (0); its embedding is zero"
    return Exported(folders, notes, details)
