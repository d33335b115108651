"""A tiny transformers CLIPModel saved like a hub checkpoint, for the tests of what takes a pretrained CLIP folder
(model.embedder.source=clip_pretrained of the DALL·E 2 decoder and prior)."""

import json
from pathlib import Path

import torch
from transformers import CLIPConfig, CLIPModel, CLIPTokenizer


def pretrained_clip_folder(root: Path) -> Path:
    """A tiny transformers CLIPModel (2 layers each tower) with a byte-pair tokenizer, saved like a hub checkpoint."""
    vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
    vocab.update({f"{c}</w>": len(vocab) + i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")})
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    root.mkdir(parents=True)
    (root / "vocab.json").write_text(json.dumps(vocab))
    (root / "merges.txt").write_text("#version: 0.2\n")
    CLIPTokenizer(vocab=str(root / "vocab.json"), merges=str(root / "merges.txt")).save_pretrained(root)
    torch.manual_seed(0)
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=16, bos_token_id=vocab["<|startoftext|>"],
                eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"])
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=16,
                  patch_size=8)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=24)).save_pretrained(root)
    return root
