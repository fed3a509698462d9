"""A tokenizer named apart from its model (``--tokenizer``), for a model that came without
one: a factory or checkpoint that builds a transformers model, a model of the user's own
that reads token ids.

A tokenizer is a Hugging Face one, from a folder that ``tokenizer.save_pretrained`` wrote
(``tokenizer.json``, ``tokenizer_config.json``, ``vocab.txt``...) or by repository name,
``hf:ORG/NAME`` (the cache first, downloaded unless offline, as ``hf:`` models are:
``gradexplorer.models.hf_models.resolve_folder``). A tokenizer's own Python code runs only
with trust.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gradexplorer.base.errors import ModelLoadError
from gradexplorer.models.factories import parse_factory
from gradexplorer.models.files import looks_like_path
from gradexplorer.models.loaded_model import LoadedModel

__all__ = ["load_tokenizer", "takes_a_tokenizer", "with_tokenizer"]

#: Files one of which a folder written by ``tokenizer.save_pretrained`` holds.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model")


def load_tokenizer(spec: str, *, trust: bool = False,
                   progress: Callable[[int, int], None] | None = None) -> Any:
    """The Hugging Face tokenizer that ``spec`` names.

    Parameters
    ----------
    spec : str
        A folder holding a saved tokenizer, or ``hf:ORG/NAME`` / ``hf:FOLDER`` (a model's
        repository or ``save_pretrained`` folder, whose tokenizer is taken).
    trust : bool
        Allow the tokenizer's own code (``trust_remote_code``).
    progress : callable, optional
        ``progress(done_bytes, total_bytes)`` while files download.

    Returns
    -------
    transformers.PreTrainedTokenizerBase

    Raises
    ------
    ModelLoadError
        transformers missing, no such folder or repository, no tokenizer in it, or one
        that transformers cannot read.
    """
    # Imported here: hf_models brings torchvision's weight tables, which the window's Model
    # panel (it asks takes_a_tokenizer) should not pay for on the UI thread.
    from gradexplorer.models.hf_models import INSTALL_HINT, hf_spec, resolve_folder

    named = hf_spec(spec)
    name = named if named is not None else spec.strip()
    if not name:
        raise ModelLoadError("--tokenizer names no tokenizer.",
                             "Give a folder that tokenizer.save_pretrained wrote, or hf:ORG/NAME.")
    try:
        import transformers
    except ImportError:
        raise ModelLoadError("A tokenizer needs the transformers package, which is not installed.",
                             f"Install it with: {INSTALL_HINT}") from None
    folder, _origin = resolve_folder(name, progress, trust)
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ModelLoadError(
            f"'{spec}' holds no tokenizer (none of {', '.join(TOKENIZER_FILES)} in '{folder}').",
            "Give the folder that tokenizer.save_pretrained(...) wrote, or a model repository with its tokenizer.")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust)
    except Exception as exc:
        raise ModelLoadError(
            f"The tokenizer of '{spec}' cannot be read by transformers {transformers.__version__}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            "Check the folder's tokenizer files, or pass --trust if the tokenizer brings code of its own.",
        ) from exc


def with_tokenizer(loaded: LoadedModel, tokenizer: Any) -> LoadedModel:
    """``loaded`` with ``tokenizer`` for its text, and, when its module is a transformers
    model that came from elsewhere than ``hf:`` (a factory), read as an ``hf:`` one is: a
    causal language model padded on the left, its ``top1`` the predicted next token."""
    from gradexplorer.models.hf_models import hf_traits, is_hf_module  # see load_tokenizer

    out = replace(loaded, tokenizer=tokenizer)
    if is_hf_module(loaded.module) and loaded.task == "other":
        traits = hf_traits(loaded.module)
        out = replace(out, task=traits.task, default_target=traits.default_target,
                      text_padding=traits.text_padding,
                      categories=loaded.categories if loaded.categories is not None else traits.categories)
    return out


def takes_a_tokenizer(spec: str) -> bool:
    """Whether the model ``spec`` names comes without a tokenizer that ``--tokenizer`` can
    give it: a factory (``package.module:function``, ``file.py:function``) or a checkpoint
    file. An ``hf:`` model brings its own; torchvision, timm and the demos take no text.

    Parameters
    ----------
    spec : str
        What the user asked to load (``gradexplorer.models.load_model``); nothing is read.
    """
    text = spec.strip()
    if text.lower().startswith(("hf:", "timm:", "demo:", "live:")):
        return False
    return parse_factory(text) is not None or looks_like_path(text, check_disk=False)
