"""torchvision's pretrained weights: the catalogue, the local cache, safe loading, downloads.

torchvision's own loader (``torch.hub.load_state_dict_from_url``) unpickles cached files with
``weights_only=False`` and checks their hash only when it downloads them, so a file planted in
the cache would run code. Everything here reads weight files with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast
from urllib.error import URLError
from urllib.request import Request, urlopen

import torch
import torchvision
from torchvision.models import WeightsEnum

from gradexplorer.base.errors import CaptureCancelled, ModelLoadError, WeightsUnavailable
from gradexplorer.files.pickle_scan import refusal, short_reason

# torch.hub's rule: "resnet18-f37072fd.pth" carries the first hex digits of its SHA-256.
_HASH_PREFIX = re.compile(r"-([a-f0-9]*)\.")
_CHUNK = 1 << 20
_TIMEOUT_S = 30.0

_TASK_BY_PACKAGE = {
    "torchvision.models.segmentation": "segmentation",
    "torchvision.models.video": "video",
    "torchvision.models.detection": "detection",
    "torchvision.models.optical_flow": "optical_flow",
    "torchvision.models.quantization": "quantized",
}


@dataclass(frozen=True)
class ModelInfo:
    """One torchvision architecture and the weights it can load.

    Attributes
    ----------
    name : str
        The name ``torchvision.models.get_model`` takes ("resnet18").
    task : str
        ``"classification"``, ``"segmentation"``, ``"video"``, ``"detection"``,
        ``"optical_flow"`` or ``"quantized"``.
    weights : tuple of str
        Every weights enum member, full names ("ResNet18_Weights.IMAGENET1K_V1").
    default_weights : str or None
        The member ``"DEFAULT"`` stands for, full name.
    cached : tuple of str
        The members of ``weights`` whose file is in the local cache.
    """

    name: str
    task: str
    weights: tuple[str, ...]
    default_weights: str | None
    cached: tuple[str, ...]


def weights_name(weights: WeightsEnum) -> str:
    """The full name of a weights enum member, e.g. ``"ResNet18_Weights.IMAGENET1K_V1"``.

    Parameters
    ----------
    weights : WeightsEnum
        A torchvision weights enum member.

    Returns
    -------
    str
        ``"<EnumClass>.<MEMBER>"``, the form ``resolve_weights`` accepts back.
    """
    return f"{type(weights).__name__}.{weights.name}"


def model_task(model_name: str) -> str:
    """The task of a torchvision model, from the package its builder lives in.

    Parameters
    ----------
    model_name : str
        A name from ``torchvision.models.list_models()``.

    Returns
    -------
    str
        ``"segmentation"``, ``"video"``, ``"detection"``, ``"optical_flow"``,
        ``"quantized"`` or ``"classification"``.
    """
    module = torchvision.models.get_model_builder(model_name).__module__
    for package, task in _TASK_BY_PACKAGE.items():
        if module == package or module.startswith(package + "."):
            return task
    return "classification"


def model_weights_enum(model_name: str) -> type[WeightsEnum] | None:
    """The weights enum class of a torchvision model, or None when it has none."""
    try:
        return torchvision.models.get_model_weights(model_name)
    except (ValueError, KeyError):
        return None


def cache_dir() -> Path:
    """The folder torchvision keeps downloaded weights in.

    Returns
    -------
    Path
        ``torch.hub.get_dir()/checkpoints``; ``$TORCH_HOME`` moves it (read on every call).
    """
    return Path(torch.hub.get_dir()) / "checkpoints"


def weights_file(weights: WeightsEnum) -> Path:
    """Where the file of ``weights`` lies (or would lie) in the cache.

    Parameters
    ----------
    weights : WeightsEnum
        A torchvision weights enum member.

    Returns
    -------
    Path
        ``cache_dir() / <basename of weights.url>``, the same file torch.hub uses.
    """
    return cache_dir() / os.path.basename(weights.url)


def is_cached(weights: WeightsEnum) -> bool:
    """Whether the file of ``weights`` is in the cache (its contents are not checked)."""
    return weights_file(weights).is_file()


def model_catalog() -> list[ModelInfo]:
    """Every torchvision architecture, with its weights and which of them are cached.

    Builds no model and reads no file, so it is cheap enough to call when a dialog opens.

    Returns
    -------
    list of ModelInfo
        Sorted by name, one per ``torchvision.models.list_models()`` entry.
    """
    folder = cache_dir()
    try:
        present = set(os.listdir(folder))
    except OSError:
        present = set()
    catalog = []
    for name in sorted(torchvision.models.list_models()):
        enum_cls = model_weights_enum(name)
        # An Enum class iterates over its members (aliases such as DEFAULT left out).
        members = list(cast("Iterable[WeightsEnum]", enum_cls)) if enum_cls is not None else []
        default = getattr(enum_cls, "DEFAULT", None) if enum_cls is not None else None
        catalog.append(
            ModelInfo(
                name=name,
                task=model_task(name),
                weights=tuple(weights_name(w) for w in members),
                default_weights=weights_name(default) if default is not None else None,
                cached=tuple(
                    weights_name(w) for w in members if os.path.basename(w.url) in present
                ),
            )
        )
    return catalog


def resolve_weights(model_name: str, weights_str: str | None) -> WeightsEnum | None:
    """Turn the user's weights choice into a torchvision weights enum member.

    Parameters
    ----------
    model_name : str
        A torchvision model name ("resnet18").
    weights_str : str or None
        ``None``, ``""`` or ``"none"`` for random initialisation; ``"DEFAULT"``; a member name
        (``"IMAGENET1K_V1"``); or a full name (``"ResNet18_Weights.IMAGENET1K_V1"``).
        Case-insensitive.

    Returns
    -------
    WeightsEnum or None
        The member, or ``None`` for random initialisation.

    Raises
    ------
    ModelLoadError
        When the model has no weights, or none by that name; the message lists the choices.
    """
    if weights_str is None or weights_str.strip().lower() in ("", "none"):
        return None
    enum_cls = model_weights_enum(model_name)
    if enum_cls is None:
        raise ModelLoadError(
            f"torchvision has no pretrained weights for '{model_name}'.",
            "Leave the weights empty for random initialisation.",
        )
    text = weights_str.strip()
    member = text
    if "." in text:
        class_name, _, member = text.rpartition(".")
        if class_name.lower() != enum_cls.__name__.lower():
            raise ModelLoadError(
                f"The weights '{text}' belong to {class_name}, not to '{model_name}'.",
                f"Choose one of: {_choices(enum_cls)}.",
            )
    by_name = {key.upper(): value for key, value in enum_cls.__members__.items()}
    found = by_name.get(member.upper())
    if found is None:
        raise ModelLoadError(
            f"'{model_name}' has no weights called '{text}'.",
            f"Choose one of: {_choices(enum_cls)}.",
        )
    return found


def _choices(enum_cls: type[WeightsEnum]) -> str:
    return ", ".join(["DEFAULT", *(member.name for member in enum_cls)])


def load_state_dict_file(path: Path) -> Mapping[str, torch.Tensor]:
    """Read a weights file with ``weights_only=True``: nothing in it can run code.

    Parameters
    ----------
    path : Path
        A file written by ``torch.save(model.state_dict(), path)``.

    Returns
    -------
    dict of str to Tensor
        The state dict, on the CPU (quantized models' also hold dtypes and tuples).

    Raises
    ------
    ModelLoadError
        When the file is missing, damaged, not a state dict, or would need to run code to load.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"The weights file '{path}' does not exist.", "Check the path.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # damaged and hostile files raise many different types
        refused = refusal(path, exc)
        reason = refused.reason() if refused is not None else short_reason(exc)
        raise ModelLoadError(
            f"The weights file '{path}' cannot be loaded safely: {reason}",
            "Delete it and download it again, or replace it with a genuine copy.",
        ) from exc
    # Quantized models' state dicts also hold dtypes and packed-parameter tuples, so only the
    # keys are checked here; load_state_dict checks the values against the model.
    if not (
        isinstance(state, Mapping)
        and state
        and all(isinstance(key, str) for key in state)
        and any(isinstance(value, torch.Tensor) for value in state.values())
    ):
        raise ModelLoadError(
            f"The weights file '{path}' does not hold a state dict (it holds a "
            f"{type(state).__name__}).",
            "Delete it and download it again, or replace it with a genuine copy.",
        )
    return state


def load_cached_state_dict(weights: WeightsEnum) -> Mapping[str, torch.Tensor]:
    """Read the cached file of ``weights`` safely, without downloading.

    Raises
    ------
    WeightsUnavailable
        When the file is not cached.
    ModelLoadError
        When it is cached but cannot be loaded safely.
    """
    path = weights_file(weights)
    if not path.is_file():
        raise _unavailable(weights, "the file is not in the cache")
    return load_state_dict_file(path)


def fetch_weights(
    weights: WeightsEnum,
    progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Download the file of ``weights`` into the cache, unless it is already there.

    The file is written under a temporary name in the cache folder and renamed once complete
    and its hash checked, so an interrupted download never leaves a half file behind.

    Parameters
    ----------
    weights : WeightsEnum
        A torchvision weights enum member.
    progress : callable, optional
        Called as ``progress(done_bytes, total_bytes)`` after each chunk; ``total_bytes`` is 0
        when the server does not say.
    cancel : threading.Event, optional
        Checked between chunks; when set, the download stops and the partial file is removed.

    Returns
    -------
    Path
        The cached file, ``weights_file(weights)``.

    Raises
    ------
    WeightsUnavailable
        When the download fails (offline, server error, hash mismatch, cache not writable);
        the message names the file, the cache folder and how to supply a local copy.
    CaptureCancelled
        When ``cancel`` was set.
    """
    target = weights_file(weights)
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unavailable(weights, f"the cache folder cannot be created ({exc})") from exc
    request = Request(weights.url, headers={"User-Agent": "gradexplorer"})
    try:
        response = urlopen(request, timeout=_TIMEOUT_S)
    except (URLError, OSError, ValueError) as exc:
        raise _unavailable(weights, f"the download failed ({_url_reason(exc)})") from exc
    with response:
        total = int(response.headers.get("Content-Length") or 0)
        try:
            fd, partial = tempfile.mkstemp(
                dir=target.parent, prefix=f".{target.name}.", suffix=".partial"
            )
        except OSError as exc:
            raise _unavailable(weights, f"the cache folder is not writable ({exc})") from exc
        try:
            with os.fdopen(fd, "wb") as out:
                done, digest = _copy_chunks(weights, response, out, total, progress, cancel)
            _check_download(weights, target, done, total, digest)
            os.replace(partial, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
            raise
    return target


def _copy_chunks(
    weights: WeightsEnum,
    response: IO[bytes],
    out: IO[bytes],
    total: int,
    progress: Callable[[int, int], None] | None,
    cancel: threading.Event | None,
) -> tuple[int, str]:
    # Bytes copied and their SHA-256, reporting progress and checking cancel per chunk.
    digest = hashlib.sha256()
    done = 0
    if progress is not None:
        progress(0, total)
    while True:
        if cancel is not None and cancel.is_set():
            raise CaptureCancelled()
        try:
            chunk = response.read(_CHUNK)
        except (OSError, ValueError) as exc:  # includes http.client errors, timeouts
            raise _unavailable(weights, f"the download broke off ({exc})") from exc
        if not chunk:
            return done, digest.hexdigest()
        out.write(chunk)
        digest.update(chunk)
        done += len(chunk)
        if progress is not None:
            progress(done, total)


def _check_download(weights: WeightsEnum, target: Path, done: int, total: int, digest: str) -> None:
    # Complete, and the hash prefix torch.hub puts in the file name matches.
    if total and done != total:
        raise _unavailable(weights, f"the download stopped at {done} of {total} bytes")
    expected = _HASH_PREFIX.search(target.name)
    if expected and not digest.startswith(expected.group(1)):
        raise _unavailable(
            weights,
            f"the downloaded file is damaged (SHA-256 does not start with {expected.group(1)})",
        )


def _url_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason) if reason is not None else str(exc)


def _unavailable(weights: WeightsEnum, reason: str) -> WeightsUnavailable:
    target = weights_file(weights)
    return WeightsUnavailable(
        f"The pretrained weights {weights_name(weights)} ({target.name}) are not available: "
        f"{reason}. gradexplorer looks for them in the cache folder {target.parent}.",
        f"Connect to the internet and try again, or copy {target.name} to {target}, "
        f"or pass --weights /path/to/{target.name}.",
        weights=weights_name(weights), cache_file=str(target),
    )
