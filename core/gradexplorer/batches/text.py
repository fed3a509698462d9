"""Text in: samples tokenised with the model's own tokenizer (``--text``), and the token
strings that the views, ``inspect`` and the CSV show in place of positions.

A batch of texts is padded to its longest sample: on the right for most models, on the
left for a causal language model (so that the last position is every sample's last token,
the one whose next token the default target reads), with ``position_ids`` that count the
real tokens only, as generation does. The padding is said in the batch's preprocessing.

A causal language model whose forward takes ``labels`` also gets the text as its per-token
labels (padding ignored): its output then carries its own loss, the target ``sum@loss``.
A text of one token has no next token to score: it gets no labels (its loss would be NaN),
and the preprocessing says so; the default target reads the logits.

Text is bounded before it is read or tokenised: a ``.txt`` file is read only when its size
fits the memory budget as tokens (never whole when it does not: a 3 GB file is refused by
its size), and a batch is tokenised only when its padded tokens, counted from the longest
sample's bytes, fit it too (:data:`BYTES_PER_TOKEN`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gradexplorer.base import tensor_memory
from gradexplorer.base.errors import BatchError
from gradexplorer.base.units import format_bytes
from gradexplorer.capturing.inputs import Batch, ModelInputs
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.models.tokenizer import takes_a_tokenizer

__all__ = ["BYTES_PER_TOKEN", "TEXT_FILE_SUFFIX", "expand_texts", "load_text", "token_strings", "predicted_tokens"]

TEXT_FILE_SUFFIX = ".txt"
#: What one position of a padded batch of text holds while it is loaded: its ids, mask,
#: positions and labels (int64 each), the tokenizer's encoding of it and its token string
#: (about 370 bytes each on a GPT-2 tokenizer), rounded up.
BYTES_PER_TOKEN = 512
# Each byte of text is at most one token; a tokenizer adds a few of its own (CLS, SEP, BOS).
_ADDED_TOKENS = 16
# The largest text file read when the free memory cannot be told.
_TEXT_FILE_LIMIT = 64 << 20


def _budget_words(limit: int, budget: int | None) -> str:
    return f"{format_bytes(limit)} ({'set by --memory-budget' if budget is not None else 'half of the free RAM'})"


def _read_text_file(path: Path, budget: int | None) -> str:
    """The text of ``path``, read only when its size fits the memory budget as tokens
    (never more than that many bytes, whatever the file says of its size)."""
    limit = tensor_memory.read_budget(budget)
    most = _TEXT_FILE_LIMIT if limit is None else max(1, limit // BYTES_PER_TOKEN)
    fix = "give fewer or shorter samples, or raise --memory-budget if this machine has the memory."
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(most + 1) if size <= most else b""
    if size > most or len(data) > most:
        shown = max(size, len(data))
        room = (f"as tokens it could take {format_bytes(shown * BYTES_PER_TOKEN)}, but the memory budget is "
                f"{_budget_words(limit, budget)}" if limit is not None
                else f"gradexplorer reads text files up to {format_bytes(most)}")
        raise BatchError(f"the text file '{path}' is {format_bytes(shown)}: {room};", fix)
    return data.decode("utf-8")


def _check_batch_fits(samples: list[str], budget: int | None) -> None:
    """Refuse a batch whose padded tokens cannot fit the memory budget, before tokenising:
    every sample padded to the longest, each byte a token at most."""
    limit = tensor_memory.read_budget(budget)
    if limit is None:
        return
    longest = max(len(s.encode("utf-8")) for s in samples) + _ADDED_TOKENS
    need = len(samples) * longest * BYTES_PER_TOKEN
    if need > limit:
        raise BatchError(
            f"{len(samples):,} text samples padded to the longest ({longest - _ADDED_TOKENS:,} bytes) could take "
            f"{format_bytes(need)} as tokens, but the memory budget is {_budget_words(limit, budget)};",
            "give fewer or shorter samples, or raise --memory-budget if this machine has the memory.")


def expand_texts(texts: Sequence[str], memory_budget: int | None = None) -> list[str]:
    """The samples of ``texts``: each text is one, an existing ``.txt`` file one per
    non-empty line (read only when its size fits ``memory_budget`` as tokens; by default
    half the free RAM)."""
    out: list[str] = []
    for text in texts:
        path = Path(text).expanduser()
        if text.lower().endswith(TEXT_FILE_SUFFIX) and path.is_file():
            try:
                lines = _read_text_file(path, memory_budget).splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise BatchError(f"the text file '{path}' cannot be read: {exc};",
                                 "give a UTF-8 text file, one sample a line.") from exc
            found = [line for line in lines if line.strip()]
            if not found:
                raise BatchError(f"the text file '{path}' has no text;", "write one sample a line.")
            out.extend(found)
        else:
            out.append(text)
    if not out or not all(t.strip() for t in out):
        raise BatchError("an empty text was given;", "give some words: --text \"the cat sat\".")
    return out


def load_text(texts: Sequence[str], model: LoadedModel | None, memory_budget: int | None = None) -> Batch:
    """Tokenise ``texts`` into a batch of keyword arguments (``input_ids``,
    ``attention_mask``, and ``position_ids`` when left-padded).

    Parameters
    ----------
    texts : sequence of str
        One sample each; an existing ``.txt`` file gives one sample per line.
    model : LoadedModel
        Its ``tokenizer`` tokenises; its ``text_padding`` says which side is padded.
    memory_budget : int, optional
        Bytes the text may take as tokens (``--memory-budget``); by default half the free RAM.

    Returns
    -------
    Batch
        ``tensor`` is ``input_ids`` ``(B, T)``; ``tokens`` the token strings of each sample.
        For a causal language model whose forward takes ``labels``: the ids as its
        per-token labels, ``-100`` at padding.

    Raises
    ------
    BatchError
        No model, a model without a tokenizer (or whose tokenizer files cannot be read, with
        the reason), an empty text, a text file or a batch too large for the memory budget.
    """
    if model is None or getattr(model, "tokenizer", None) is None:
        name = f"'{model.spec}'" if model is not None else "this model"
        problem = getattr(model, "tokenizer_problem", None)
        if problem:
            raise BatchError(f"{name} has tokenizer files, but {problem}; text cannot be turned into its input;",
                             "download or save the model with a working tokenizer again, or give a .pt file of "
                             "token ids with --input.")
        if model is not None and takes_a_tokenizer(model.spec):  # a factory or a checkpoint
            raise BatchError(
                f"{name} came without a tokenizer, so text cannot be turned into its input;",
                "name its tokenizer with --tokenizer FOLDER (the folder tokenizer.save_pretrained wrote, or "
                "hf:ORG/NAME), or give a .pt file of token ids with --input.",
            )
        raise BatchError(
            f"{name} has no tokenizer, so text cannot be turned into its input;",
            "use a Hugging Face model saved with its tokenizer (hf:ORG/NAME or a save_pretrained folder "
            "holding tokenizer.json), or give a .pt file of token ids with --input.",
        )
    samples = expand_texts(texts, memory_budget)
    _check_batch_fits(samples, memory_budget)
    side = model.text_padding
    tok = _padding_tokenizer(model.tokenizer, side)
    try:
        enc = tok(samples, return_tensors="pt", padding=True)
    except Exception as exc:
        raise BatchError(f"the tokenizer refused the text: {type(exc).__name__}: {exc};",
                         "check the text, or give token ids in a .pt file with --input.") from exc
    ids = enc["input_ids"]
    mask = enc.get("attention_mask")
    kwargs: dict[str, Any] = {"input_ids": ids}
    if mask is not None:
        kwargs["attention_mask"] = mask
    padded = mask is not None and bool((mask == 0).any())
    if side == "left" and mask is not None and _takes(model, "position_ids"):
        kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
    start = _decoder_start(model)
    if start is not None:
        # An encoder-decoder reads the text in its encoder; its decoder starts from its start
        # token, so the output is the first token it would write.
        kwargs["decoder_input_ids"] = torch.full((ids.shape[0], 1), start, dtype=ids.dtype)
    causal = model.task == "language_model" and side == "left" and _takes(model, "labels")
    # One token has no next token to score: its loss would be NaN (a mean over nothing), so
    # the model gets no labels and the output no loss; the target reads the logits.
    labelled = causal and ids.shape[1] > 1
    if labelled:
        # A causal language model's per-token labels are the text itself: the model
        # shifts them, scoring each position's prediction of the next token (its own
        # loss, the output's 'loss'); padding is -100, which the loss ignores.
        kwargs["labels"] = ids.masked_fill(mask == 0, -100) if mask is not None else ids.clone()
    tokens = [token_strings(tok, row, None if mask is None else m) for row, m in
              zip(ids.tolist(), mask.tolist() if mask is not None else [None] * len(samples))]
    lengths = [int(m.sum()) for m in mask] if mask is not None else [ids.shape[1]] * len(samples)
    how = f"tokenised by {type(tok).__name__}, " + (
        f"padded on the {side} to {ids.shape[1]} tokens (lengths {', '.join(map(str, lengths))})" if padded
        else f"{ids.shape[1]} token{'s' if ids.shape[1] != 1 else ''}, no padding")
    if labelled:
        how += "; labels: the text's own tokens, each predicted from those before (the output's 'loss')"
    elif causal:
        how += ("; no labels: one token has no next token to score, so the output has no 'loss' "
                "(the target reads the logits)")
    if start is not None:
        how += f"; the decoder starts from its start token (id {start})"
    names = [_short(s) for s in samples]
    n = len(samples)
    return Batch(
        tensor=ids, labels=None, names=names,
        source=f"{n} text{'s' if n != 1 else ''}", preprocessing=how,
        inputs=ModelInputs((), kwargs), tokens=tokens,
    )


def _padding_tokenizer(tokenizer: Any, side: str) -> Any:
    """A tokenizer that pads on ``side`` and has a padding token, the caller's left as it
    was: its ``padding_side`` and ``pad_token`` are set on a copy (the tokenizer may be the
    user's own, given to ``gradexplorer.explore``), and padding also switches its backend's
    padding on."""
    tok = copy.deepcopy(tokenizer)
    if tok.pad_token is None:
        # GPT-2 has no padding token; any id works under the attention mask.
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    tok.padding_side = side
    return tok


def token_strings(tokenizer: Any, ids: Sequence[int], mask: Sequence[int] | None = None) -> list[str]:
    """Each id as the text it stands for (spaces shown as they are; padding as ``[pad]``)."""
    out = []
    for i, token_id in enumerate(ids):
        if mask is not None and not mask[i]:
            out.append("[pad]")
            continue
        text = tokenizer.decode([int(token_id)])
        out.append(text if text.strip() else repr(text).strip("'") or "∅")
    return out


def predicted_tokens(capture: Any, tokenizer: Any, target: Any) -> list[str] | None:
    """The token each sample's logits predict at the target's position (a causal language
    model's next token), or None when the capture is not of one position of per-token logits."""
    y = getattr(capture, "output", None)
    if tokenizer is None or not isinstance(y, torch.Tensor) or y.dim() != 3 or target.position is None:
        return None
    ids = y[:, target.position, :].argmax(dim=-1).tolist()
    return [tokenizer.decode([int(i)]) for i in ids]


def _decoder_start(model: LoadedModel) -> int | None:
    """The id an encoder-decoder's decoder starts from, or None for other models."""
    config = getattr(model.module, "config", None)
    if not getattr(config, "is_encoder_decoder", False) or not _takes(model, "decoder_input_ids"):
        return None
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(config, "pad_token_id", None)
    return int(start) if isinstance(start, int) else None


def _takes(model: LoadedModel, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.module.forward).parameters
    except (TypeError, ValueError):
        return False


def _short(text: str, n: int = 32) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
