"""Hugging Face models by name: ``hf:ORG/NAME`` from the Hub (or its cache) and ``hf:PATH``
of a folder written by ``save_pretrained``, built through transformers' Auto classes.

The class comes from ``--hf-class`` (a transformers model class name or a task word), else
from ``config.architectures``, else ``AutoModel``. Before transformers reads anything, every
file it would read is read here (``gradexplorer.models.hf_files``): trust is asked when any
config it follows names code of the repository (``auto_map``, in ``config.json``, in the
configs ``configuration_files`` lists, in the tokenizer's and processors' configs) or when
any weights file it would read is not safetensors by its bytes (a pickle, whatever its name);
``trust_remote_code`` is passed to every transformers call as the user's trust, so that
transformers never asks on the terminal. The model's size is told from its config on the
meta device and checked against the memory budget before it is built
(``gradexplorer.models.hf_size``).

Offline (``HF_HUB_OFFLINE=1``, or no network) the files come from the Hugging Face cache
(``HF_HOME``, ``HF_HUB_CACHE``); otherwise missing files are downloaded with progress.
transformers is an optional extra: without it the loader says how to install it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradexplorer.base.errors import ModelLoadError, TrustRequired, listing
from gradexplorer.models.files import weights_format
from gradexplorer.models.hf_files import (
    WeightsPlan,
    check_folder,
    check_snapshot,
    code_references,
    read_json,
    weights_plan,
)
from gradexplorer.models.hf_size import check_model_fits
from gradexplorer.models.hub import hub_cache_dir, hub_offline, progress_class
from gradexplorer.models.input_size import declared_input_shape
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.models.weights import ModelInfo

__all__ = ["HF_PREFIX", "HF_TASK", "HF_TASKS", "INSTALL_HINT", "HfTraits", "hf_available", "hf_catalog", "hf_spec",
           "hf_traits", "is_hf_module", "load_hf"]

HF_PREFIX = "hf:"
INSTALL_HINT = "pip install 'gradexplorer[hf]'"

#: Task words for ``--hf-class`` and the Auto class each names.
HF_TASKS = {
    "base": "AutoModel",
    "causal-lm": "AutoModelForCausalLM",
    "text-generation": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "fill-mask": "AutoModelForMaskedLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "image-classification": "AutoModelForImageClassification",
    "seq2seq": "AutoModelForSeq2SeqLM",
}

# The files a model needs, and no more (a repository may also hold other formats' weights):
# its config, safetensors weights and tokenizer. Its own code (auto_map's modules) and pickled
# weights run code when loaded, so they are fetched only with trust.
_WANTED = ["*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*"]
_TRUSTED_ONLY = ["*.py", "pytorch_model*.bin"]

#: A few small models for the window's model browser (any Hub name works).
HF_EXAMPLES = ("openai-community/gpt2", "distilbert/distilbert-base-uncased-finetuned-sst-2-english",
               "google-bert/bert-base-uncased", "google/vit-base-patch16-224")


def hf_spec(text: str) -> str | None:
    """The repository id or folder of an ``hf:`` spec, or None for any other spec."""
    text = text.strip()
    if not text.lower().startswith(HF_PREFIX):
        return None
    return text[len(HF_PREFIX):].strip()


def hf_available() -> bool:
    """Whether transformers can be imported (the ``hf`` extra is installed)."""
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


#: The catalog task of Hugging Face entries (:func:`hf_catalog`).
HF_TASK = "hugging_face"


def hf_catalog() -> list[ModelInfo]:
    """The window's model browser entries: the models in the Hugging Face cache, then a few
    known Hub names (empty without transformers). Reads the cache's folder names only.

    Returns
    -------
    list of ModelInfo
        ``name`` is the ``hf:`` spec, ``task`` is :data:`HF_TASK`, ``cached`` is
        ``("hub",)`` for a model in the cache.
    """
    if not hf_available():
        return []
    cached: list[str] = []
    try:
        from huggingface_hub import scan_cache_dir

        # The folder from the environment now: huggingface_hub's default was fixed at its import.
        cached = sorted(repo.repo_id for repo in scan_cache_dir(hub_cache_dir()).repos if repo.repo_type == "model")
    except Exception:  # noqa: BLE001 - no cache yet, or one we cannot read: the examples are enough
        pass
    names = cached + [n for n in HF_EXAMPLES if n not in cached]
    return [ModelInfo(HF_PREFIX + n, HF_TASK, (), None, ("hub",) if n in cached else ()) for n in names]


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ModelLoadError(
            "Hugging Face models need the transformers package, which is not installed.",
            f"Install it with: {INSTALL_HINT}",
        ) from None
    return transformers


def resolve_folder(name: str, progress: Callable[[int, int], None] | None = None,
                   trust: bool = False) -> tuple[Path, str]:
    """The local folder holding ``name``'s files, and where they came from, in words.

    A folder on disk is used as it is; a repository id is looked up in the Hugging Face
    cache, downloaded when missing (and allowed: not offline).
    """
    path = Path(name).expanduser()
    try:
        is_dir, exists = path.is_dir(), path.exists()
    except (OSError, ValueError):  # a name too long for a path, a NUL in it
        is_dir = exists = False
    if is_dir:
        return path.resolve(), "folder"
    shown = name if len(name) <= 80 else name[:77] + "..."
    if exists or name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1):
        raise ModelLoadError(
            f"'{shown}' is not a folder written by save_pretrained, nor a Hugging Face model name.",
            "Give hf:ORG/NAME (e.g. hf:openai-community/gpt2) or hf:PATH of a save_pretrained folder.",
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as exc:
        raise ModelLoadError(
            f"'{shown}' is not a Hugging Face model name ({str(exc).splitlines()[0][:160]})",
            "Give hf:ORG/NAME as on huggingface.co (e.g. hf:openai-community/gpt2), or hf:PATH of a "
            "save_pretrained folder.",
        ) from None

    patterns = _WANTED + (_TRUSTED_ONLY if trust else [])
    offline = hub_offline()
    # The cache from the environment now (huggingface_hub fixed its default at import), the
    # one the model browser lists and timm's loader reads.
    cache = str(hub_cache_dir())
    try:
        folder = snapshot_download(name, allow_patterns=patterns, local_files_only=True, cache_dir=cache)
    except Exception as exc:
        if offline:
            raise ModelLoadError(
                f"'{name}' is not in the Hugging Face cache, and downloads are off (HF_HUB_OFFLINE is set).",
                f"Download it once with the network on (gradexplorer capture --model hf:{name} ...), "
                "or unset HF_HUB_OFFLINE.",
            ) from exc
    else:
        check_snapshot(Path(folder), cache_repo_folder(name), name)
        return Path(folder).resolve(), "Hugging Face cache"
    try:
        folder = snapshot_download(name, allow_patterns=patterns, cache_dir=cache,
                                   tqdm_class=progress_class(progress))
    except Exception as exc:
        raise ModelLoadError(
            f"'{name}' could not be downloaded from the Hugging Face Hub: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}",
            "Check the name (ORG/NAME, as on huggingface.co) and the network; a private model needs "
            "'hf auth login'.",
        ) from exc
    check_snapshot(Path(folder), cache_repo_folder(name), name)
    return Path(folder).resolve(), "Hugging Face Hub"


def cache_repo_folder(name: str) -> Path:
    """The Hugging Face cache's folder of the model ``ORG/NAME`` (``models--ORG--NAME``)."""
    return hub_cache_dir() / ("models--" + name.replace("/", "--"))


