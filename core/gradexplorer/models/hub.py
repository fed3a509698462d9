"""The Hugging Face hub as both ``hf:`` and ``timm:`` models use it: the cache folder, the
offline switch, and the progress of a download.

huggingface_hub reads ``HF_HOME``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` once, at its
import; these read them at every call, so that a notebook or a test that sets them later
is obeyed, and the model browser lists the folder the loaders read. The cache folder itself
is ``gradexplorer.base.model_caches.hub_cache_dir``: the writer of output files asks it too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gradexplorer.base.model_caches import hub_cache_dir

__all__ = ["hub_cache_dir", "hub_offline", "progress_class"]


def hub_offline() -> bool:
    """Whether the Hugging Face hub is to be left alone (``HF_HUB_OFFLINE`` or
    ``TRANSFORMERS_OFFLINE``, read now)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def progress_class(progress: Callable[[int, int], None] | None) -> Any:
    """A tqdm class for huggingface_hub's ``tqdm_class`` that draws nothing and reports the
    bytes written to ``progress(done, total)``.

    huggingface_hub hands it every bar of a download: one counting files (unit ``it``),
    one counting the bytes written to the cache (unit ``B``, total = the files' sizes),
    and, for Xet storage, one estimating network bytes ("Downloading bytes", a guessed
    total that grows), which is left out. A disabled tqdm counts nothing (its ``update``
    returns at once, before even ``unit`` is set), so the bytes are counted here.
    """
    from tqdm.auto import tqdm  # type: ignore[import-untyped]  # tqdm ships no types; no stub package in dev

    class Reporting(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._bytes_written = (kwargs.get("unit") == "B"
                                   and not str(kwargs.get("desc") or "").startswith("Downloading bytes"))
            self._done = int(kwargs.get("initial") or 0)
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            if progress is not None and self._bytes_written:
                progress(self._done, int(self.total or 0))
            return None

    return Reporting
