"""What the user asked a capture to do, in one frozen, hashable object.

Both front ends build a :class:`CaptureOptions` (the CLI from its arguments, the window
from its session) and hand it to :class:`gradexplorer.pipeline.job.CaptureJob`, which runs the steps. The
options hold plain values only (strings, numbers, tuples), so they can be compared,
hashed, logged, and varied with :func:`dataclasses.replace`::

    stats = dataclasses.replace(options, mode="stats")
    bf16 = dataclasses.replace(options, autocast="bf16")

Validation lives here, once (:meth:`CaptureOptions.__post_init__`): a wrong value raises
:class:`~gradexplorer.base.errors.GradExplorerError` with the problem and the fix in the words the
user typed (``--stats-only`` on the command line is ``mode="stats"`` here; the messages
name both where they differ). What needs the machine (is ``cuda:1`` there? does the
model file exist?) is checked by the job's steps, not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.settings import CaptureSettings, RecordSettings, ReportSettings, RunSettings
from gradexplorer.capturing.targets import parse_target

if TYPE_CHECKING:
    import torch

MODES = ("full", "stats")
#: How a text sample is named among a batch's sources (``gradexplorer.batches.load_batch``).
TEXT_SOURCE = "text:"
AUTOCAST_DTYPES = ("bf16", "fp16")


@dataclass(frozen=True)
class BatchSpec:
    """Where the input batch comes from: exactly one of files, a random batch, the demo
    batch, or nothing (then :meth:`sources` picks a default for the model).

    Attributes
    ----------
    inputs : tuple of str
        Image files or folders, or one ``.pt`` tensor file (``--input``).
    random : str or None
        ``None``: not a random batch. ``""``: two samples of the model's input shape
        (``--random`` without a shape). ``"2x3x224x224"``: that shape (seed 0), checked
        when the batch is made (``gradexplorer.batches.random_batch``).
    demo : bool
        The demo model's own batch (``--demo-input``).
    texts : tuple of str
        Texts, one sample each, tokenised with the model's tokenizer (``--text``); a
        ``.txt`` file among them gives one sample per line.
    skip_unreadable : bool
        Leave out pictures that cannot be read, when others can (``--skip-unreadable``);
        without it they are refused, by name.
    """

    inputs: tuple[str, ...] = ()
    random: str | None = None
    demo: bool = False
    texts: tuple[str, ...] = ()
    skip_unreadable: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.inputs, (str, bytes)):
            object.__setattr__(self, "inputs", (str(self.inputs),))
        else:
            object.__setattr__(self, "inputs", tuple(str(s) for s in self.inputs))
        texts = (self.texts,) if isinstance(self.texts, str) else tuple(str(t) for t in (self.texts or ()))
        object.__setattr__(self, "texts", texts)
        if self.random is not None:
            text = str(self.random).strip()
            if text.lower().startswith("random:"):
                text = text[len("random:"):].strip()
            object.__setattr__(self, "random", text)
        chosen = [bool(self.inputs), self.random is not None, bool(self.demo), bool(self.texts)]
        if sum(chosen) > 1:
            raise GradExplorerError(
                "more than one input was given;",
                "give only one of --input FILES, --text TEXT, --random [SHAPE] or --demo-input.",
            )

    @classmethod
    def from_sources(cls, sources: Sequence[str] | None) -> BatchSpec:
        """The spec of a list of ``gradexplorer.batches.load_batch`` sources (what the window keeps).

        ``["demo"]`` is the demo batch, ``["random"]`` / ``["random:2x10"]`` a random one,
        ``["text:the cat sat", ...]`` texts, anything else files; ``None`` or ``[]`` is the
        default.
        """
        items = [str(s).strip() for s in (sources or []) if str(s).strip()]
        if items and all(s.startswith(TEXT_SOURCE) for s in items):
            return cls(texts=tuple(s[len(TEXT_SOURCE):] for s in items))
        if len(items) == 1:
            lowered = items[0].lower()
            if lowered == "demo":
                return cls(demo=True)
            if lowered == "random" or lowered.startswith("random:"):
                return cls(random=items[0][len("random:"):] if ":" in items[0] else "")
        return cls(inputs=tuple(items))

    @property
    def is_default(self) -> bool:
        """No input was named: the job picks one that fits the model."""
        return not self.inputs and self.random is None and not self.demo and not self.texts

    def sources(self) -> list[str]:
        """The ``gradexplorer.batches.load_batch`` sources for this spec (empty when default)."""
        if self.inputs:
            return list(self.inputs)
        if self.texts:
            return [TEXT_SOURCE + t for t in self.texts]
        if self.random is not None:
            return [f"random:{self.random}"] if self.random else ["random"]
        if self.demo:
            return ["demo"]
        return []


@dataclass(frozen=True)
class CaptureOptions:
    """Everything one capture needs to know, as plain values.

    Attributes
    ----------
    model : str
        A torchvision name, ``demo:shapes``, a checkpoint file or a factory
        (``gradexplorer.models.load_model``'s ``spec``).
    weights : str or None
        ``DEFAULT``, an enum name, or a local ``.pth`` file; ``None`` is random init.
    arch : str or None
        torchvision architecture of a weights-only checkpoint file.
    trust : bool
        Allow running code from the model source (pickles, ``.pt2``, factories).
    batch : BatchSpec
        Where the inputs come from.
    labels : str or None
        Class indices or names, comma separated (``"3,1,0"``, ``"tabby"``); they replace
        labels that came with the batch.
    layers : tuple of str
        Module names or glob patterns; empty means every leaf module.
    target : str
        ``top1``, ``class:N``, ``sum``, ``mean`` or ``cross_entropy``, optionally ``,dim=D``
        (the class axis, ``gradexplorer.capturing.targets.parse_target``) and ``@key``.
    device : str
        ``auto``, ``cpu``, ``cuda:0``, ``mps``.
    mode : {"full", "stats"}
        ``stats`` keeps statistics only (``--stats-only``).
    train : bool
        Run in train mode (dropout, batch statistics).
    input_grad : bool
        Also record the gradient with respect to the input.
    autocast : {None, "bf16", "fp16"}
        Run forward under ``torch.autocast`` with this dtype on the capture device.
    memory_budget : int or None
        Bytes the capture may use; ``None`` is half the free memory of the device.
    force : bool
        Run even when the estimate is over the budget.
    hf_class : str or None
        For an ``hf:`` model: the transformers class or task word to build (``--hf-class``).
    tokenizer : str or None
        A tokenizer for a model that came without one (``--tokenizer``): a folder that
        ``tokenizer.save_pretrained`` wrote, or ``hf:ORG/NAME``
        (``gradexplorer.models.tokenizer.load_tokenizer``).
    """

    model: str
    weights: str | None = None
    arch: str | None = None
    trust: bool = False
    batch: BatchSpec = field(default_factory=BatchSpec)
    labels: str | None = None
    layers: tuple[str, ...] = ()
    target: str = "top1"
    device: str = "auto"
    mode: str = "full"
    train: bool = False
    input_grad: bool = False
    autocast: str | None = None
    memory_budget: int | None = None
    force: bool = False
    hf_class: str | None = None
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        # Normalise what front ends naturally hand over (lists, None) so that equal
        # requests compare and hash equal.
        put = object.__setattr__
        put(self, "model", str(self.model or "").strip())
        if not self.model:
            raise GradExplorerError(
                "no model was given;",
                "give --model: a torchvision name (resnet18), demo:shapes, a checkpoint file or module:function.",
            )
        for name in ("weights", "arch", "labels", "hf_class", "tokenizer"):
            value = getattr(self, name)
            put(self, name, str(value).strip() or None if value is not None else None)
        if isinstance(self.layers, str):
            put(self, "layers", (self.layers,))
        else:
            put(self, "layers", tuple(str(x) for x in (self.layers or ())))
        if self.batch is None:
            put(self, "batch", BatchSpec())
        elif not isinstance(self.batch, BatchSpec):
            put(self, "batch", BatchSpec.from_sources(self.batch))
        for name in ("trust", "train", "input_grad", "force"):
            put(self, name, bool(getattr(self, name)))
        put(self, "device", str(self.device or "auto").strip() or "auto")
        self._validate()

    def _validate(self) -> None:
        if self.mode not in MODES:
            raise GradExplorerError(
                f"unknown capture mode '{self.mode}';",
                "use 'full' (tensors and statistics) or 'stats' (statistics only, --stats-only).",
            )
        if self.autocast is not None and self.autocast not in AUTOCAST_DTYPES:
            raise GradExplorerError(
                f"unknown autocast dtype '{self.autocast}';",
                "use bf16 or fp16, or leave autocast off for the model's own dtype.",
            )
        budget = self.memory_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
            raise GradExplorerError(
                f"the memory budget {budget!r} is not a positive number of bytes;",
                "give a size in bytes, or leave it out for half the free memory of the device.",
            )
        if any(not pattern.strip() for pattern in self.layers):
            raise GradExplorerError("an empty layer pattern was given;",
                                    "give module names or globs such as 'layer4.*' (see gradexplorer layers).")
        parse_target(self.target)  # raises with the list of targets

    @property
    def stats_only(self) -> bool:
        return self.mode == "stats"

    def layer_spec(self) -> list[str] | None:
        """``gradexplorer.capturing.capture.capture``'s ``layers``: the patterns, or ``None`` for every leaf."""
        return list(self.layers) or None

    def capture_settings(self, report: ReportSettings | None = None, *, target: str | None = None,
                         labels: torch.Tensor | None = None, device: str | torch.device | None = None,
                         expected_calls: int | None = None) -> CaptureSettings:
        """The settings ``gradexplorer.capturing.capture.capture`` takes whole for these options.

        Parameters
        ----------
        report : ReportSettings, optional
            Progress, cancel flag and metadata of the run.
        target, labels, device, expected_calls
            What the job resolved from the options: the target a model's plain ``top1``
            stands for, the labels as class indices, the device found, the calls its probe
            counted. ``None`` takes the options' own (no labels, no count).
        """
        return CaptureSettings(
            record=RecordSettings(layers=self.layer_spec(), target=target or self.target, labels=labels,
                                  mode=self.mode, input_grad=self.input_grad, expected_calls=expected_calls),
            run=RunSettings(device=self.device if device is None else device, train=self.train,
                            autocast=self.autocast),
            report=report or ReportSettings(),
        )

    def describe(self) -> dict:
        """The options as a plain dict (for logs and tests)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.sources() if isinstance(value, BatchSpec) else value
        return out