def model_class(transformers: Any, config: Any, hf_class: str | None) -> Any:
    """The class to build: ``hf_class`` (a class name or a task word), else the config's
    first architecture, else ``AutoModel``."""
    if hf_class:
        name = HF_TASKS.get(hf_class.strip().lower(), hf_class.strip())
        cls = getattr(transformers, name, None) if name.isidentifier() else None
        if not is_model_class(transformers, cls):
            what = (f"'{hf_class}' is a transformers {type(cls).__name__ if not isinstance(cls, type) else 'class'}, "
                    "but not a model class" if cls is not None
                    else f"'{hf_class}' is not a transformers model class nor a task word")
            raise ModelLoadError(
                f"{what} (a tokenizer, a config or a processor cannot be captured).",
                f"Give a model class (GPT2LMHeadModel, AutoModelForCausalLM) or one of: {', '.join(HF_TASKS)}.",
            )
        return cls
    architectures = getattr(config, "architectures", None)
    for arch in architectures if isinstance(architectures, (list, tuple)) else []:
        cls = getattr(transformers, arch, None) if isinstance(arch, str) and arch.isidentifier() else None
        if is_model_class(transformers, cls):
            return cls
    return transformers.AutoModel


def is_model_class(transformers: Any, cls: Any) -> bool:
    """Whether ``cls`` builds a model: a ``PreTrainedModel`` subclass or an Auto model class
    (not ``AutoTokenizer``, ``AutoConfig``, ``GenerationConfig``...)."""
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    return isinstance(cls, type) and (issubclass(cls, transformers.PreTrainedModel)
                                      or issubclass(cls, _BaseAutoModelClass))


