"""A pretrained CLIP (Radford et al. 2021) from a local Hugging Face checkpoint as an ImageEmbedder
(genforge.core.codec): what DALL·E 2's decoder is conditioned on when the embeddings come from OpenAI's or LAION's
CLIP rather than from genforge's own `clip` family."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# CLIP's image normalisation (its preprocessor_config.json, used when the checkpoint has none)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class PretrainedClipEmbedder(nn.Module):
    """transformers' `CLIPModel` + tokenizer from `directory` (offline), frozen. Images in [-1, 1] of any size are
    resized (bicubic, antialiased) to the vision tower's resolution and normalised as CLIP's preprocessing does;
    both towers' projected features are L2-normalised."""

    has_text = True

    def __init__(self, directory: str | Path, max_length: int = 77) -> None:
        super().__init__()
        from transformers import AutoTokenizer, CLIPModel

        self.directory = Path(directory)
        try:
            self.model = CLIPModel.from_pretrained(self.directory, local_files_only=True, dtype=torch.float32)
            self.tokenizer = AutoTokenizer.from_pretrained(self.directory, local_files_only=True)
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot load a CLIP model and tokenizer from {self.directory} "
                             f"({type(err).__name__}: {err})") from None
        self.model.eval().requires_grad_(False)
        self.image_size = int(self.model.config.vision_config.image_size)
        self.embed_dim = int(self.model.config.projection_dim)
        self.text_width = int(self.model.config.text_config.hidden_size)  # of `encode_texts`'s states
        self.max_length = min(max_length, int(self.model.config.text_config.max_position_embeddings))
        mean, std = CLIP_MEAN, CLIP_STD
        preprocessor = self.directory / "preprocessor_config.json"
        if preprocessor.is_file():
            settings = json.loads(preprocessor.read_text())
            mean, std = settings.get("image_mean", mean), settings.get("image_std", std)
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)

    def train(self, mode: bool = True) -> "PretrainedClipEmbedder":
        """Frozen: stays in eval mode."""
        return super().train(False)

    @torch.no_grad()
    def embed_images(self, image: Tensor) -> Tensor:
        """image [B, 3, H, W] in [-1, 1] -> unit-norm [B, D]."""
        x = F.interpolate(image.float(), size=(self.image_size, self.image_size), mode="bicubic",
                          align_corners=False, antialias=True) if image.shape[-1] != self.image_size else image.float()
        x = ((x + 1) / 2 - self.mean) / self.std  # CLIP's normalisation of [0, 1] pixels
        features = self.model.get_image_features(pixel_values=x)
        return F.normalize(getattr(features, "pooler_output", features), dim=-1)

    def tokenize(self, texts: list[str]) -> dict[str, Tensor]:
        """CLIP's token ids and attention mask of captions, padded to the longest."""
        return self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                              return_tensors="pt").to(self.mean.device)

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Captions -> the text transformer's last hidden states [B, L, W_t] and mask bool [B, L] (the text
        encodings DALL·E 2's prior attends to)."""
        tokens = self.tokenize(texts)
        states = self.model.text_model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
        return states.last_hidden_state.float(), tokens["attention_mask"].bool()

    @torch.no_grad()
    def embed_texts(self, texts: list[str]) -> Tensor:
        """Captions -> unit-norm [B, D] (the projected end-of-text token)."""
        tokens = self.tokenize(texts)
        features = self.model.get_text_features(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
        return F.normalize(getattr(features, "pooler_output", features), dim=-1)
