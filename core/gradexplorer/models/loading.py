"""Loading what the user named: :func:`load_model` picks the loader for a torchvision
name, a demo, a checkpoint file or a factory; :func:`check_capturable` refuses what no
target can turn into one number; :func:`trust_subject` names the code that trust would
run.

Nothing here runs code from a file or a factory unless the caller passes ``trust=True``:
checkpoints are read with ``weights_only=True`` first, and only a file that cannot be read
that way (a pickled ``nn.Module``, a ``torch.export`` archive) or a Python factory asks for
trust.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path

import torch

from gradexplorer.base.errors import ModelLoadError
from gradexplorer.files.capture_file import FORMAT as CAPTURE_FORMAT
from gradexplorer.models.demos import load_demo
from gradexplorer.models.factories import describe_factory, load_factory, parse_factory
from gradexplorer.models.files import (
    check_file,
    is_export_archive,
    is_torchscript,
    looks_like_path,
    torchscript_error,
    zip_members,
)
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.models.pickles import load_export, pickled_module, read_checkpoint
from gradexplorer.models.state_dicts import find_state_dict

__all__ = ["load_model", "check_capturable", "trust_subject"]


def hf_spec(text: str) -> str | None:
    """The repository or folder of an ``hf:`` spec, or None (``hf_models.hf_spec``)."""
    # Imported on first use, as torchvision is: the model catalogs these modules build
    # import torchvision, which the first window does not need.
    from gradexplorer.models.hf_models import hf_spec as spec_of

    return spec_of(text)


def is_timm_spec(text: str) -> bool:
    """Whether ``text`` names a timm model (``timm_models.is_timm_spec``)."""
    from gradexplorer.models.timm_models import is_timm_spec as is_timm

    return is_timm(text)


def torchvision_name(text: str) -> str | None:
    """torchvision's name for ``text``, or None (``torchvision_models.torchvision_name``)."""
    # torchvision is imported on first use here and below: its import costs seconds and
    # hundreds of MiB (docs/benchmarks.md, "Start-up"), and the demos (the window's first
    # model) need none of it.
    from gradexplorer.models.torchvision_models import torchvision_name as name_of

    return name_of(text)