def load_hf(spec: str, *, hf_class: str | None = None, trust: bool = False,
            progress: Callable[[int, int], None] | None = None, memory_budget: int | None = None) -> LoadedModel:
    """Build the Hugging Face model of an ``hf:`` spec, in eval mode, with its tokenizer.

    Parameters
    ----------
    spec : str
        ``hf:ORG/NAME`` or ``hf:PATH`` (a ``save_pretrained`` folder).
    hf_class : str, optional
        A transformers model class name (``GPT2LMHeadModel``, ``AutoModelForCausalLM``) or a
        task word (:data:`HF_TASKS`); default: the config's ``architectures``, else ``AutoModel``.
    trust : bool
        Allow the model's own code (``trust_remote_code``) and weights that are not
        safetensors (pickles, read by ``torch.load``).
    progress : callable, optional
        ``progress(done_bytes, total_bytes)`` while files download.
    memory_budget : int, optional
        Bytes the model's parameters may take (``--memory-budget``); by default half the
        free RAM.

    Returns
    -------
    LoadedModel
        With ``tokenizer`` when the folder has one (else ``tokenizer_problem`` says why its
        tokenizer files could not be read), the class names of a classifier, and, for a
        causal language model, the default target of the next token at the last position.

    Raises
    ------
    ModelLoadError
        transformers missing, unknown name or folder, not in the cache while offline, a
        file that is no file or leads out of the cache, a damaged config, a class that is no
        model class or does not fit the config, no weights.
    TrustRequired
        A config names the model's own code, or a weights file is not safetensors.
    ModelTooLarge
        Its parameters, told from its config, need more than the memory budget.
    """
    name = hf_spec(spec)
    if not name:
        raise ModelLoadError("No Hugging Face model was named after 'hf:'.",
                             "Give hf:ORG/NAME or hf:PATH of a save_pretrained folder.")
    transformers = _transformers()
    folder, origin = resolve_folder(name, progress, trust)
    check_folder(folder, spec, cache_repo_folder(name) if origin != "folder" else None)
    if not os.path.lexists(folder / "config.json"):
        raise ModelLoadError(f"'{folder}' has no config.json: it is not a folder written by save_pretrained.",
                             "Give the folder that model.save_pretrained(...) wrote.")
    raw = read_json(folder / "config.json", f"The config.json of '{spec}'")
    if not isinstance(raw, dict):
        raise ModelLoadError(f"The config.json of '{spec}' holds {type(raw).__name__}, not a config.",
                             "Save the model again with save_pretrained.")
    code = code_references(folder, raw, spec)
    if code and not trust:
        raise TrustRequired(
            f"'{spec}' comes with Python code of its own ({listing(code, 3)}), which loading would run.",
            "Pass --trust if you trust where it came from.",
            subject=f"the Python code of the Hugging Face model '{name}'",
        )
    plan = weights_plan(folder, raw, spec)
    _check_weights(plan, spec, name, trust)
    config = _config(transformers, folder, spec, trust)
    cls = model_class(transformers, config, hf_class)
    check_model_fits(config.to_dict(), _meta_builder(transformers, cls, config, trust),
                     f"'{spec}' ({getattr(cls, '__name__', cls)})", memory_budget)
    if not plan.files:
        raise ModelLoadError(f"'{spec}' has no weights: '{folder}' holds neither model.safetensors nor "
                             "pytorch_model.bin (nor a sharded index of either).",
                             "Save the model with save_pretrained, or download it again.")
    # Shapes that differ are taken in and reported here (rather than raised after a report in
    # transformers' words and colours), so that the message can name them.
    kwargs: dict[str, Any] = {"config": config, "trust_remote_code": trust, "use_safetensors": plan.safetensors,
                              "output_loading_info": True, "ignore_mismatched_sizes": True}
    try:
        with _quiet(transformers):
            module, info = cls.from_pretrained(str(folder), **kwargs)
    except Exception as exc:
        raise ModelLoadError(
            f"{getattr(cls, '__name__', cls)} could not be built from '{spec}': {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
            "Check the model's config.json and weights (download it again), or choose the class with --hf-class "
            f"(a class name or one of: {', '.join(HF_TASKS)}).",
        ) from exc
    if not isinstance(module, transformers.PreTrainedModel):
        raise ModelLoadError(f"{getattr(cls, '__name__', cls)} built a {type(module).__name__} from '{spec}', "
                             "not a model.", f"Choose a model class with --hf-class (one of: {', '.join(HF_TASKS)}).")
    mismatched = sorted(info.get("mismatched_keys") or [], key=str)
    if mismatched:
        shapes = [f"{key} is {'x'.join(map(str, tuple(saved)))} in the weights, "
                  f"{'x'.join(map(str, tuple(built)))} in the model" for key, saved, built in mismatched]
        raise ModelLoadError(f"The weights of '{spec}' do not fit the model its config.json builds: "
                             f"{listing(shapes, 2)}.", "Check config.json against the weights, or download the "
                                                      "model again.")
    module.eval()
    missing = sorted(info.get("missing_keys") or [])
    notes = ([f"newly initialised, not in the weights: {listing(missing, 3)}"] if missing else [])
    if hasattr(module.config, "use_cache"):
        # A cache of keys and values would be part of the output, and is not what is inspected.
        module.config.use_cache = False
    tokenizer, problem = _tokenizer(transformers, folder, trust)
    described = _described(module, spec, folder, origin, tokenizer)
    described.notes.extend(notes)
    described.tokenizer_problem = problem
    processor = _image_processor(transformers, folder, trust)
    if processor is not None:
        described.preprocess, described.preprocess_description = _image_preprocess(processor)
    return described


