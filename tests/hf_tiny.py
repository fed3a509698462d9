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


def save(kind: str, folder: Path) -> Path:
    """``save_pretrained`` of the tiny model ``kind`` ("gpt2" or "bert") and its tokenizer."""
    model = gpt2() if kind == "gpt2" else bert()
    model.save_pretrained(folder)
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
