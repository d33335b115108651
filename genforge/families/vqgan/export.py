"""vqgan -> diffusers `VQModel`, for the plain VQ bottleneck: encoder, quant_conv, post_quant_conv and decoder are
diffusers' own modules (their keys match exactly); the codebook [K, z] becomes `quantize.embedding.weight`. LFQ and
FSQ, a projected codebook (codebook_dim) and cosine-similarity codes have no VQModel counterpart (ExportError)."""

from __future__ import annotations

from pathlib import Path

from diffusers import VQModel

from genforge.core.export import Exported, ExportError
from genforge.families.vqgan.config import VQGANConfig
from genforge.families.vqgan.model import VQAutoencoder
from genforge.families.vqgan.task import VQGANTask


def check_maps(cfg: VQGANConfig) -> None:
    """ExportError naming the quantizer setting VQModel's VectorQuantizer (nearest code by Euclidean distance
    among K codes of z_channels dimensions) cannot express."""
    q = cfg.quantizer
    if q.kind != "vq":
        raise ExportError(f"model.quantizer.kind={q.kind}: diffusers' VQModel has only a nearest-code vector "
                          "quantizer; LFQ and FSQ have no diffusers counterpart")
    if q.codebook_dim is not None and q.codebook_dim != cfg.z_channels:
        raise ExportError(f"model.quantizer.codebook_dim={q.codebook_dim} (projected {cfg.z_channels}-d codes): "
                          "VQModel's codebook has the latent's width and no projection in or out")
    if q.use_cosine_sim:
        raise ExportError("model.quantizer.use_cosine_sim=true: VQModel picks codes by Euclidean distance, not "
                          "by cosine similarity of l2-normalised codes")


def vq_model(ae: VQAutoencoder, cfg: VQGANConfig) -> VQModel:
    """The VQModel of `ae`: same architecture, the same weights key for key, the codebook as
    `quantize.embedding.weight`."""
    levels = len(cfg.block_out_channels)
    model = VQModel(in_channels=ae.encoder.conv_in.in_channels, out_channels=ae.decoder.conv_out.out_channels,
                    down_block_types=("DownEncoderBlock2D",) * levels, up_block_types=("UpDecoderBlock2D",) * levels,
                    block_out_channels=tuple(cfg.block_out_channels), layers_per_block=cfg.layers_per_block,
                    norm_num_groups=cfg.norm_num_groups, mid_block_add_attention=cfg.mid_block_attention,
                    latent_channels=cfg.z_channels, num_vq_embeddings=ae.codebook_size, vq_embed_dim=cfg.z_channels,
                    scaling_factor=1.0)
    if ae.pending is not None:
        ae.apply_pending()  # a codebook update not yet applied belongs to the weights
    weights = {k: v for k, v in ae.state_dict().items() if k.split(".")[0] in
               ("encoder", "quant_conv", "post_quant_conv", "decoder")}
    weights["quantize.embedding.weight"] = ae.quantizer.codebook.detach().reshape(ae.codebook_size, cfg.z_channels)
    model.load_state_dict(weights)  # strict: every VQModel key is given
    return model.eval()


def to_diffusers(task: VQGANTask, cfg: VQGANConfig, out: Path) -> Exported:
    """OUT = a VQModel folder: `encode(x).latents` is genforge's pre-quantization z, `decode(z)` quantizes and
    decodes as genforge does; token ids are VQModel.quantize's indices."""
    check_maps(cfg)
    vq_model(task.autoencoder, cfg).save_pretrained(out, safe_serialization=True)
    return Exported({".": "VQModel"}, details={"codebook_size": task.autoencoder.codebook_size},
                    notes=["scaling_factor is 1.0: genforge uses the token ids, not scaled latents"])