def _check_weights(plan: WeightsPlan, spec: str, name: str, trust: bool) -> None:
    """Refuse weights that are not what the loader will read them as, by their bytes: a
    file read as safetensors must be one; a file read by ``torch.load`` (a pickle, whatever
    its name) needs trust."""
    for file in plan.files:
        if not os.path.lexists(file):
            raise ModelLoadError(f"'{spec}' lacks the weights file '{file.name}' ({plan.source}).",
                                 "Download the model again, or save it with save_pretrained.")
        kind = weights_format(file)
        if kind == "safetensors":
            _check_safetensors_header(file, spec)
            continue
        what = "a pickle" if kind == "pickle" else kind
        if plan.safetensors:
            raise ModelLoadError(f"The weights file '{file.name}' of '{spec}' is {what}, not a safetensors file.",
                                 "Download the model again, or save it with save_pretrained.")
        if not trust:
            what = "a pickle" if kind == "pickle" else f"{kind}, which torch.load reads as a pickle"
            raise TrustRequired(
                f"The weights of '{spec}' ({plan.source}) are not safetensors: '{file.name}' is {what}, and "
                "unpickling can run code.",
                "Pass --trust if you trust where it came from, or save it again with safetensors "
                "(model.save_pretrained(path), the default).",
                subject=f"the pickled weights of the Hugging Face model '{name}'",
            )


