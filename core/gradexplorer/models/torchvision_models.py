"""torchvision architectures: names, weights, building, and their preprocessing."""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import torch
import torchvision
from PIL import Image
from torch import nn
from torchvision.models import WeightsEnum

import gradexplorer.models.weights as weights_module
from gradexplorer.base.errors import ModelLoadError
from gradexplorer.models.files import check_file, looks_like_path
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.models.preprocess import DEFAULT_PREPROCESS_DESCRIPTION, default_preprocess
from gradexplorer.models.state_dicts import (
    FitReport,
    fit_report,
    load_state_into,
    match_keys,
    read_weights,
)
from gradexplorer.models.weights import (
    load_cached_state_dict,
    load_state_dict_file,
    model_task,
    model_weights_enum,
    resolve_weights,
    short_reason,
    weights_file,
    weights_name,
)

# These builders warn (FutureWarning about init_weights) unless told how to initialise, and
# grow auxiliary heads the pretrained versions drop; random models should match pretrained ones.
_LEGACY_INIT = {"googlenet", "inception_v3", "quantized_googlenet", "quantized_inception_v3"}
# Auxiliary classifiers: GoogLeNet's aux1 and aux2, Inception v3's AuxLogits (builder
# argument aux_logits), segmentation models' aux_classifier (aux_loss).
_AUX_HEADS = {"aux1", "aux2", "AuxLogits", "aux_classifier"}
_AUX_TARGETS = {
    "aux_logits": "in train mode (--train) their outputs are targets, e.g. top1@aux_logits",
    "aux_loss": "the output 'aux' is a target: top1@aux",
}
_UPSTREAM_DEPRECATIONS = ("torch.ao.quantization is deprecated", "TypedStorage is deprecated")
_VIDEO_FRAMES = 16
_FALLBACK_SIZE = 224
# WeightsEnum.get_state_dict is patched while a builder runs (see _safe_state_dicts).
_BUILD_LOCK = threading.RLock()


class Preprocessing(NamedTuple):
    """How inputs of a torchvision model are prepared, and the shape of one sample."""

    transform: Callable[[Image.Image], torch.Tensor]
    description: str
    input_shape: tuple[int, ...]


def torchvision_name(text: str) -> str | None:
    """The torchvision model name ``text`` stands for (any case), or None."""
    lowered = {name.lower(): name for name in torchvision.models.list_models()}
    return lowered.get(text.strip().lower())


def unknown_architecture(arch: str) -> ModelLoadError:
    """The refusal of an ``--arch`` that torchvision does not know, with close names."""
    names = torchvision.models.list_models()
    close = difflib.get_close_matches(arch.strip().lower(), names, n=3, cutoff=0.6)
    return ModelLoadError(
        f"'{arch}' is not a torchvision architecture.",
        f"Did you mean {' or '.join(close)}?"
        if close
        else "Run 'gradexplorer models' for the torchvision names.",
    )


#: The seed of random initial weights (``--weights none``), said wherever the weights are named.
RANDOM_INIT_SEED = 0


def load_torchvision(
    name: str,
    *,
    weights: str | None,
    progress: Callable[[int, int], None] | None,
) -> LoadedModel:
    """Build torchvision's ``name`` with the weights the user chose (see ``load_model``).

    Weights files are read with ``weights_only=True``: ``--trust`` does not apply to them.
    """
    notes: list[str] = []
    weights_path: Path | None = None
    # Not on disk first: a stray file called "DEFAULT" must not shadow the enum name.
    if weights is not None and looks_like_path(weights, check_disk=False):
        weights_path = Path(weights).expanduser()
        check_file(weights_path, "weights file")
        chosen = _enum_for_file(model_weights_enum(name), weights_path)
    else:
        chosen = resolve_weights(name, weights)

    if chosen is not None:
        # Looked up when called, as tests replace them (docs/ARCHITECTURE.md).
        if weights_path is None and not weights_module.is_cached(chosen):
            weights_module.fetch_weights(chosen, progress=progress)
        module = build(name, chosen, weights_path)
        label = weights_name(chosen)
        if weights_path is not None:
            notes.append(f"{label} read from {weights_path}")
    else:
        module = build(name, None, None)
        label = None
        if weights_path is not None:
            module, refit_notes = fit_torchvision(name, module, weights_path)
            label = f"file:{weights_path}"
            notes.extend(refit_notes)
    loaded = _described(
        name, module, spec=name, name_shown=name, weights=chosen, label=label, notes=notes
    )
    if label is None:
        loaded.init_seed = RANDOM_INIT_SEED
    return loaded


