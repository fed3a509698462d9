"""timm models by name (``timm:resnet18``): built by timm, pretrained weights from the
Hugging Face cache through timm's own loader, preprocessing from timm's data config.

timm is optional (``pip install "gradexplorer[timm]"``); nothing here imports it until a
``timm:`` model is asked for. Weights never run code: the cached file is read here, as every
weights file is (``gradexplorer.models.state_dicts.read_weights``: safetensors by its bytes
as tensors, anything else with ``weights_only=True``, its tensors measured against the
memory budget, a refusal named in words), and handed to timm's own loader as a state dict,
so that timm still adapts it to the model (its ``filter_fn``, classifier and input
channels). A model whose weights are cached loads with no network call at all, whatever
``HF_HUB_OFFLINE`` says; one that is not cached is downloaded into the cache (with progress)
unless the hub is offline, then read from there.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gradexplorer.base.errors import GradExplorerError, ModelLoadError, WeightsUnavailable
from gradexplorer.models.hub import hub_cache_dir, hub_offline, progress_class
from gradexplorer.models.input_size import declared_input_shape
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.models.state_dicts import load_state_into, read_weights
from gradexplorer.models.weights import ModelInfo, short_reason

__all__ = [
    "PREFIX",
    "RANDOM_SEED",
    "is_timm_spec",
    "timm_available",
    "hub_cache_dir",
    "hub_offline",
    "cached_weights_file",
    "load_timm",
    "timm_catalog",
]

PREFIX = "timm:"
#: The seed of a random timm model's initialisation: the same spec gives the same model.
RANDOM_SEED = 0
# The files timm's Hugging Face loader looks for, safest first (timm/models/_hub.py).
_HUB_FILES = ("model.safetensors", "pytorch_model.bin")
_INSTALL = 'Install timm: pip install "gradexplorer[timm]" (or pip install timm).'


def is_timm_spec(spec: str) -> bool:
    """Whether ``spec`` names a timm model (``timm:NAME``)."""
    return spec.strip().lower().startswith(PREFIX)


def timm_available() -> bool:
    """Whether timm can be imported (it is an optional dependency)."""
    import importlib.util

    return importlib.util.find_spec("timm") is not None


def cached_weights_file(pretrained_cfg: Any, cache: Path | None = None) -> Path | None:
    """The cached weights file timm would load for ``pretrained_cfg``, or None.

    Parameters
    ----------
    pretrained_cfg : timm PretrainedCfg or dict
        ``timm.models.get_pretrained_cfg(name)`` or a model's ``pretrained_cfg``.
    cache : Path, optional
        The hub cache (default :func:`hub_cache_dir`).

    Returns
    -------
    Path or None
        ``<cache>/models--ORG--NAME/snapshots/<refs/main>/model.safetensors`` (or the
        ``.bin``, or the config's own ``hf_hub_filename``); for weights timm fetches from a
        URL instead, the file in torch's hub cache.
    """
    cfg = _as_dict(pretrained_cfg)
    hub_id = cfg.get("hf_hub_id")
    if hub_id:
        repo, _, revision = str(hub_id).partition("@")
        snapshots = (cache or hub_cache_dir()) / ("models--" + repo.replace("/", "--")) / "snapshots"
        if not revision:
            try:
                revision = (snapshots.parent / "refs" / "main").read_text().strip()
            except OSError:
                return None
        names = [cfg["hf_hub_filename"]] if cfg.get("hf_hub_filename") else list(_HUB_FILES)
        for name in names:
            file = snapshots / revision / name
            if file.is_file():
                return file
        return None
    url = cfg.get("url")
    if url:
        file = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(str(url))
        return file if file.is_file() else None
    return None


def load_timm(
    spec: str,
    *,
    weights: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LoadedModel:
    """Build the timm model ``spec`` names, with its weights and preprocessing.

    Parameters
    ----------
    spec : str
        ``timm:NAME`` or ``timm:NAME.TAG`` (``timm:resnet18``, ``timm:resnet18.a1_in1k``).
    weights : str, optional
        ``None`` or ``"none"``: random initialisation with seed :data:`RANDOM_SEED`;
        ``"DEFAULT"``: timm's pretrained weights, from the Hugging Face cache when they are
        there (no network call), else downloaded unless ``HF_HUB_OFFLINE`` is set; or the
        path of a local state-dict file.
    progress : callable, optional
        ``progress(done_bytes, total_bytes)`` while ``DEFAULT`` weights download.

    Returns
    -------
    LoadedModel
        In eval mode, with the preprocessing of timm's data config, the input shape of its
        ``pretrained_cfg`` and ImageNet class names when the head is ImageNet's.

    Raises
    ------
    ModelLoadError
        timm is not installed, the name is unknown (with close names), or the weights
        file does not fit.
    WeightsUnavailable
        ``DEFAULT`` weights are not cached and the hub is offline or unreachable.
    """
    name = spec.strip()[len(PREFIX):].strip()
    try:
        import timm
    except ImportError as exc:
        raise ModelLoadError(f"'{spec}' needs timm, which is not installed.", _INSTALL) from exc
    if not name or not timm.is_model(name):
        raise _unknown_name(spec, name, timm.list_models())
    _check_tag(timm, spec, name)

    choice = (weights or "").strip()
    default_label = _default_label(timm, name)
    if default_label and choice == default_label:
        choice = "DEFAULT"  # the label this loader gave, handed back (a session's reload)
    notes: list[str] = []
    label: str | None = None
    if choice.lower() in ("", "none"):
        # fork_rng: the user's own random state is left as it was.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(RANDOM_SEED)
            module = _create(timm, spec, name, pretrained=False)
        notes.append(f"random initialisation, seed {RANDOM_SEED}")
    elif choice.upper() == "DEFAULT":
        module, label = _pretrained(timm, spec, name, progress)
        notes.append(f"timm pretrained weights {label}")
    else:
        path = Path(choice).expanduser()
        state = read_weights(path)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(RANDOM_SEED)
            module = _create(timm, spec, name, pretrained=False)
        notes.extend(load_state_into(module, state, path, spec))
        label = f"file:{path}"

    transform, description = _preprocessing(timm, module)
    return LoadedModel(
        module=module.eval(),
        spec=spec.strip(),
        name=name,
        weights=label,
        categories=_categories(timm, module),
        preprocess=transform,
        preprocess_description=description,
        input_shape=declared_input_shape(module),
        task="classification",
        notes=notes,
    )


def timm_catalog() -> list[ModelInfo]:
    """Every timm architecture (task ``"timm"``) with its default weights and whether they
    are cached; empty when timm is not installed. Builds no model, reads no weights file.

    Returns
    -------
    list of ModelInfo
        Names written as specs (``timm:resnet18``); ``default_weights`` the Hugging Face
        repository of timm's default tag (``timm/resnet18.a1_in1k``).
    """
    if not timm_available():
        return []
    import timm

    cache = hub_cache_dir()
    try:
        present = {p.name for p in cache.iterdir()}
    except OSError:
        present = set()
    catalog = []
    for name in timm.list_models():
        cfg = _as_dict(timm.models.get_pretrained_cfg(name))
        hub_id = cfg.get("hf_hub_id")
        default = str(hub_id) if hub_id else (str(cfg["url"]) if cfg.get("url") else None)
        cached: tuple[str, ...] = ()
        if default and hub_id and ("models--" + str(hub_id).partition("@")[0].replace("/", "--")) in present:
            cached = (default,) if cached_weights_file(cfg, cache) is not None else ()
        catalog.append(ModelInfo(name=f"{PREFIX}{name}", task="timm", weights=(),
                                 default_weights=default, cached=cached))
    return catalog


def _check_tag(timm: Any, spec: str, name: str) -> None:
    """Refuse ``NAME.TAG`` whose tag timm does not know, with the tags it does."""
    try:
        timm.models.get_pretrained_cfg(name)
    except Exception:  # noqa: BLE001 - timm raises RuntimeError for a tag it does not know
        arch, _, tag = name.partition(".")
        tags = [t.partition(".")[2] for t in timm.list_pretrained(f"{arch}.*")]
        raise ModelLoadError(
            f"'{tag}' is not a pretrained tag of the timm model '{arch}'.",
            (f"Give one of its tags ({', '.join(tags[:6])}{' ...' if len(tags) > 6 else ''}), e.g. "
             f"{PREFIX}{arch}.{tags[0]}, or {PREFIX}{arch} for its default." if tags
             else f"Give {PREFIX}{arch} without a tag."),
        ) from None


def _create(timm: Any, spec: str, name: str, **kwargs: Any) -> torch.nn.Module:
    try:
        return timm.create_model(name, **kwargs)
    except GradExplorerError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"timm could not build '{spec}': {short_reason(exc)}",
            "Check the name with 'gradexplorer models --task timm', or choose other weights.",
        ) from exc


def _from_file(timm: Any, spec: str, name: str, file: Path) -> torch.nn.Module:
    """``name`` built by timm with the weights of ``file``, read here (never unpickled, its
    tensors measured first) and handed to timm's loader, which adapts them to the model."""
    state = read_weights(file)
    overlay = {"state_dict": dict(state), "file": None, "source": "", "custom_load": False}
    return _create(timm, spec, name, pretrained=True, pretrained_cfg_overlay=overlay)


def _default_label(timm: Any, name: str) -> str:
    cfg = _as_dict(timm.models.get_pretrained_cfg(name))
    return str(cfg.get("hf_hub_id") or cfg.get("url") or "")


def _pretrained(timm: Any, spec: str, name: str,
                progress: Callable[[int, int], None] | None = None) -> tuple[torch.nn.Module, str]:
    cfg = _as_dict(timm.models.get_pretrained_cfg(name))
    label = _default_label(timm, name)
    if not label:
        raise ModelLoadError(
            f"timm has no pretrained weights for '{spec}'.",
            "Leave --weights out for a random initialisation, or give a state-dict file.",
        )
    file = cached_weights_file(cfg)
    if file is not None:
        return _from_file(timm, spec, name, file), label
    if hub_offline():
        raise WeightsUnavailable(
            f"The weights of '{spec}' ({label}) are not in the Hugging Face cache "
            f"({hub_cache_dir()}) and HF_HUB_OFFLINE is set.",
            "Unset HF_HUB_OFFLINE to download them once, or leave --weights out for a random "
            "initialisation.",
        )
    try:
        if cfg.get("hf_hub_id"):
            # Into the cache, with progress, then read from there as a cached file is.
            file = _download(cfg, progress)
        else:
            # Weights timm fetches from a URL land in torch's hub cache, where
            # cached_weights_file finds them; they are read from there as any cached file.
            from torch.hub import download_url_to_file

            file = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(str(cfg["url"]))
            file.parent.mkdir(parents=True, exist_ok=True)
            download_url_to_file(str(cfg["url"]), str(file), progress=False)
    except ModelLoadError:
        raise
    except Exception as exc:  # network, hub and file errors come in many types
        raise WeightsUnavailable(
            f"The weights of '{spec}' ({label}) could not be downloaded: {short_reason(exc)}",
            "Check the network connection (or copy the files into the Hugging Face cache), or "
            "leave --weights out for a random initialisation.",
        ) from exc
    return _from_file(timm, spec, name, file), label


def _download(cfg: dict[str, Any], progress: Callable[[int, int], None] | None) -> Path:
    """The weights file of ``cfg``'s Hugging Face repository, downloaded into the cache with
    the bytes reported to ``progress``: the safetensors file when the repository has one,
    else its ``pytorch_model.bin`` (timm's own order)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    repo, _, revision = str(cfg["hf_hub_id"]).partition("@")
    names = [cfg["hf_hub_filename"]] if cfg.get("hf_hub_filename") else list(_HUB_FILES)
    for i, file_name in enumerate(names):
        try:
            return Path(hf_hub_download(repo, file_name, revision=revision or None, cache_dir=str(hub_cache_dir()),
                                        tqdm_class=progress_class(progress)))
        except EntryNotFoundError:
            if i == len(names) - 1:
                raise
    raise AssertionError("unreachable: the last name re-raises")


def _preprocessing(timm: Any, module: torch.nn.Module) -> tuple[Callable[..., torch.Tensor], str]:
    import timm.data

    config = timm.data.resolve_model_data_config(module)
    transform = timm.data.create_transform(**config, is_training=False)
    _, height, width = config["input_size"]
    crop = config.get("crop_pct", 1.0)
    mean = ", ".join(f"{v:.3g}" for v in config["mean"])
    std = ", ".join(f"{v:.3g}" for v in config["std"])
    description = (
        f"timm's data config: resize ({config.get('interpolation', 'bilinear')}) and "
        f"{config.get('crop_mode', 'center')} crop {height}×{width} (crop {crop:g}), scale to "
        f"[0, 1], normalise with mean ({mean}) and std ({std})"
    )
    return transform, description


def _categories(timm: Any, module: torch.nn.Module) -> list[str] | None:
    try:
        import timm.data

        subset = timm.data.infer_imagenet_subset(module)
        if subset is None:
            return None
        names = list(timm.data.ImageNetInfo(subset).label_descriptions())
    except Exception:  # noqa: BLE001 - class names are a nicety; a model without them still loads
        return None
    classes = getattr(module, "num_classes", None)
    return names if classes in (None, len(names)) else None


def _as_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return cfg
    to_dict = getattr(cfg, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(vars(cfg))


def _unknown_name(spec: str, name: str, names: list[str]) -> ModelLoadError:
    close = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.6)
    return ModelLoadError(
        f"'{name}' is not a timm model." if name else f"'{spec}' names no timm model.",
        (f"Did you mean {' or '.join(PREFIX + c for c in close)}?" if close
         else "Run 'gradexplorer models --task timm' for the names."),
    )
