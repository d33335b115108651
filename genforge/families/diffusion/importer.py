"""DiT weights from elsewhere -> genforge's DiT (docs/interoperability.md): facebookresearch/DiT's checkpoints
(`DiT-XL-2-256x256.pt`: a plain state dict, read with `weights_only=True`) and diffusers `DiTTransformer2DModel`
folders. The sizes are inferred from the tensors.

- Official: genforge's DiT has facebookresearch/DiT's parameter names, key for key; only `pos_embed` (the fixed
  2-D sin-cos table, §3.2) is not stored by genforge: it is checked against the table genforge builds and dropped.
- diffusers: the inverse of genforge.families.diffusion.export's mapping (to_q/to_k/to_v fused into qkv, norm1.linear
  -> adaLN_modulation.1, proj_out_1/2 -> the final layer). diffusers keeps a timestep and label embedder in every
  block; genforge's DiT has one, so the blocks' copies must be equal (they are in an export and in facebook/DiT-XL-2).
  The imported model embeds the timestep with DiT's frequency shift 0 where diffusers uses 1 (the one numerical
  difference, as for export).

Each source's run samples as the source's own code does (`SourceSampling`): an official checkpoint as DiT's
`sample.py`, a diffusers folder as `DiTPipeline`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from diffusers import DiTTransformer2DModel
from safetensors.torch import load_file
from torch import Tensor

from genforge.core.errors import ConfigError
from genforge.core.export import Imported
from genforge.families.diffusion.dit import DIT_SIZES, sincos_pos_embed_2d

SHIFT_NOTE = ("diffusers' DiTTransformer2DModel embeds the timestep with downscale_freq_shift=1, genforge's DiT (as "
              "facebookresearch/DiT) with 0: the imported model's outputs differ slightly from diffusers' "
              "(docs/interoperability.md: measured)")


@dataclass(frozen=True)
class SourceSampling:
    """How the source's own code samples its weights, as `model.diffusion` keys of the imported run."""

    guidance_channels: int | None  # the first this many output channels guided; None: every data channel
    fixed_variance: Literal["small", "large"]  # the chain's variance when Σ is not learned


# facebookresearch/DiT's sample.py: models.py's forward_with_cfg guides eps[:, :3] only ("for exact reproducibility
# reasons"), and diffusion/__init__.py's create_diffusion(str(steps)) leaves sigma_small=False, so a DiT without
# learned Σ samples with β_t (ModelVarType.FIXED_LARGE)
DIT_SAMPLE_PY = SourceSampling(guidance_channels=3, fixed_variance="large")
# diffusers' DiTPipeline guides every latent channel (noise_pred[:, :latent_channels]); a variance it takes from its
# scheduler, not the weights, so the run keeps genforge's default
DIT_PIPELINE = SourceSampling(guidance_channels=None, fixed_variance="small")


@dataclass(frozen=True)
class DiTWeights:
    """A DiT's dimensions, read off its tensors, and its weights under genforge's DiT names."""

    depth: int
    hidden_size: int
    num_heads: int
    patch_size: int
    mlp_ratio: float
    in_channels: int
    learn_sigma: bool
    num_classes: int  # 0: unconditional
    input_size: int  # the latent (or pixel) side the DiT was trained on
    weights: dict[str, Tensor]

    def imported(self, notes: list[str], sampling: SourceSampling) -> Imported:
        """The genforge run of these weights: a class-conditional (or unconditional) DiT on the ddpm objective with
        DiT's defaults (linear β, T = 1000, ε, learned variance; 250 DDPM steps and guidance 4 for sampling), guided
        on `sampling`'s channels and, without learned Σ, with its fixed variance."""
        diffusion: dict[str, object] = {"objective": "ddpm", "learn_sigma": self.learn_sigma}
        guided = sampling.guidance_channels
        if guided is not None and guided <= self.in_channels:
            diffusion["guidance_channels"] = guided
        elif guided is not None and self.learn_sigma:  # fewer data channels: eps[:, :3] reaches into the variance
            notes = [*notes, f"the source guides the first {guided} output channels, more than the model's "
                             f"{self.in_channels} data channels: the import guides every data channel, not the "
                             "learned variance"]
        if not self.learn_sigma:
            diffusion["fixed_variance"] = sampling.fixed_variance
        model = {"family": "diffusion", "backbone": {"kind": "dit", **self.size_fields()},
                 "conditioning": "class" if self.num_classes else "none", "diffusion": diffusion}
        if self.num_classes:
            model["num_classes"] = self.num_classes
        codes = "latent" if self.in_channels != 3 else None
        return Imported(model, self.weights, codes, self.input_size, self.num_classes, notes)

    def size_fields(self) -> dict[str, object]:
        """The `model.backbone` keys of a genforge config for these dimensions: the zoo's size when it is one, else
        S/2 with every dimension set."""
        dims = {"depth": self.depth, "hidden_size": self.hidden_size, "num_heads": self.num_heads,
                "patch_size": self.patch_size}
        for name, zoo in DIT_SIZES.items():
            if zoo == dims:
                return {"size": name, "mlp_ratio": self.mlp_ratio}
        return {"size": "S/2", **dims, "mlp_ratio": self.mlp_ratio}