def load_model(
    spec: str,
    *,
    weights: str | None = None,
    arch: str | None = None,
    trust: bool = False,
    progress: Callable[[int, int], None] | None = None,
    hf_class: str | None = None,
    memory_budget: int | None = None,
) -> LoadedModel:
    """Build or load the model the user asked for, in eval mode.

    Parameters
    ----------
    spec : str
        One of:

        - a torchvision model name (``"resnet18"``, ``"fcn_resnet50"``, ``"r3d_18"``...);
        - ``"demo:seed-mlp"`` or ``"demo:shapes"``;
        - ``"hf:ORG/NAME"`` or ``"hf:PATH"`` of a ``save_pretrained`` folder: a Hugging Face
          model (``gradexplorer.models.hf_models.load_hf``);
        - ``"timm:NAME"``, a timm model by name (timm is optional);
        - a checkpoint file: a state dict (``.pth``/``.pt``, needs ``arch``), a pickled
          ``nn.Module`` (needs ``trust``), or a ``torch.export`` archive (``.pt2``, needs
          ``trust``). TorchScript archives are refused: their modules cannot be hooked;
        - a factory, ``"package.module:function"`` or ``"path/to/file.py:function"``, called
          with no arguments (needs ``trust``).
    weights : str, optional
        For torchvision names: ``None`` (random initialisation), ``"DEFAULT"``, a weights
        enum member (``"IMAGENET1K_V1"`` or ``"ResNet18_Weights.IMAGENET1K_V1"``), or the path
        of a local state-dict file. For ``timm:`` names: ``None`` (random initialisation,
        seeded), ``"DEFAULT"`` (timm's pretrained weights from the Hugging Face cache, or
        downloaded) or a state-dict file. For factories: the path of a state-dict file to load
        into the factory's model.
    arch : str, optional
        The torchvision architecture of a checkpoint file that holds weights only.
    trust : bool
        Allow running code: unpickling Python objects from the model file ``spec`` or
        calling the factory ``spec``. Nothing else: weights files (``weights``) and
        torchvision's cached files are read with ``weights_only=True`` whatever ``trust``
        says.
    progress : callable, optional
        ``progress(done_bytes, total_bytes)`` while pretrained weights download.
    hf_class : str, optional
        For ``hf:`` models: the transformers class or task word to build.
    memory_budget : int, optional
        Bytes an ``hf:`` model's parameters may take, told from its config before it is
        built (``--memory-budget``); by default half the free RAM.

    Returns
    -------
    LoadedModel
        The module in eval mode, with categories, preprocessing, input shape and task where
        they are known. Random torchvision models borrow the preprocessing of their default
        weights (torchvision's classification recipe when they have none).

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
        return load_demo(text)
    if hf_spec(text) is not None:
        _refuse_extras(text, weights=weights, arch=arch)
        from gradexplorer.models.hf_models import load_hf

        return load_hf(text, hf_class=hf_class, trust=trust, progress=progress, memory_budget=memory_budget)
    if hf_class is not None:
        raise ModelLoadError(f"--hf-class goes only with an hf: model, not '{text}'.",
                             "Give the model as hf:ORG/NAME or hf:PATH, or leave --hf-class out.")

    if is_timm_spec(text):
        _refuse_extras(text, arch=arch)
        from gradexplorer.models.timm_models import load_timm

        return load_timm(text, weights=weights, progress=progress)

    name = torchvision_name(text)
    if name is not None:
        _refuse_extras(text, arch=arch)
        from gradexplorer.models.torchvision_models import load_torchvision

        return load_torchvision(name, weights=weights, progress=progress)

    factory = parse_factory(text)
    if factory is not None:
        _refuse_extras(text, arch=arch)
        return load_factory(text, factory, trust=trust, weights=weights)

    if looks_like_path(text):
        _refuse_extras(text, weights=weights)
        return _load_file(Path(text).expanduser(), spec=text, arch=arch, trust=trust)

    raise _unknown_spec(text)


def check_capturable(spec: str) -> None:
    """Refuse a model whose output no target can turn into one number, before anything
    is downloaded, built or run.

    Torchvision detection models return a list of boxes, labels and scores per image.

    Parameters
    ----------
    spec : str
        What the user asked to load (see :func:`load_model`).

    Raises
    ------
    ModelLoadError
        ``spec`` names a detection model; the message says what to choose instead.
    """
    if spec.strip().startswith("demo:"):
        return
    from gradexplorer.models.weights import model_task

    name = torchvision_name(spec)
    if name is None or model_task(name) != "detection":
        return
    raise ModelLoadError(
        f"{name} is a detection model: it returns a list of boxes, labels and scores for "
        "each image, and gradexplorer has no target that turns that into one number yet.",
        "Choose a classification or segmentation model ('gradexplorer models --task "
        "classification'), or load the detector through a factory (--model file.py:function "
        "--trust) that returns one score, such as the top detection's.",
    )


def trust_subject(spec: str) -> str:
    """The file or factory whose code runs when ``spec`` is loaded with trust, in words.

    For the trust dialog: it names what will run, not the model. Nothing is imported or
    read but the file's listing of a zip archive.

    Parameters
    ----------
    spec : str
        What the user asked to load (see :func:`load_model`).

    Returns
    -------
    str
        E.g. "the model file '/home/me/net.pt'", "the torch.export archive '/x/m.pt2'",
        "the Python file '/home/me/nets.py', then its build()".
    """
    text = spec.strip()
    if text.startswith("demo:") or is_timm_spec(text) or torchvision_name(text) is not None:
        return f"'{text}'"
    if hf_spec(text) is not None:
        return f"the Hugging Face model '{hf_spec(text)}' (its own Python code, or its pickled weights)"
    factory = parse_factory(text)
    if factory is not None:
        return describe_factory(factory)
    path = Path(text).expanduser()
    members = zip_members(path) if path.is_file() else None
    kind = "torch.export archive" if is_export_archive(path, members) else "model file"
    return f"the {kind} '{path.resolve()}'"


def _unknown_spec(text: str) -> ModelLoadError:
    import torchvision

    names = torchvision.models.list_models()
    suggestions = difflib.get_close_matches(
        text.lower(), [*names, "demo:shapes", "demo:seed-mlp"], n=3, cutoff=0.6
    )
    return ModelLoadError(
        f"'{text}' is not a torchvision model, a demo, a checkpoint file or a "
        "module:function factory.",
        f"Did you mean {' or '.join(suggestions)}?"
        if suggestions
        else "Run 'gradexplorer models' for the torchvision names, or give demo:shapes, "
        "a checkpoint file or module:function.",
    )


def _refuse_extras(spec: str, *, weights: str | None = None, arch: str | None = None) -> None:
    # Silently ignoring an option the user typed would show them a model they did not ask for.
    if weights is not None:
        raise ModelLoadError(
            f"Weights cannot be chosen for '{spec}'.",
            "--weights goes only with a torchvision or timm model name or a factory.",
        )
    if arch is not None:
        raise ModelLoadError(
            f"An architecture cannot be chosen for '{spec}'.",
            "--arch goes only with a checkpoint file that holds weights only.",
        )


def _load_file(path: Path, *, spec: str, arch: str | None, trust: bool) -> LoadedModel:
    check_file(path, "model file")
    members = zip_members(path)
    if members is not None and is_torchscript(members):
        raise torchscript_error(path)
    if is_export_archive(path, members):
        return load_export(path, spec=spec, trust=trust)

    obj = read_checkpoint(path, trust=trust)
    if isinstance(obj, torch.jit.ScriptModule):
        raise torchscript_error(path)
    if isinstance(obj, dict) and obj.get("format") == CAPTURE_FORMAT:
        raise ModelLoadError(
            f"'{path}' is a gradexplorer capture file, not a model.",
            f"Open it in the window with 'gradexplorer {path}' (or File > Open capture), or look "
            f"inside it with 'gradexplorer inspect {path}'.",
        )
    state = find_state_dict(obj)
    if state is None:
        return pickled_module(obj, path, spec=spec, arch=arch)
    if arch is None:
        raise ModelLoadError(
            f"'{path}' holds weights only (a state dict), not the model's architecture.",
            "Give its torchvision architecture too, e.g. --arch resnet18 (in the window, "
            "choose it when opening the file).",
        )
    from gradexplorer.models.torchvision_models import load_with_arch

    return load_with_arch(path, state, spec=spec, arch=arch)