def load_with_arch(
    path: Path, state: Mapping[str, torch.Tensor], *, spec: str, arch: str
) -> LoadedModel:
    """Build the torchvision architecture ``arch`` and load the state dict of ``path``."""
    name = torchvision_name(arch)
    if name is None:
        raise unknown_architecture(arch)
    module, notes = fit_torchvision(name, build(name, None, None), path, state=state)
    return _described(
        name, module, spec=spec, name_shown=f"{name} ({path.name})", weights=None,
        label=f"file:{path}", notes=notes, assumed=True,
    )


def _described(
    name: str,
    module: nn.Module,
    *,
    spec: str,
    name_shown: str,
    weights: WeightsEnum | None,
    label: str | None,
    notes: list[str],
    assumed: bool = False,
) -> LoadedModel:
    # A model without chosen weights borrows the preprocessing of its default weights.
    described = weights if weights is not None else getattr(model_weights_enum(name), "DEFAULT", None)
    task = model_task(name)
    prep = preprocessing(described, task)
    if weights is None and described is not None:
        verb = "assumed from" if assumed else "borrowed from"
        notes.append(f"preprocessing {verb} {weights_name(described)}")
    if not assumed:
        notes.extend(_task_notes(task, weights, prep.input_shape))
    categories = list(weights.meta["categories"]) if weights is not None else None
    if categories is None and described is not None and label is None:
        # Random weights keep the default weights' classes when the head has as many
        # outputs: "Greater Swiss Mountain dog", not "class 238" (a user's file of weights
        # may hold any classes: it is left unnamed).
        borrowed = described.meta.get("categories")
        if borrowed and _head_outputs(module) == len(borrowed):
            categories = list(borrowed)
            notes.append(f"class names borrowed from {weights_name(described)}")
    return LoadedModel(
        module=module.eval(),
        spec=spec,
        name=name_shown,
        weights=label,
        categories=categories,
        preprocess=prep.transform,
        preprocess_description=prep.description,
        input_shape=prep.input_shape,
        task=task,
        notes=notes,
    )


def _head_outputs(module: nn.Module) -> int | None:
    """How many outputs the model's last layer gives (its last Linear's features, or its last
    convolution's channels for a segmentation head), when that tells the classes."""
    last = None
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            last = m
    if isinstance(last, nn.Linear):
        return int(last.out_features)
    if isinstance(last, nn.Conv2d):
        return int(last.out_channels)
    return None


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
    if weights is None and "aux_loss" in params:
        # Pretrained segmentation weights carry the auxiliary classifier; a random model
        # matches them, so its 'aux' output is a target (top1@aux) either way.
        kwargs["aux_loss"] = True
    return kwargs


def build(
    name: str,
    weights: WeightsEnum | None,
    weights_path: Path | None,
    **extra: object,
) -> nn.Module:
    """Call torchvision's builder of ``name``; weight files are read with ``weights_only``.

    Raises
    ------
    ModelLoadError
        The weights file does not fit the architecture.
    """
    builder = torchvision.models.get_model_builder(name)
    kwargs = {**_builder_kwargs(name, builder, weights), **extra}
    # Random initial weights are drawn from one seed, so that loading the model again gives
    # the same model (and the same gradients); the caller's random state is left as it was.
    with _safe_state_dicts(weights, weights_path), warnings.catch_warnings(), \
            torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_INIT_SEED)
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

    def get_state_dict(self: WeightsEnum, *args: object, **kwargs: object) -> Mapping[str, torch.Tensor]:
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


