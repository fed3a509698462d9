"""Turn what the user typed (a torchvision name, a demo, a file, a factory) into a LoadedModel.

Nothing here runs code from a file or a factory unless the caller passes ``trust=True``:
checkpoints are read with ``weights_only=True`` first, and only a file that cannot be read
that way (a pickled ``nn.Module``, a ``torch.export`` archive) or a Python factory asks for
trust.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import os
import pickletools
import re
import sys
import threading
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
import torchvision
from torch import nn
from torchvision.models import WeightsEnum

from core.errors import ModelLoadError, TrustRequired
from core.loaded_model import LoadedModel
from core.weights import (
    fetch_weights,
    is_cached,
    load_cached_state_dict,
    load_state_dict_file,
    model_task,
    model_weights_enum,
    resolve_weights,
    short_reason,
    weights_file,
    weights_name,
)

_FILE_SUFFIXES = {".pth", ".pt", ".pt2", ".ckpt", ".bin", ".pkl", ".pickle", ".tar", ".zip"}
_STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model")
_MODULE_KEYS = ("model", "module", "net")
_FACTORY = re.compile(r"^(?P<target>.+):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
# These builders warn (FutureWarning about init_weights) unless told how to initialise, and
# grow auxiliary heads the pretrained versions drop; random models should match pretrained ones.
_LEGACY_INIT = {"googlenet", "inception_v3", "quantized_googlenet", "quantized_inception_v3"}
_UPSTREAM_DEPRECATIONS = ("torch.ao.quantization is deprecated", "TypedStorage is deprecated")
_VIDEO_FRAMES = 16
_FALLBACK_SIZE = 224
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
# WeightsEnum.get_state_dict is patched while a builder runs (see _safe_state_dicts).
_BUILD_LOCK = threading.RLock()
_TRUST_FIX = "Load it only if you trust where it came from: pass trust=True (--trust)."


def load_model(
    spec: str,
    *,
    weights: str | None = None,
    arch: str | None = None,
    trust: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> LoadedModel:
    """Build or load the model the user asked for, in eval mode.

    Parameters
    ----------
    spec : str
        One of:

        - a torchvision model name (``"resnet18"``, ``"fcn_resnet50"``, ``"r3d_18"``...);
        - ``"demo:seed-mlp"`` or ``"demo:shapes"``;
        - a checkpoint file: a state dict (``.pth``/``.pt``, needs ``arch``), a pickled
          ``nn.Module`` (needs ``trust``), or a ``torch.export`` archive (``.pt2``, needs
          ``trust``). TorchScript archives are refused: their modules cannot be hooked;
        - a factory, ``"package.module:function"`` or ``"path/to/file.py:function"``, called
          with no arguments (needs ``trust``).
    weights : str, optional
        For torchvision names: ``None`` (random initialisation), ``"DEFAULT"``, a weights
        enum member (``"IMAGENET1K_V1"`` or ``"ResNet18_Weights.IMAGENET1K_V1"``), or the path
        of a local state-dict file. For factories: the path of a state-dict file to load
        into the factory's model.
    arch : str, optional
        The torchvision architecture of a checkpoint file that holds weights only.
    trust : bool
        Allow running code: unpickling Python objects from ``spec`` or calling a factory.
        torchvision's cached weight files are never unpickled, whatever ``trust`` says.
    progress : callable, optional
        ``progress(done_bytes, total_bytes)`` while pretrained weights download.

    Returns
    -------
    LoadedModel
        The module in eval mode, with categories, preprocessing, input shape and task where
        they are known. Random torchvision models borrow the preprocessing of their default
        weights (resize 224 and ImageNet normalisation when they have none).

    Raises
    ------
    ModelLoadError
        Unknown name (with suggestions), missing/empty/damaged file, weights that do not fit,
        a TorchScript archive, a factory that fails or returns something else.
    TrustRequired
        Loading needs ``trust=True`` (pickled module, ``.pt2``, factory).
    WeightsUnavailable
        Pretrained weights are not cached and cannot be downloaded.
    """
    text = spec.strip()
    if not text:
        raise ModelLoadError(
            "No model was given.",
            "Give a torchvision name (resnet18), demo:shapes, a checkpoint file or "
            "module:function.",
        )
    if text.startswith("demo:"):
        _refuse_extras(text, weights=weights, arch=arch)
        from core.demos import load_demo  # demos import model code this module does not need

        return load_demo(text)

    names = torchvision.models.list_models()
    lowered = {name.lower(): name for name in names}
    if text.lower() in lowered:
        _refuse_extras(text, arch=arch)
        return _load_torchvision(
            lowered[text.lower()], weights=weights, trust=trust, progress=progress
        )

    factory = _parse_factory(text)
    if factory is not None:
        _refuse_extras(text, arch=arch)
        return _load_factory(text, *factory, trust=trust, weights=weights)

    if _looks_like_path(text):
        _refuse_extras(text, weights=weights)
        return _load_file(Path(text).expanduser(), spec=text, arch=arch, trust=trust)

    suggestions = difflib.get_close_matches(
        text.lower(), [*names, "demo:shapes", "demo:seed-mlp"], n=3, cutoff=0.6
    )
    raise ModelLoadError(
        f"'{text}' is not a torchvision model, a demo, a checkpoint file or a "
        "module:function factory.",
        f"Did you mean {' or '.join(suggestions)}?"
        if suggestions
        else "Choose a name from torchvision.models.list_models(), demo:shapes, or a file.",
    )


def _refuse_extras(spec: str, *, weights: str | None = None, arch: str | None = None) -> None:
    # Silently ignoring an option the user typed would show them a model they did not ask for.
    if weights is not None:
        raise ModelLoadError(
            f"Weights cannot be chosen for '{spec}'.",
            "Pass weights only with a torchvision model name or a factory.",
        )
    if arch is not None:
        raise ModelLoadError(
            f"An architecture cannot be chosen for '{spec}'.",
            "Pass arch only with a checkpoint file that holds weights only.",
        )


# --- torchvision -------------------------------------------------------------------------


def _load_torchvision(
    name: str,
    *,
    weights: str | None,
    trust: bool,
    progress: Callable[[int, int], None] | None,
) -> LoadedModel:
    enum_cls = model_weights_enum(name)
    notes: list[str] = []
    chosen: WeightsEnum | None
    weights_path: Path | None = None
    # Not on disk first: a stray file called "DEFAULT" must not shadow the enum name.
    if weights is not None and _looks_like_path(weights, check_disk=False):
        weights_path = Path(weights).expanduser()
        _check_file(weights_path, "weights file")
        chosen = _enum_for_file(enum_cls, weights_path)
    else:
        chosen = resolve_weights(name, weights)

    if chosen is not None:
        if weights_path is None and not is_cached(chosen):
            fetch_weights(chosen, progress=progress)
        module = _build(name, chosen, weights_path)
        label = weights_name(chosen)
        if weights_path is not None:
            notes.append(f"{label} read from {weights_path}")
    else:
        module = _build(name, None, None)
        label = None
        if weights_path is not None:
            module, refit_notes = _load_state_into_torchvision(
                name, module, weights_path, trust=trust
            )
            label = f"file:{weights_path}"
            notes.extend(refit_notes)

    described = chosen if chosen is not None else getattr(enum_cls, "DEFAULT", None)
    task = model_task(name)
    preprocess, description, input_shape = _preprocessing(described, task)
    if chosen is None and described is not None:
        notes.append(f"preprocessing borrowed from {weights_name(described)}")
    notes.extend(_task_notes(name, task, chosen, input_shape))
    return LoadedModel(
        module=module.eval(),
        spec=name,
        name=name,
        weights=label,
        categories=list(chosen.meta["categories"]) if chosen is not None else None,
        preprocess=preprocess,
        preprocess_description=description,
        input_shape=input_shape,
        task=task,
        notes=notes,
    )


def _enum_for_file(enum_cls: type[WeightsEnum] | None, path: Path) -> WeightsEnum | None:
    # A copy of torchvision's own file (the fix WeightsUnavailable suggests) is loaded as
    # those weights, so the builder's own adjustments (aux heads, key renames) still apply.
    if enum_cls is None:
        return None
    for member in enum_cls:
        if os.path.basename(member.url) == path.name:
            return member
    return None


def _builder_kwargs(name: str, builder: Callable, weights: WeightsEnum | None) -> dict:
    params = inspect.signature(builder).parameters
    kwargs: dict[str, object] = {}
    if "progress" in params:
        kwargs["progress"] = False
    if "weights_backbone" in params:
        # Detection and segmentation builders otherwise fetch an ImageNet backbone even for
        # a random model, through torch.hub's unsafe loader.
        kwargs["weights_backbone"] = None
    if "quantize" in params:
        # Quantized weights only fit a quantized model; a random one stays float (hookable).
        kwargs["quantize"] = weights is not None
    if weights is None and name in _LEGACY_INIT:
        kwargs.update(init_weights=True, aux_logits=False)
    return kwargs


def _build(
    name: str,
    weights: WeightsEnum | None,
    weights_path: Path | None,
    **extra: object,
) -> nn.Module:
    builder = torchvision.models.get_model_builder(name)
    kwargs = {**_builder_kwargs(name, builder, weights), **extra}
    with _safe_state_dicts(weights, weights_path), warnings.catch_warnings():
        # Quantized builders go through torch.ao.quantization and quantized storages, both
        # deprecated upstream; nothing the user can act on.
        for message in _UPSTREAM_DEPRECATIONS:
            warnings.filterwarnings("ignore", message=message)
        try:
            model = builder(weights=weights, **kwargs)
        except RuntimeError as exc:
            if "loading state_dict" not in str(exc):
                raise
            source = weights_path or (weights_file(weights) if weights is not None else name)
            raise ModelLoadError(
                f"The weights file '{source}' does not fit {name}: {short_reason(exc)}",
                "Delete the file and download it again, or use the weights it was made for.",
            ) from exc
    return model


@contextlib.contextmanager
def _safe_state_dicts(weights: WeightsEnum | None, path: Path | None) -> Iterator[None]:
    """Make torchvision builders read weight files with ``weights_only=True``.

    Every builder loads through ``weights.get_state_dict``, which calls torch.hub's loader
    (``weights_only=False``). Building with ``weights=None`` and loading ourselves would lose
    what builders do around the load (DenseNet key renames, GoogLeNet aux heads,
    quantization, ``transform_input``), so the method is swapped for the duration of the
    build instead. The lock keeps two builds from restoring each other's patch.
    """

    def get_state_dict(self: WeightsEnum, *args: object, **kwargs: object) -> dict:
        if path is not None and self is weights:
            return load_state_dict_file(path)
        return load_cached_state_dict(self)

    with _BUILD_LOCK:
        original = WeightsEnum.__dict__["get_state_dict"]
        WeightsEnum.get_state_dict = get_state_dict
        try:
            yield
        finally:
            WeightsEnum.get_state_dict = original


def _preprocessing(
    weights: WeightsEnum | None, task: str
) -> tuple[Callable[[object], torch.Tensor], str, tuple[int, ...]]:
    if weights is None:
        transform = _imagenet_preprocess()
        description = (
            f"resize to {_FALLBACK_SIZE}, centre-crop {_FALLBACK_SIZE}x{_FALLBACK_SIZE}, scale to "
            f"[0, 1], normalise with ImageNet mean {_IMAGENET_MEAN} and std {_IMAGENET_STD}"
        )
    else:
        transform = weights.transforms()
        description = _one_line(repr(transform))
    # Segmentation presets only resize (to 520): the shape is heavy but it is what the
    # weights were trained at; detection and optical flow presets have no size at all.
    size = getattr(transform, "crop_size", None) or getattr(transform, "resize_size", None)
    if size:
        height, width = (list(size) * 2)[:2]
    else:
        height = width = _FALLBACK_SIZE
    if task == "video":
        shape: tuple[int, ...] = (3, _VIDEO_FRAMES, height, width)
    else:
        shape = (3, height, width)
    return transform, description, shape


def _imagenet_preprocess() -> Callable[[object], torch.Tensor]:
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.Resize(_FALLBACK_SIZE),
            transforms.CenterCrop(_FALLBACK_SIZE),
            transforms.ToTensor(),
            transforms.Normalize(_IMAGENET_MEAN, _IMAGENET_STD),
        ]
    )


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 2:
        return "".join(lines)
    return lines[0] + ", ".join(lines[1:-1]) + lines[-1]


def _task_notes(
    name: str, task: str, weights: WeightsEnum | None, shape: tuple[int, ...]
) -> list[str]:
    notes = []
    if task == "segmentation":
        notes.append(f"input {shape[1]}x{shape[2]} follows the weights' resize; any size works")
    elif task == "video":
        notes.append(f"input is one clip, channels x frames x height x width = {shape}")
    elif task == "detection":
        notes.append("the model resizes images itself and returns a list of dicts")
    elif task == "optical_flow":
        notes.append("the model takes two images (frame pairs) and returns a list of flows")
    elif task == "quantized":
        if weights is not None:
            notes.append("quantized model: integer ops have no gradients")
        else:
            notes.append("random init builds the float (unquantized) version of the model")
    return notes


# --- state dicts -------------------------------------------------------------------------


def _is_state_dict(obj: object) -> bool:
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def _find_state_dict(obj: object) -> Mapping[str, torch.Tensor] | None:
    if _is_state_dict(obj):
        return obj
    if isinstance(obj, Mapping):
        for key in _STATE_DICT_KEYS:
            if _is_state_dict(obj.get(key)):
                return obj[key]
    return None


def _strip_wrapper_prefix(
    state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    # DataParallel/DDP save "module.x", torch.compile saves "_orig_mod.x".
    for prefix in ("module.", "_orig_mod."):
        if all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in own):
            return {k[len(prefix):]: v for k, v in state.items()}
    return dict(state)


def _fit_report(
    state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]
) -> tuple[list[str], list[str], list[str]]:
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [k for k in own if k in state and state[k].shape != own[k].shape]
    return missing, unexpected, mismatched


def _listing(keys: list[str], limit: int = 4) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _load_state_into(
    module: nn.Module, state: Mapping[str, torch.Tensor], source: Path, target: str
) -> None:
    own = module.state_dict()
    state = _strip_wrapper_prefix(state, own)
    missing, unexpected, mismatched = _fit_report(state, own)
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing ({_listing(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected ({_listing(unexpected)})")
        if mismatched:
            shapes = [
                f"{k}: file {tuple(state[k].shape)}, model {tuple(own[k].shape)}"
                for k in mismatched
            ]
            parts.append(f"{len(mismatched)} of another shape ({_listing(shapes, 2)})")
        raise ModelLoadError(
            f"The weights in '{source}' do not fit {target}: " + "; ".join(parts) + ".",
            "Check that the architecture is the one the file was saved from.",
        )
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise ModelLoadError(
            f"The weights in '{source}' do not fit {target}: {short_reason(exc)}",
            "Check that the architecture is the one the file was saved from.",
        ) from exc


def _load_state_into_torchvision(
    name: str, module: nn.Module, path: Path, *, trust: bool, state: Mapping | None = None
) -> tuple[nn.Module, list[str]]:
    if state is None:
        state = _find_state_dict(_read_checkpoint(path, trust=trust))
        if state is None:
            raise ModelLoadError(
                f"'{path}' does not hold a state dict.",
                "Save it with torch.save(model.state_dict(), path).",
            )
    own = module.state_dict()
    state = _strip_wrapper_prefix(state, own)
    notes: list[str] = []
    refit = _num_classes_to_fit(state, own)
    if refit is not None:
        # A fine-tuned classifier: rebuild with the file's number of classes.
        try:
            candidate = _build(name, None, None, num_classes=refit)
        except (TypeError, ValueError):
            candidate = None
        if candidate is not None and not any(_fit_report(state, candidate.state_dict())):
            module = candidate
            notes.append(f"built with num_classes={refit} to fit {path.name}")
    _load_state_into(module, state, path, name)
    return module, notes


def _num_classes_to_fit(
    state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]
) -> int | None:
    missing, unexpected, mismatched = _fit_report(state, own)
    if missing or unexpected or not mismatched:
        return None
    sizes = {state[k].shape[0] for k in mismatched}
    if len(sizes) != 1 or any(state[k].shape[1:] != own[k].shape[1:] for k in mismatched):
        return None
    return sizes.pop()


# --- files -------------------------------------------------------------------------------


def _looks_like_path(text: str, *, check_disk: bool = True) -> bool:
    return (
        Path(text).suffix.lower() in _FILE_SUFFIXES
        or "/" in text
        or os.sep in text
        or text.startswith("~")
        or (check_disk and os.path.exists(text))
    )


def _zip_members(path: Path) -> list[str] | None:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return None


def _is_torchscript(members: list[str]) -> bool:
    return any(m.endswith("/constants.pkl") or "/code/" in m for m in members)


def _is_export_archive(path: Path, members: list[str] | None) -> bool:
    return path.suffix.lower() == ".pt2" or bool(
        members and any(m.endswith("/archive_format") for m in members)
    )


def _check_file(path: Path, what: str) -> None:
    if not path.exists():
        raise ModelLoadError(f"The {what} '{path}' does not exist.", "Check the path.")
    if not path.is_file():
        raise ModelLoadError(f"'{path}' is not a file.", f"Choose a {what}.")
    if path.stat().st_size == 0:
        raise ModelLoadError(
            f"The {what} '{path}' is empty.", "It was probably not saved completely."
        )


def _load_file(path: Path, *, spec: str, arch: str | None, trust: bool) -> LoadedModel:
    _check_file(path, "model file")
    members = _zip_members(path)
    if members is not None and _is_torchscript(members):
        raise _torchscript_error(path)
    if _is_export_archive(path, members):
        return _load_export(path, spec=spec, trust=trust)

    obj = _read_checkpoint(path, trust=trust)
    if isinstance(obj, torch.jit.ScriptModule):
        raise _torchscript_error(path)
    state = _find_state_dict(obj)
    if state is not None:
        return _load_state_dict_file(path, state, spec=spec, arch=arch)
    module = obj if isinstance(obj, nn.Module) else None
    if module is None and isinstance(obj, Mapping):
        module = next((obj[k] for k in _MODULE_KEYS if isinstance(obj.get(k), nn.Module)), None)
    if module is None:
        raise ModelLoadError(
            f"'{path}' holds a {type(obj).__name__}, neither a model nor a state dict.",
            "Save the model with torch.save(model.state_dict(), path) or torch.save(model, path).",
        )
    if arch is not None:
        raise ModelLoadError(
            f"'{path}' holds a whole model; an architecture cannot be chosen for it.",
            "Leave arch out.",
        )
    return LoadedModel(
        module=module.eval(),
        spec=spec,
        name=f"{type(module).__name__} ({path.name})",
        weights=f"file:{path}",
        task="other",
        notes=["unpickled from a trusted file"],
    )


def _torchscript_error(path: Path) -> ModelLoadError:
    return ModelLoadError(
        f"'{path}' is a TorchScript archive: gradexplorer cannot hook TorchScript modules "
        "(forward hooks are refused, and hooks on their children never fire).",
        "Save the eager model's weights instead, torch.save(model.state_dict(), 'model.pth'), "
        "and load them with the architecture (--arch resnet18), or save the eager model itself.",
    )


def _read_checkpoint(path: Path, *, trust: bool) -> object:
    try:
        with warnings.catch_warnings():
            # Raw pickles made with pickle.dump trip this; the safe unpickler still applies.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - damaged and unsafe files raise many different types
        safe_error = exc
    unsafe = _unsafe_globals(path, safe_error)
    if not unsafe:
        raise ModelLoadError(
            f"'{path}' cannot be read as a PyTorch checkpoint: {short_reason(safe_error)}",
            "Check that the file is complete and was written by torch.save.",
        ) from safe_error
    if not trust:
        raise TrustRequired(
            f"Loading '{path}' would run code: it holds pickled Python objects "
            f"({_listing(unsafe, 6)}), not just tensors.",
            _TRUST_FIX + " Safer: save model.state_dict() and load it with --arch.",
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # whatever the pickled code raises
        raise ModelLoadError(
            f"'{path}' could not be unpickled: {type(exc).__name__}: {exc}",
            "Make the code that defined the model importable (run from its project folder or "
            "install its package), or save a state dict instead.",
        ) from exc


def _unsafe_globals(path: Path, error: Exception) -> list[str]:
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - only zip checkpoints are supported; the error message names the rest
        # Legacy torch.save files get this far and the error names the global; plain pickle
        # files stop earlier (on an opcode the safe unpickler lacks), so read their opcodes.
        found = re.findall(r"GLOBAL ([\w.]+)", str(error)) or _pickle_globals(path)
    return list(dict.fromkeys(found))


def _pickle_globals(path: Path) -> list[str]:
    """The globals a plain pickle file would import, read without unpickling anything."""
    found: list[str] = []
    pushed: list[str | None] = []  # recent string pushes, to name STACK_GLOBAL's operands
    memo: dict[int, str | None] = {}
    try:
        with open(path, "rb") as stream:
            for opcode, arg, _pos in pickletools.genops(stream):
                name = opcode.name
                if name == "GLOBAL" and isinstance(arg, str):
                    found.append(arg.replace(" ", "."))
                elif name == "STACK_GLOBAL":
                    if len(pushed) >= 2 and pushed[-2] and pushed[-1]:
                        found.append(f"{pushed[-2]}.{pushed[-1]}")
                elif name == "MEMOIZE":
                    memo[len(memo)] = pushed[-1] if pushed else None
                elif name.endswith("PUT"):
                    memo[arg] = pushed[-1] if pushed else None
                elif name.endswith("GET"):
                    pushed.append(memo.get(arg))
                elif isinstance(arg, str) and ("UNICODE" in name or "STRING" in name):
                    pushed.append(arg)
    except Exception:  # noqa: BLE001 - not a pickle, or a damaged one: report what was seen
        pass
    return found


def _load_state_dict_file(
    path: Path, state: Mapping[str, torch.Tensor], *, spec: str, arch: str | None
) -> LoadedModel:
    if arch is None:
        raise ModelLoadError(
            f"'{path}' holds weights only (a state dict), not the model's architecture.",
            "Pass the architecture name too, e.g. arch='resnet18' (--arch resnet18).",
        )
    names = torchvision.models.list_models()
    lowered = {name.lower(): name for name in names}
    name = lowered.get(arch.strip().lower())
    if name is None:
        close = difflib.get_close_matches(arch.strip().lower(), names, n=3, cutoff=0.6)
        raise ModelLoadError(
            f"'{arch}' is not a torchvision architecture.",
            f"Did you mean {' or '.join(close)}?"
            if close
            else "Choose a name from torchvision.models.list_models().",
        )
    module, notes = _load_state_into_torchvision(
        name, _build(name, None, None), path, trust=False, state=state
    )
    task = model_task(name)
    default = getattr(model_weights_enum(name), "DEFAULT", None)
    preprocess, description, input_shape = _preprocessing(default, task)
    if default is not None:
        notes.append(f"preprocessing assumed from {weights_name(default)}")
    return LoadedModel(
        module=module.eval(),
        spec=spec,
        name=f"{name} ({path.name})",
        weights=f"file:{path}",
        preprocess=preprocess,
        preprocess_description=description,
        input_shape=input_shape,
        task=task,
        notes=notes,
    )


def _load_export(path: Path, *, spec: str, trust: bool) -> LoadedModel:
    if not trust:
        raise TrustRequired(
            f"'{path}' is a torch.export archive; loading it unpickles data, which can run code.",
            _TRUST_FIX,
        )
    try:
        program = torch.export.load(path)
    except Exception as exc:  # damaged archives raise many different types
        raise ModelLoadError(
            f"'{path}' cannot be read as a torch.export archive: {short_reason(exc)}",
            "Check that the file is complete and was written by torch.export.save.",
        ) from exc
    # ep.module() is flat; unflatten restores the submodules so hooks on children fire.
    module = torch.export.unflatten(program)
    notes = ["torch.export program: train/eval behaviour was fixed when it was exported"]
    input_shape = None
    example = getattr(program, "example_inputs", None)
    if example and example[0] and isinstance(example[0][0], torch.Tensor):
        first = example[0][0]
        input_shape = tuple(first.shape[1:])
        notes.append(
            f"exported with batch size {first.shape[0]}; other sizes work only if it was "
            "exported with dynamic shapes"
        )
    return LoadedModel(
        module=module.eval(),
        spec=spec,
        name=f"exported program ({path.name})",
        weights=f"file:{path}",
        input_shape=input_shape,
        task="other",
        notes=notes,
    )


# --- factories ---------------------------------------------------------------------------


def _parse_factory(text: str) -> tuple[str, str] | None:
    match = _FACTORY.match(text)
    if match is None:
        return None
    target = match["target"]
    if target.endswith(".py") or _DOTTED.match(target):
        return target, match["attr"]
    return None


def _load_factory(
    spec: str, target: str, attr: str, *, trust: bool, weights: str | None
) -> LoadedModel:
    file = Path(target).expanduser() if target.endswith(".py") else None
    if file is not None and not file.is_file():
        raise ModelLoadError(f"The Python file '{file}' does not exist.", "Check the path.")
    if not trust:
        raise TrustRequired(
            f"'{spec}' is Python code: building the model runs it.",
            "Pass trust=True (--trust) if you trust this code.",
        )
    with _import_path(file.parent if file is not None else None):
        try:
            namespace = _import_file(file) if file is not None else importlib.import_module(target)
        except Exception as exc:  # the user's module may raise anything while importing
            raise ModelLoadError(
                f"Importing '{target}' failed: {type(exc).__name__}: {exc}",
                "Fix the error in that code, or make it importable (its folder on PYTHONPATH).",
            ) from exc
        factory: object = namespace
        for part in attr.split("."):
            if not hasattr(factory, part):
                raise ModelLoadError(
                    f"'{target}' has no attribute '{attr}'.", "Check the name after the colon."
                )
            factory = getattr(factory, part)
        if not callable(factory):
            raise ModelLoadError(
                f"'{spec}' is a {type(factory).__name__}, not a callable.",
                "Point at a function or class that builds the model.",
            )
        try:
            result = factory()
        except Exception as exc:  # the user's factory may raise anything
            raise ModelLoadError(
                f"The factory '{spec}' raised {type(exc).__name__}: {exc}",
                "Fix the factory so that calling it with no arguments returns an nn.Module.",
            ) from exc
    if isinstance(result, LoadedModel):
        result.module.eval()
        return result
    if not isinstance(result, nn.Module):
        kind = type(result)
        raise ModelLoadError(
            f"The factory '{spec}' returned a {kind.__module__}.{kind.__qualname__}, "
            "not a torch.nn.Module.",
            "Make it return the model (an nn.Module instance).",
        )
    label = None
    if weights is not None:
        path = Path(weights).expanduser()
        _check_file(path, "weights file")
        state = _find_state_dict(_read_checkpoint(path, trust=trust))
        if state is None:
            raise ModelLoadError(
                f"'{path}' does not hold a state dict.",
                "Save it with torch.save(model.state_dict(), path).",
            )
        _load_state_into(result, state, path, spec)
        label = f"file:{path}"
    return LoadedModel(
        module=result.eval(),
        spec=spec,
        name=attr,
        weights=label,
        task="other",
        notes=["built by a trusted factory"],
    )


@contextlib.contextmanager
def _import_path(folder: Path | None) -> Iterator[None]:
    # A factory file usually imports its neighbours; make them importable while it runs.
    entry = str(folder.resolve()) if folder is not None else None
    added = entry is not None and entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(entry)


def _import_file(file: Path) -> object:
    module_name = "_gradexplorer_factory_" + re.sub(r"\W", "_", file.stem)
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    # Registered so that dataclasses, pickling and relative lookups inside it work.
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