def _check_safetensors_header(file: Path, spec: str) -> None:
    """Refuse a safetensors file whose header lies (a length past the file, dtypes, shapes or
    offsets that do not hold), read by safetensors itself: the header only, nothing of the
    tensors is read."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as opened:
            opened.keys()
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error, and OSError
        text = str(exc).strip().splitlines()
        raise ModelLoadError(f"The weights file '{file.name}' of '{spec}' cannot be read as safetensors: "
                             f"{text[0][:200] if text else type(exc).__name__}.",
                             "Download the model again, or save it with save_pretrained.") from None


def _meta_builder(transformers: Any, cls: Any, config: Any, trust: bool) -> Callable[[dict[str, Any]], Any]:
    """``build(config_dict)``: the model ``cls`` of a copy of ``config`` (on the device the
    caller sets: meta), as ``from_pretrained`` would build it before reading weights."""
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    def build(values: dict[str, Any]) -> Any:
        with _quiet(transformers):  # its warnings about the config's values: the real load has them
            copy = type(config).from_dict(values)
            if issubclass(cls, _BaseAutoModelClass):
                return cls.from_config(copy, trust_remote_code=trust)
            return cls._from_config(copy)

    return build


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers' own "Loading weights" bar and its warnings off while a model is built: the
    command line's progress (and -q) and the window's say what is happening, and the loader
    says what matters in its words (keys newly initialised, shapes that do not fit; its load
    report comes in terminal colours). Its question on the terminal
    ("Do you wish to run the custom code? [y/N]") is off too: every call passes
    ``trust_remote_code``, and should one not, transformers refuses instead of asking."""
    logging = transformers.utils.logging
    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    import transformers.dynamic_module_utils as dynamic

    timeout = dynamic.TIME_OUT_REMOTE_CODE
    dynamic.TIME_OUT_REMOTE_CODE = 0
    try:
        yield
    finally:
        dynamic.TIME_OUT_REMOTE_CODE = timeout
        logging.set_verbosity(level)
        if was_on:
            logging.enable_progress_bar()


def _config(transformers: Any, folder: Path, spec: str, trust: bool) -> Any:
    try:
        with _quiet(transformers):
            return transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=trust)
    except Exception as exc:
        raise ModelLoadError(
            f"The config of '{spec}' cannot be read by transformers {transformers.__version__}: "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
            "Upgrade transformers, or check the folder's config.json.",
        ) from exc


#: The files of a tokenizer: a folder with any of them has one.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model")


def _tokenizer(transformers: Any, folder: Path, trust: bool) -> tuple[Any, str | None]:
    """The folder's tokenizer, or None and why its tokenizer files could not be read."""
    present = [f for f in _TOKENIZER_FILES if os.path.lexists(folder / f)]
    if not present:
        return None, None
    try:
        with _quiet(transformers):
            tok = transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust)
    except Exception as exc:  # noqa: BLE001 - a model without a usable tokenizer still loads; --text says so
        text = str(exc).strip().splitlines()
        return None, (f"its tokenizer ({', '.join(present)}) cannot be read: {type(exc).__name__}: "
                      f"{text[0][:200] if text else ''}")
    if not callable(tok):
        return None, f"its tokenizer files ({', '.join(present)}) make a {type(tok).__name__}, not a tokenizer"
    return tok, None


def _image_processor(transformers: Any, folder: Path, trust: bool) -> Any:
    if not (folder / "preprocessor_config.json").is_file():
        return None
    try:
        with _quiet(transformers):
            return transformers.AutoImageProcessor.from_pretrained(str(folder), trust_remote_code=trust)
    except Exception:  # noqa: BLE001 - not an image processor (audio, text): pictures get the default recipe
        return None