def heads_of(depth: int, hidden_size: int, num_heads: int | None, source: str) -> int:
    """The head count: given, or that of the DiT zoo's size with this depth and width (heads leave no trace in the
    weights); ConfigError asking for --num-heads otherwise."""
    if num_heads is not None:
        if hidden_size % num_heads:
            raise ConfigError(f"--num-heads {num_heads} does not divide the width {hidden_size} of {source}")
        return num_heads
    for zoo in DIT_SIZES.values():
        if (zoo["depth"], zoo["hidden_size"]) == (depth, hidden_size):
            return zoo["num_heads"]
    raise ConfigError(f"{source}: depth {depth}, width {hidden_size} is no size of the DiT zoo, and the number of "
                      "attention heads is not in the weights: give it with --num-heads")


def _tensor(state: dict[str, Tensor], key: str, source: str) -> Tensor:
    if key not in state:
        raise ConfigError(f"{source} has no {key!r}: not a facebookresearch/DiT state dict")
    return state[key]


def from_official(state: dict[str, Tensor], source: str, num_heads: int | None = None) -> DiTWeights:
    """A facebookresearch/DiT state dict (`models.py`'s DiT) as genforge DiT weights; ConfigError naming what does
    not fit."""
    patch = _tensor(state, "x_embedder.proj.weight", source)  # [D, C, p, p]
    hidden, in_channels, p = patch.shape[0], patch.shape[1], patch.shape[-1]
    depth = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
    out = _tensor(state, "final_layer.linear.weight", source).shape[0] // (p * p)  # p·p·C' rows
    if out not in (in_channels, 2 * in_channels):
        raise ConfigError(f"{source}: the final layer makes {out} channels per pixel from {in_channels}")
    table = state.get("y_embedder.embedding_table.weight")  # [K + 1, D] with CFG's null row
    num_classes = table.shape[0] - 1 if table is not None else 0
    pos = _tensor(state, "pos_embed", source)  # [1, N, D], fixed
    grid = round(pos.shape[1] ** 0.5)
    if grid * grid != pos.shape[1]:
        raise ConfigError(f"{source}: pos_embed has {pos.shape[1]} positions, not a square grid")
    if not torch.allclose(pos.float(), sincos_pos_embed_2d(hidden, grid, grid)[None], atol=1e-5):
        raise ConfigError(f"{source}: pos_embed is not DiT's fixed 2-D sin-cos table, which genforge rebuilds")
    weights = {key: value for key, value in state.items() if key != "pos_embed"}
    mlp = _tensor(state, "blocks.0.mlp.fc1.weight", source).shape[0] / hidden
    return DiTWeights(depth, hidden, heads_of(depth, hidden, num_heads, source), p, mlp, in_channels,
                      out == 2 * in_channels, num_classes, grid * p, weights)


def read_official(path: Path, num_heads: int | None = None) -> Imported:
    """A facebookresearch/DiT checkpoint file: a `.pt` state dict (read with weights_only=True: a file holding
    pickled objects other than tensors is refused) or `.safetensors`; train.py's {"model", "ema", ...} checkpoints
    carry an argparse Namespace and are refused with how to extract the EMA state dict."""
    try:
        if path.suffix == ".safetensors":
            from_file = load_file(str(path))
        else:
            from_file = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle.UnpicklingError and whatever a non-checkpoint raises
        raise ConfigError(f"{path} is not a plain state dict of tensors: genforge reads checkpoints with "
                          f"torch.load(weights_only=True) and never unpickles code ({type(err).__name__}: "
                          f"{str(err).splitlines()[0][:200]}). A facebookresearch/DiT train.py checkpoint holds "
                          "its args as well: where you trust the file, save its 'ema' state dict alone once (torch.save) "
                          "and import that") from None
    if isinstance(from_file, dict) and "ema" in from_file and isinstance(from_file["ema"], dict):
        from_file = from_file["ema"]
    if not isinstance(from_file, dict) or not all(isinstance(v, Tensor) for v in from_file.values()):
        raise ConfigError(f"{path} holds a {type(from_file).__name__}, not a state dict of tensors")
    return from_official(from_file, str(path), num_heads).imported([], DIT_SAMPLE_PY)


