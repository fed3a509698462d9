"""Hugging Face models by name: ``hf:ORG/NAME`` from the Hub (or its cache) and ``hf:PATH``
of a folder written by ``save_pretrained``, built through transformers' Auto classes.

The class comes from ``--hf-class`` (a transformers class name or a task word), else from
``config.architectures``, else ``AutoModel``. Weights are read from safetensors files,
which hold tensors only: no trust is asked. A folder with pickled weights only
(``pytorch_model.bin``) or whose config names code of its own (``auto_map``) loads only with
trust, and ``trust_remote_code`` is passed only then.

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

from gradexplorer.base.errors import ModelLoadError, TrustRequired
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
    if path.is_dir():
        return path.resolve(), "folder"
    if path.exists() or name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1):
        raise ModelLoadError(
            f"'{name}' is not a folder written by save_pretrained, nor a Hugging Face model name.",
            "Give hf:ORG/NAME (e.g. hf:openai-community/gpt2) or hf:PATH of a save_pretrained folder.",
        )
    from huggingface_hub import snapshot_download

    patterns = _WANTED + (_TRUSTED_ONLY if trust else [])
    offline = hub_offline()
    # The cache from the environment now (huggingface_hub fixed its default at import), the
    # one the model browser lists and timm's loader reads.
    cache = str(hub_cache_dir())
    try:
        folder = snapshot_download(name, allow_patterns=patterns, local_files_only=True, cache_dir=cache)
        return Path(folder).resolve(), "Hugging Face cache"
    except Exception as exc:
        if offline:
            raise ModelLoadError(
                f"'{name}' is not in the Hugging Face cache, and downloads are off (HF_HUB_OFFLINE is set).",
                f"Download it once with the network on (gradexplorer capture --model hf:{name} ...), "
                "or unset HF_HUB_OFFLINE.",
            ) from exc
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
    return Path(folder).resolve(), "Hugging Face Hub"


def model_class(transformers: Any, config: Any, hf_class: str | None) -> Any:
    """The class to build: ``hf_class`` (a class name or a task word), else the config's
    first architecture, else ``AutoModel``."""
    if hf_class:
        name = HF_TASKS.get(hf_class.strip().lower(), hf_class.strip())
        cls = getattr(transformers, name, None)
        if cls is None or not hasattr(cls, "from_pretrained"):
            raise ModelLoadError(
                f"'{hf_class}' is not a transformers model class nor a task word.",
                f"Give a class (GPT2LMHeadModel, AutoModelForCausalLM) or one of: {', '.join(HF_TASKS)}.",
            )
        return cls
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def load_hf(spec: str, *, hf_class: str | None = None, trust: bool = False,
            progress: Callable[[int, int], None] | None = None) -> LoadedModel:
    """Build the Hugging Face model of an ``hf:`` spec, in eval mode, with its tokenizer.

    Parameters
    ----------
    spec : str
        ``hf:ORG/NAME`` or ``hf:PATH`` (a ``save_pretrained`` folder).
    hf_class : str, optional
        A transformers class name (``GPT2LMHeadModel``, ``AutoModelForCausalLM``) or a task
        word (:data:`HF_TASKS`); default: the config's ``architectures``, else ``AutoModel``.
    trust : bool
        Allow the model's own code (``trust_remote_code``) and pickled weights.
    progress : callable, optional
        ``progress(done_bytes, total_bytes)`` while files download.

    Returns
    -------
    LoadedModel
        With ``tokenizer`` when the folder has one, the class names of a classifier, and,
        for a causal language model, the default target of the next token at the last
        position.

    Raises
    ------
    ModelLoadError
        transformers missing, unknown name or folder, not in the cache while offline, a
        class that does not fit the config.
    TrustRequired
        The model needs its own code, or its weights are pickled only.
    """
    name = hf_spec(spec)
    if not name:
        raise ModelLoadError("No Hugging Face model was named after 'hf:'.",
                             "Give hf:ORG/NAME or hf:PATH of a save_pretrained folder.")
    transformers = _transformers()
    folder, origin = resolve_folder(name, progress, trust)
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"'{folder}' has no config.json: it is not a folder written by save_pretrained.",
                             "Give the folder that model.save_pretrained(...) wrote.")
    config = _config(transformers, folder, spec, trust)
    has_safetensors = any(folder.glob("*.safetensors"))
    if not has_safetensors and any(folder.glob("pytorch_model*.bin")) and not trust:
        raise TrustRequired(
            f"The weights of '{spec}' are a pickle (pytorch_model.bin), and unpickling can run code.",
            "Pass --trust if you trust where it came from, or save it again with safetensors "
            "(model.save_pretrained(path), the default).",
            subject=f"the pickled weights of the Hugging Face model '{name}'",
        )
    cls = model_class(transformers, config, hf_class)
    kwargs: dict[str, Any] = {"config": config}
    if trust:
        kwargs["trust_remote_code"] = True
    if has_safetensors:
        kwargs["use_safetensors"] = True
    try:
        with _quiet(transformers):
            module = cls.from_pretrained(str(folder), **kwargs)
    except Exception as exc:
        raise ModelLoadError(
            f"{getattr(cls, '__name__', cls)} could not be built from '{spec}': {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}",
            f"Choose the class with --hf-class (a class name or one of: {', '.join(HF_TASKS)}).",
        ) from exc
    module.eval()
    if hasattr(module.config, "use_cache"):
        # A cache of keys and values would be part of the output, and is not what is inspected.
        module.config.use_cache = False
    tokenizer = _tokenizer(transformers, folder, trust)
    described = _described(module, spec, folder, origin, tokenizer)
    processor = _image_processor(transformers, folder, trust)
    if processor is not None:
        described.preprocess, described.preprocess_description = _image_preprocess(processor)
    return described


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers' own "Loading weights" bar off while a model is built: the command line's
    progress (and -q) and the window's say what is happening."""
    logging = transformers.utils.logging
    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            logging.enable_progress_bar()


def _config(transformers: Any, folder: Path, spec: str, trust: bool) -> Any:
    import json

    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"The config.json of '{spec}' cannot be read: {exc}",
                             "Save the model again with save_pretrained.") from exc
    if isinstance(raw, dict) and raw.get("auto_map") and not trust:
        raise TrustRequired(
            f"'{spec}' comes with Python code of its own (auto_map in config.json), which loading would run.",
            "Pass --trust if you trust where it came from.",
            subject=f"the Python code of the Hugging Face model '{hf_spec(spec)}'",
        )
    try:
        return transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=trust)
    except Exception as exc:
        raise ModelLoadError(
            f"The config of '{spec}' cannot be read by transformers {transformers.__version__}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            "Upgrade transformers, or check the folder's config.json.",
        ) from exc


def _tokenizer(transformers: Any, folder: Path, trust: bool) -> Any:
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                                                "vocab.json", "tokenizer.model")):
        return None
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust)
    except Exception:  # noqa: BLE001 - a model without a usable tokenizer still loads; --text says so
        return None
    return tok


def _image_processor(transformers: Any, folder: Path, trust: bool) -> Any:
    if not (folder / "preprocessor_config.json").is_file():
        return None
    try:
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