def preprocessing(weights: WeightsEnum | None, task: str) -> Preprocessing:
    """The preprocessing of ``weights`` (the fallback recipe without), and the input shape.

    Parameters
    ----------
    weights : WeightsEnum or None
        The weights whose ``transforms()`` describe the inputs; ``None`` for the fallback,
        torchvision's classification recipe (``gradexplorer.models.preprocess.default_preprocess``).
    task : str
        The model's task (``gradexplorer.models.weights.model_task``): video models take clips.

    Returns
    -------
    Preprocessing
    """
    if weights is None:
        transform = default_preprocess()
        description = DEFAULT_PREPROCESS_DESCRIPTION
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
    return Preprocessing(transform, description, shape)


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 2:
        return "".join(lines)
    return lines[0] + ", ".join(lines[1:-1]) + lines[-1]


def _task_notes(task: str, weights: WeightsEnum | None, shape: tuple[int, ...]) -> list[str]:
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


def fit_torchvision(
    name: str,
    module: nn.Module,
    path: Path,
    *,
    state: Mapping[str, torch.Tensor] | None = None,
) -> tuple[nn.Module, list[str]]:
    """Load the state dict of ``path`` into torchvision's ``name``.

    When the file does not fit the model as built, the builder is called again with what
    the file shows: the number of classes of a fine-tuned classifier, the auxiliary
    classifiers GoogLeNet and Inception v3 have at their defaults. Key prefixes
    (Lightning's "model.", DataParallel's "module.") are removed when that makes the keys
    fit (:func:`~gradexplorer.models.state_dicts.match_keys`).

    Returns
    -------
    (nn.Module, list of str)
        The model holding the weights (maybe a rebuilt one), and notes for the user.

    Raises
    ------
    ModelLoadError
        The weights fit neither the model nor a rebuilt one.
    """
    if state is None:
        state = read_weights(path)
    rebuilt = _rebuilt_to_fit(name, module, state, path)
    if rebuilt is not None:
        module, notes = rebuilt
    else:
        notes = []
    notes.extend(load_state_into(module, state, path, name))
    return module, notes


def _rebuilt_to_fit(
    name: str, module: nn.Module, state: Mapping[str, torch.Tensor], path: Path
) -> tuple[nn.Module, list[str]] | None:
    # The model built again with builder arguments read off the file, when that fits and
    # the model as built does not.
    own = module.state_dict()
    keys = match_keys(state, own).state
    report = fit_report(keys, own)
    if report.fits:
        return None
    extra: dict[str, object] = {}
    notes: list[str] = []
    aux_flag = _aux_flag(name)
    added = [k for k in report.unexpected if k.split(".")[0] in _AUX_HEADS]
    lacking = [k for k in report.missing if k.split(".")[0] in _AUX_HEADS]
    if aux_flag and added and len(added) == len(report.unexpected):
        extra[aux_flag] = True
        heads = ", ".join(sorted({k.split(".")[0] for k in added}))
        notes.append(f"built with the auxiliary classifiers of {path.name} ({heads}); "
                     f"{_AUX_TARGETS.get(aux_flag, '')}")
    elif aux_flag and lacking and len(lacking) == len(report.missing):
        extra[aux_flag] = False
        notes.append(f"built without auxiliary classifiers, as {path.name} has none")
    refit = _num_classes_to_fit(keys, own, report)
    if refit is not None:
        extra["num_classes"] = refit
        notes.append(f"built with num_classes={refit} to fit {path.name}")
    if not extra:
        return None
    try:
        candidate = build(name, None, None, **extra)
    except (TypeError, ValueError):
        return None
    own = candidate.state_dict()
    if not fit_report(match_keys(state, own).state, own).fits:
        return None
    return candidate, notes


def _aux_flag(name: str) -> str | None:
    # The builder argument that adds or removes the auxiliary classifiers, if any.
    params = inspect.signature(torchvision.models.get_model_builder(name)).parameters
    for flag in ("aux_logits", "aux_loss"):
        if flag in params or (flag == "aux_logits" and name in _LEGACY_INIT):
            return flag
    return None


def _num_classes_to_fit(
    state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor], report: FitReport
) -> int | None:
    # A fine-tuned classifier: only the output layers' first dimension differs, alike.
    if not report.mismatched or report.missing:
        return None
    sizes = {state[k].shape[0] for k in report.mismatched}
    if len(sizes) != 1 or any(state[k].shape[1:] != own[k].shape[1:] for k in report.mismatched):
        return None
    return sizes.pop()
