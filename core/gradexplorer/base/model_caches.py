"""The folders where model hubs keep what they downloaded: the Hugging Face cache and
torch's hub cache.

Models load from these folders (``hf:`` and ``timm:`` models from the Hugging Face cache,
torchvision's and some timm weights from torch's), and their files are shared by every
program on the machine: a snapshot's ``model.safetensors`` is a link to a blob that other
revisions and other programs read too. No output of gradexplorer is ever written inside
them (:func:`model_cache_holding`, which the one writer asks, ``gradexplorer.base.file_write``).

The environment is read at every call, not once at import as huggingface_hub and torch do,
so that a notebook or a test that sets it later is obeyed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["hf_home", "hub_cache_dir", "model_cache_holding", "model_caches", "torch_hub_dir"]


def _xdg_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")).expanduser()


def hf_home() -> Path:
    """``HF_HOME``, else ``XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``: the
    Hugging Face folder (the hub cache, the token, transformers' copies of models' own code)."""
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    return _xdg_cache() / "huggingface"


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment on every call.

    ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub`` (huggingface_hub's own rule; it reads the variables once,
    at import).
    """
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return hf_home() / "hub"


def torch_hub_dir() -> Path:
    """torch's hub folder (its ``checkpoints/`` holds torchvision's and timm's downloaded
    weights): ``torch.hub.get_dir()`` when torch is imported (a program may have moved it with
    ``torch.hub.set_dir``), else ``TORCH_HOME/hub``, else ``XDG_CACHE_HOME/torch/hub``."""
    torch = sys.modules.get("torch")
    hub = getattr(torch, "hub", None) if torch is not None else None
    if hub is not None:
        return Path(hub.get_dir()).expanduser()
    if os.environ.get("TORCH_HOME"):
        return Path(os.environ["TORCH_HOME"]).expanduser() / "hub"
    return _xdg_cache() / "torch" / "hub"


def model_caches() -> list[tuple[str, Path]]:
    """Every model cache, named for messages: the Hugging Face folder and its hub cache
    (which may be elsewhere), transformers' older cache variable, and torch's hub folder."""
    caches = [("the Hugging Face cache", hub_cache_dir()), ("the Hugging Face folder", hf_home())]
    if os.environ.get("TRANSFORMERS_CACHE"):
        caches.append(("the transformers cache", Path(os.environ["TRANSFORMERS_CACHE"]).expanduser()))
    caches.append(("torch's hub cache", torch_hub_dir()))
    return caches


def _inside(path: str, folder: str) -> bool:
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:  # another drive (Windows), or a relative path against an absolute one
        return False


def model_cache_holding(path: str | os.PathLike[str]) -> tuple[str, Path] | None:
    """The model cache ``path`` lies in, once every link in it is resolved, or None.

    Parameters
    ----------
    path : str or os.PathLike
        A file that may not exist yet; its folders' links (and its own, when it is one)
        are followed, so that a link into a cache, or a snapshot's link to its blob, counts.

    Returns
    -------
    (str, Path) or None
        The cache's name in words and its folder.
    """
    real = os.path.realpath(os.path.expanduser(os.fspath(path)))
    for name, folder in model_caches():
        if _inside(real, os.path.realpath(folder)):
            return name, folder
    return None