def _image_preprocess(processor: Any) -> tuple[Callable[[Any], Any], str]:
    """Pictures as the model's own image processor prepares them (its size, rescaling and
    normalisation: a Hugging Face ViT's mean and std are not ImageNet's), and that in words."""

    def preprocess(image: Any) -> Any:
        return processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"][0]

    steps = []
    size = getattr(processor, "size", None) or {}
    if getattr(processor, "do_resize", False) and size:
        side = (f"{size['height']}×{size['width']}" if "height" in size and "width" in size
                else f"shortest edge {size['shortest_edge']}" if "shortest_edge" in size else str(dict(size)))
        steps.append(f"resize to {side}")
    crop = getattr(processor, "crop_size", None) or {}
    if getattr(processor, "do_center_crop", False) and crop:
        steps.append(f"centre crop {crop.get('height')}×{crop.get('width')}")
    if getattr(processor, "do_rescale", False):
        steps.append(f"scale by {float(getattr(processor, 'rescale_factor', 1 / 255)):.4g}")
    if getattr(processor, "do_normalize", False):
        mean = ", ".join(f"{float(v):.3g}" for v in (getattr(processor, "image_mean", None) or []))
        std = ", ".join(f"{float(v):.3g}" for v in (getattr(processor, "image_std", None) or []))
        steps.append(f"normalise with mean ({mean}) and std ({std})")
    return preprocess, f"the model's image processor ({type(processor).__name__}): " + (", ".join(steps) or "as saved")


@dataclass(frozen=True)
class HfTraits:
    """What a transformers model's class and config say about how to read it.

    Attributes
    ----------
    task : str
        ``classification``, ``token_classification``, ``language_model`` or ``other``.
    categories : list of str or None
        A classifier's class names (``config.id2label``).
    default_target : str or None
        What ``top1`` stands for: the next token at the last position for a causal LM (and
        the first output token of an encoder-decoder), every token for a masked LM or a
        token classifier.
    text_padding : str
        ``"left"`` for a causal LM (its last position is every sample's last token), else
        ``"right"``.
    """

    task: str = "other"
    categories: list[str] | None = None
    default_target: str | None = None
    text_padding: str = "right"


def is_hf_module(module: Any) -> bool:
    """Whether ``module`` is a transformers model (a ``PreTrainedModel`` with its config)."""
    return type(module).__module__.startswith("transformers.") and hasattr(module, "config")


def hf_traits(module: Any) -> HfTraits:
    """How to read the transformers model ``module``, from its class name and config
    (no import of transformers: the model is already built)."""
    config = module.config
    cls_name = type(module).__name__
    is_causal = cls_name.endswith(("ForCausalLM", "LMHeadModel")) and not getattr(config, "is_encoder_decoder",
                                                                                  False)
    padding = "left" if is_causal else "right"
    if cls_name.endswith(("ForSequenceClassification", "ForImageClassification")):
        id2label = getattr(config, "id2label", None) or {}
        categories = ([str(id2label.get(i, id2label.get(str(i), i))) for i in range(len(id2label))]
                      if id2label else None)
        return HfTraits("classification", categories, None, padding)
    if cls_name.endswith("ForTokenClassification"):
        return HfTraits("token_classification", None, "top1,dim=-1", padding)
    if is_causal or (getattr(config, "is_encoder_decoder", False) and cls_name.endswith("ForConditionalGeneration")):
        # A causal LM predicts the token after the text; an encoder-decoder (T5, BART), fed
        # its start token, the first token of its output: either is read at the last position.
        return HfTraits("language_model", None, "top1,dim=-1,pos=-1", padding)
    if cls_name.endswith("ForMaskedLM"):
        return HfTraits("language_model", None, "top1,dim=-1", padding)
    return HfTraits(text_padding=padding)


def _described(module: Any, spec: str, folder: Path, origin: str, tokenizer: Any) -> LoadedModel:
    traits = hf_traits(module)
    cls_name = type(module).__name__
    name = getattr(module.config, "_name_or_path", "") or spec
    display = hf_spec(spec) or name
    notes = [f"{cls_name} from {origin} '{folder}'"]
    return LoadedModel(
        module=module, spec=spec, name=f"{display} ({cls_name})", weights=f"hf:{folder}",
        categories=traits.categories, task=traits.task, notes=notes, tokenizer=tokenizer,
        default_target=traits.default_target, input_shape=declared_input_shape(module),
        text_padding=traits.text_padding,
    )