def _same_in_every_block(state: dict[str, Tensor], suffix: str, depth: int, source: str) -> Tensor:
    """The embedder weight diffusers copies into every block (`transformer_blocks.i.<suffix>`), once."""
    first = state[f"transformer_blocks.0.{suffix}"]
    for i in range(1, depth):
        if not torch.equal(state[f"transformer_blocks.{i}.{suffix}"], first):
            raise ConfigError(f"{source}: transformer_blocks.{i}.{suffix} differs from block 0's; genforge's DiT "
                              "has one timestep and label embedder for all blocks")
    return first


def read_diffusers(folder: Path, num_heads: int | None = None) -> Imported:
    """A diffusers DiTTransformer2DModel folder as a genforge run (`num_heads` is in its config)."""
    return from_diffusers(folder).imported([SHIFT_NOTE], DIT_PIPELINE)


def from_diffusers(folder: Path) -> DiTWeights:
    """A diffusers DiTTransformer2DModel folder (save_pretrained, safetensors) as genforge DiT weights. Its label
    table has rows 0..K-1 and the null class K (diffusers: num_embeds_ada_norm = K)."""
    try:
        model = DiTTransformer2DModel.from_pretrained(folder, local_files_only=True, use_safetensors=True)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{folder}: not a DiTTransformer2DModel folder with safetensors weights ({err})") from None
    c = model.config
    if c.norm_type != "ada_norm_zero" or c.activation_fn != "gelu-approximate":
        raise ConfigError(f"{folder}: norm_type={c.norm_type}, activation_fn={c.activation_fn}; genforge's DiT is "
                          "ada_norm_zero with gelu-approximate")
    state, depth, hidden = model.state_dict(), int(c.num_layers), int(c.num_attention_heads * c.attention_head_dim)
    source = str(folder)
    w: dict[str, Tensor] = {"x_embedder.proj.weight": state["pos_embed.proj.weight"],
                            "x_embedder.proj.bias": state["pos_embed.proj.bias"]}
    emb = "norm1.emb"
    for kind in ("weight", "bias"):
        w[f"t_embedder.mlp.0.{kind}"] = _same_in_every_block(state, f"{emb}.timestep_embedder.linear_1.{kind}",
                                                             depth, source)
        w[f"t_embedder.mlp.2.{kind}"] = _same_in_every_block(state, f"{emb}.timestep_embedder.linear_2.{kind}",
                                                             depth, source)
    w["y_embedder.embedding_table.weight"] = _same_in_every_block(
        state, f"{emb}.class_embedder.embedding_table.weight", depth, source)  # [K + 1, D]
    for i in range(depth):
        pre, to = f"transformer_blocks.{i}", f"blocks.{i}"
        for kind in ("weight", "bias"):
            w[f"{to}.adaLN_modulation.1.{kind}"] = state[f"{pre}.norm1.linear.{kind}"]
            w[f"{to}.attn.qkv.{kind}"] = torch.cat([state[f"{pre}.attn1.to_{x}.{kind}"] for x in "qkv"])
            w[f"{to}.attn.proj.{kind}"] = state[f"{pre}.attn1.to_out.0.{kind}"]
            w[f"{to}.mlp.fc1.{kind}"] = state[f"{pre}.ff.net.0.proj.{kind}"]
            w[f"{to}.mlp.fc2.{kind}"] = state[f"{pre}.ff.net.2.{kind}"]
    for kind in ("weight", "bias"):
        w[f"final_layer.adaLN_modulation.1.{kind}"] = state[f"proj_out_1.{kind}"]
        w[f"final_layer.linear.{kind}"] = state[f"proj_out_2.{kind}"]
    out = int(c.out_channels or c.in_channels)
    return DiTWeights(depth, hidden, int(c.num_attention_heads), int(c.patch_size),
                      state["transformer_blocks.0.ff.net.0.proj.weight"].shape[0] / hidden, int(c.in_channels),
                      out == 2 * int(c.in_channels), w["y_embedder.embedding_table.weight"].shape[0] - 1,
                      int(c.sample_size), {k: v.detach().clone() for k, v in w.items()})
