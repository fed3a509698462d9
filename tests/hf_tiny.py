"""Tiny Hugging Face models built offline: a GPT-2 language model and a BERT classifier
with a word-level tokenizer trained here in milliseconds, saved with ``save_pretrained``
into a folder or into a Hugging Face cache layout (``hub/models--ORG--NAME/snapshots/REV``
with ``refs/main``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "big", "small", "red", "blue", "and"]


def tokenizer(bert: bool = False):
    """A word-level tokenizer over WORDS (PreTrainedTokenizerFast)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] if bert else ["<pad>", "<unk>", "<eos>"]
    vocab = {t: i for i, t in enumerate(special + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=special[1]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if bert:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                       cls_token="[CLS]", sep_token="[SEP]")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    n = len(WORDS) + 3
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=n,
                        bos_token_id=2, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).eval()


def bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(WORDS) + 4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=3,
                        id2label={0: "neg", 1: "mid", 2: "pos"}, label2id={"neg": 0, "mid": 1, "pos": 2},
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
    return BertForSequenceClassification(config).eval()


def t5():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=len(WORDS) + 3, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2,
                      dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=2)
    return T5ForConditionalGeneration(config).eval()


def vit():
    """A ViT classifier on 32 × 32 pictures whose image processor normalises with 0.5, not ImageNet's."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, num_labels=3, id2label={0: "a", 1: "b", 2: "c"},
                       label2id={"a": 0, "b": 1, "c": 2}, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ViTForImageClassification(config).eval()


def save(kind: str, folder: Path) -> Path:
    """``save_pretrained`` of the tiny model ``kind`` ("gpt2", "bert", "t5" or "vit") and its
    tokenizer (or, for "vit", its image processor)."""
    model = {"gpt2": gpt2, "bert": bert, "t5": t5, "vit": vit}[kind]()
    model.save_pretrained(folder)
    if kind == "vit":
        from transformers import ViTImageProcessor

        ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3,
                          image_std=[0.5] * 3).save_pretrained(folder)
    else:
        tokenizer(bert=kind == "bert").save_pretrained(folder)
    return folder


def save_in_cache(kind: str, hf_home: Path, repo: str = "tiny-org/tiny-gpt2", rev: str = "0" * 40) -> Path:
    """The model in the cache layout huggingface_hub reads offline; returns the snapshot folder."""
    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / rev
    save(kind, snapshot)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(rev)
    return snapshot


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def offline_home(monkeypatch, home: Path) -> Path:
    """Make ``home`` the Hugging Face home (``HF_HOME``), offline, for the rest of the test
    (``monkeypatch``: pytest's); huggingface_hub's constants, read once at its import, too."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home
