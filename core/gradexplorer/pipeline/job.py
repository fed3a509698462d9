"""One capture pipeline for every front end: options in, a capture with its metadata out.

:class:`CaptureJob` runs the steps of a capture in order, each one a method that can also
be called on its own (the window loads a model once and runs many captures on it)::

    job = CaptureJob(options, progress, cancel)
    job.load_model()   # download (cancellable, with progress) and load
    job.load_batch()   # the inputs and the labels the target uses
    job.probe()        # one sample through the model: calls and output sizes
    job.estimate()     # the memory it will take, against the budget
    cap = job.capture()  # forward and backward, metadata filled (gradexplorer.files.meta)
    # or all of it: cap = job.run()

Every step is done at most once per job: calling ``probe()`` runs ``load_model()`` and
``load_batch()`` first when needed, and a later ``run()`` reuses what was done.

One progress protocol, ``progress(stage, done, total)`` (``total`` 0 when unknown), with
the stages below and ``gradexplorer.capturing.capture``'s ``"forward"`` / ``"backward"``; one cancel
protocol, an object with ``is_set()`` (a ``threading.Event``), checked between steps, in
downloads and at every module call. Steps run the model: call them from a worker thread,
never a GUI thread.
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

# The batch loaders are looked up on their package when called: tests replace them.
from gradexplorer import batches
from gradexplorer.base.devices import resolve_device
from gradexplorer.base.errors import CaptureCancelled, GradExplorerError
from gradexplorer.base.tensor_memory import declared_bytes
from gradexplorer.base.units import format_bytes
from gradexplorer.batches.text import predicted_tokens
from gradexplorer.capturing.capture import CancelFlag, ProgressCallback
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.forward_memory import forward_peak
from gradexplorer.capturing.inputs import Batch, ModelInputs
from gradexplorer.capturing.memory_estimate import (
    budget_bytes,
    budget_message,
    budget_shortfall,
    estimate_capture_memory,
    stats_only_fits,
)
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer.capturing.selection import resolve_layers
from gradexplorer.capturing.settings import ReportSettings
from gradexplorer.capturing.targets import output_keys, parse_target
from gradexplorer.hooks.installed import hooks_installed
from gradexplorer.model_graph.graph import ModelGraph, extract_graph, graph_for_capture
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.options import BatchSpec, CaptureOptions
from gradexplorer.pipeline.provenance import build_meta
from gradexplorer.stats import cpu as cpu_stats

if TYPE_CHECKING:
    from gradexplorer.capturing.memory_estimate import MemoryEstimate, Shortfall

STAGE_DOWNLOAD = "downloading weights"
STAGE_LOAD_MODEL = "loading model"
STAGE_LOAD_BATCH = "loading batch"
STAGE_PROBE = "probing"
#: Compiling the CPU statistics kernels, once per machine (``gradexplorer.stats.cpu.prepare``).
STAGE_KERNELS = "preparing the statistics kernels (compiled once per machine)"

INPUT_HINT = "give --input FILES, --random [SHAPE] (e.g. 2x3x224x224) or --demo-input"

__all__ = [
    "STAGE_DOWNLOAD",
    "STAGE_KERNELS",
    "STAGE_LOAD_BATCH",
    "STAGE_LOAD_MODEL",
    "STAGE_PROBE",
    "CancelFlag",
    "CaptureJob",
    "OverBudget",
    "PreparedModel",
    "ProgressCallback",
    "ProbeOverBudget",
    "default_batch_spec",
    "probe_graph",
    "probe_model",
    "probe_sample",
]


def default_batch_spec(loaded: LoadedModel, n: int = 2) -> BatchSpec | None:
    """The batch to use when the user named none: the one rule of the window and the CLI.

    A demo model runs on its own batch. Any other model gets two random samples that follow
    it (``gradexplorer.batches.random_batches``): its known input shape, else what its first layer
    takes; values in the dtype of its parameters (fp16, bf16), or token ids in
    ``[0, vocab)`` when it starts with an ``Embedding``. The shape is written out in the
    spec (``random="2x3x224x224"``), so that the capture's metadata and the window's batch
    sources say what was made.

    Parameters
    ----------
    loaded : LoadedModel
    n : int, default 2
        Random samples (``gradexplorer layers --probe`` takes one).

    Returns
    -------
    BatchSpec or None
        None when nothing tells the model's input shape (the user must give an input).
    """
    if loaded.spec.startswith("demo:"):
        return BatchSpec(demo=True)
    shape = batches.random_shape_for(loaded.module, loaded.input_shape, n)
    if shape is None:
        return None
    return BatchSpec(random="x".join(str(d) for d in shape))


class OverBudget(GradExplorerError):
    """The capture is estimated to need more memory than the budget allows.

    Attributes
    ----------
    estimate : MemoryEstimate
    message : str
        ``gradexplorer.capturing.memory_estimate.check_budget``'s warning (the window shows it as is).
    """

    def __init__(self, problem: str, fix: str, estimate: MemoryEstimate, message: str):
        super().__init__(problem, fix)
        self.estimate = estimate
        self.message = message


class ProbeOverBudget(GradExplorerError):
    """One sample's forward (the probe) would hold more memory than the budget: told from
    the shapes of its operations (``gradexplorer.capturing.forward_memory``) before it runs."""


#: Where a forward cannot be told on fake tensors: one sample at work holds about this many
#: times its own size (the first layers' activations), the rule of thumb checked instead.
SAMPLE_WORK_FACTOR = 16


def probe_fits(module: torch.nn.Module, x: torch.Tensor | ModelInputs, budget: int | None = None) -> None:
    """Refuse a probe forward of ``x`` (one sample) that would hold more than the memory budget.

    The peak is told on fake tensors, before anything of the sample's size is allocated;
    a forward that cannot run on them is held to ``SAMPLE_WORK_FACTOR`` times the sample.

    Parameters
    ----------
    module : nn.Module
    x : Tensor or ModelInputs
        One sample.
    budget : int, optional
        Bytes (``--memory-budget``); by default half of the free RAM.

    Raises
    ------
    ProbeOverBudget
        With the figures and the ways out.
    """
    limit = budget if budget is not None else budget_bytes("cpu")
    if limit is None:
        return
    source = "set by --memory-budget" if budget is not None else "half of the free RAM"
    fix = ("use smaller samples (a smaller picture or fewer tokens), a --memory-budget above that if this machine "
           "has the memory, or --force to run anyway.")
    told = forward_peak(module, x)
    if told is not None:
        if told.peak > limit:
            raise ProbeOverBudget(
                f"one sample's forward needs about {format_bytes(told.peak)} at its peak (told from the shapes of "
                f"its {told.operations:,} operations, before anything ran) but the memory budget is "
                f"{format_bytes(limit)} ({source});", fix)
        return
    values = [*x.args, *x.kwargs.values()] if isinstance(x, ModelInputs) else [x]
    size = sum(declared_bytes(t) for t in values if isinstance(t, torch.Tensor))
    if size * SAMPLE_WORK_FACTOR > limit:
        raise ProbeOverBudget(
            f"one sample of the input takes {format_bytes(size)}, and a forward on it holds about "
            f"{SAMPLE_WORK_FACTOR} times that, {format_bytes(size * SAMPLE_WORK_FACTOR)} (its shapes could not be "
            f"followed on fake tensors), but the memory budget is {format_bytes(limit)} ({source});", fix)


@dataclass
class PreparedModel:
    """A model ready to be shown: its tree (probed when a batch fits) and output keys.

    Attributes
    ----------
    loaded : LoadedModel
    tree : ModuleTree
        Probed with one sample when ``probe_error`` is ``None``.
    output_keys : list of str
        Elements of a dict/tuple model output a target can pick (empty for a tensor).
    probe_error : GradExplorerError or None
        Why the probe forward failed (the tree then has no calls or shapes).
    options : CaptureOptions or None
        The options the model was loaded with (its spec, weights, arch, trust), when it
        was loaded by a job.
    """

    loaded: LoadedModel
    tree: ModuleTree
    output_keys: list[str] = field(default_factory=list)
    probe_error: GradExplorerError | None = None
    options: CaptureOptions | None = None


def probe_sample(module: torch.nn.Module, input_shape: tuple[int | None, ...] | None,
                 sample: torch.Tensor | ModelInputs | None = None, memory_budget: int | None = None,
                 force: bool = False) -> torch.Tensor | ModelInputs | None:
    """The one sample a probe forward runs on (the module tree's probe, the model graph).

    The first sample of ``sample``: a view, so that an expanded batch (gigabytes declared in
    a few bytes) stays expanded, never a dense copy. Without one, a random sample that
    follows the model (the default batch's rule: its dtype, token ids for an ``Embedding``)
    of ``input_shape``, refused before it is made when it alone is over the budget.

    Parameters
    ----------
    module : nn.Module
    input_shape : tuple or None
        The shape of one sample (``LoadedModel.input_shape``); unknown sizes count as unknown.
    sample : Tensor or ModelInputs, optional
        A batch (``Batch.model_input``).
    memory_budget : int, optional
        Bytes (``--memory-budget``); by default half of the free RAM.
    force : bool
        Make the random sample even over the budget.

    Returns
    -------
    Tensor, ModelInputs or None
        None when there is no batch and the model's input shape is not known.

    Raises
    ------
    ProbeOverBudget
        The random sample alone is over the budget.
    """
    if sample is not None and sample.dim() > 0 and len(sample) > 0:
        return sample[:1]
    if input_shape is None or not all(isinstance(d, int) for d in input_shape):
        return None
    shape = batches.random_shape_for(module, input_shape, n=1)
    if shape is None:
        return None
    recipe = batches.recipe_for(module)
    dtype = torch.int64 if recipe.vocab is not None else recipe.dtype
    size = torch.Size(shape).numel() * dtype.itemsize
    limit = memory_budget if memory_budget is not None else budget_bytes("cpu")
    if not force and limit is not None and size > limit:
        source = "set by --memory-budget" if memory_budget is not None else "half of the free RAM"
        raise ProbeOverBudget(
            f"one random sample of the model's input shape ({'x'.join(map(str, shape[1:]))}) takes "
            f"{format_bytes(size)} but the memory budget is {format_bytes(limit)} ({source});",
            "load a smaller input batch (a smaller picture or fewer tokens), or a --memory-budget above that if "
            "this machine has the memory.")
    # The default batch's rule (dtype, token ids), one sample: zeros in float32 would
    # fail on an fp16 model or index an Embedding with floats.
    made = batches.random_batch(shape, recipe=recipe)
    return made.tensor


def probe_graph(module: torch.nn.Module, sample: torch.Tensor | ModelInputs | None = None,
                input_shape: tuple[int | None, ...] | None = None, lock: Any = None,
                memory_budget: int | None = None, force: bool = False) -> ModelGraph:
    """The model graph (``gradexplorer.model_graph.graph.extract_graph``) from one forward on the
    sample the module tree's probe takes (:func:`probe_sample`: the first of ``sample``, a view,
    else one random sample), held to the memory budget as that probe is (:func:`probe_fits`).

    Parameters
    ----------
    module : nn.Module
        Left as it was.
    sample : Tensor or ModelInputs, optional
        A batch (``Batch.model_input``); only its first sample runs.
    input_shape : tuple, optional
        The shape of one sample, for a random sample when there is no batch.
    lock : context manager, optional
        Held while the probe's hooks are on the model, so that a capture never sees them.
    memory_budget : int, optional
        Bytes the forward may hold; by default half of the free RAM.
    force : bool
        Run even over the budget.

    Returns
    -------
    ModelGraph

    Raises
    ------
    ProbeOverBudget
        The forward (or the random sample) is over the budget; nothing of its size was made.
    GradExplorerError
        No batch and an unknown input shape; the forward failed (``CaptureError``).
    """
    x = probe_sample(module, input_shape, sample, memory_budget, force)
    if x is None:
        raise GradExplorerError("the graph needs one sample to run, and this model's input shape is not known;",
                                "load an input batch (pictures, a .pt tensor, or a random batch of the shape it "
                                "takes).")
    with lock if lock is not None else nullcontext():
        if not force:
            probe_fits(module, x, memory_budget)
        return extract_graph(module, x)


def probe_model(loaded: LoadedModel, sample: torch.Tensor | ModelInputs | None = None,
                lock: Any = None, memory_budget: int | None = None, force: bool = False) -> PreparedModel:
    """Build the module tree of ``loaded`` and probe it with one forward (no gradients).

    Parameters
    ----------
    loaded : LoadedModel
    sample : Tensor or ModelInputs, optional
        A batch to probe with (only its first sample is used; ``Batch.model_input``). Without one, one
        random sample of ``loaded.input_shape`` (the default batch's rule) when the shape is known.
    lock : context manager, optional
        Held during the forward, so that a probe's hooks never meet a capture's.
    memory_budget : int, optional
        Bytes the probe's forward may hold (:func:`probe_fits`); by default half of the free RAM.
    force : bool
        Probe even over the budget.

    Returns
    -------
    PreparedModel
        A failed probe does not raise: it is reported in ``probe_error`` (a
        :class:`ProbeOverBudget` when it was not run, being over the budget).
    """
    tree = ModuleTree.build(loaded.module)
    keys: list[str] = []
    error: GradExplorerError | None = None
    try:
        x = probe_sample(loaded.module, loaded.input_shape, sample, memory_budget, force)
    except ProbeOverBudget as exc:
        x, error = None, exc
    if x is not None:
        seen: list[Any] = []

        def grab(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
            seen.append(output)

        with lock if lock is not None else nullcontext(), hooks_installed() as hooks:
            try:
                if not force:
                    probe_fits(loaded.module, x, memory_budget)
                hooks.forward(loaded.module, grab)
                tree.probe(loaded.module, x)
            except GradExplorerError as exc:
                error = exc
        if seen:
            try:
                keys = output_keys(seen[0])
            except Exception:  # noqa: BLE001 - keys are a convenience; the run will say more
                keys = []
    return PreparedModel(loaded, tree, keys, error)


class CaptureJob:
    """The steps from :class:`~gradexplorer.pipeline.options.CaptureOptions` to a :class:`Capture`.

    Parameters
    ----------
    options : CaptureOptions
    progress : callable, optional
        ``progress(stage, done, total)``; called from the thread running the steps.
    cancel : object with ``is_set()``, optional
        When set, the next check raises :class:`~gradexplorer.base.errors.CaptureCancelled` (the
        model is left as it was).
    loaded : LoadedModel, optional
        A model already loaded for these options (the window keeps one): ``load_model``
        then returns it without reading anything.
    batch : Batch, optional
        A batch already loaded (labels from ``options.labels`` still apply).
    tree : ModuleTree, optional
        A tree already probed with a sample of this batch's shape; reused by ``probe``.
    lock : context manager, optional
        Held while hooks are on the model (probe and capture): two captures of one model
        at once would see each other's hooks.

    Attributes
    ----------
    loaded, batch, tree : set by the steps
    labels : Tensor or None
        The labels the target uses, after ``load_batch``.
    memory : MemoryEstimate or None
        After ``estimate`` (None when the probe failed).
    over_budget : str or None
        ``check_budget``'s warning after ``estimate``, when over the budget.
    shortfall : Shortfall or None
        Where and by how much it is over (``gradexplorer.capturing.memory_estimate.budget_shortfall``).
    timing : dict
        Seconds spent in each step that did work.
    """

    def __init__(self, options: CaptureOptions, progress: ProgressCallback | None = None,
                 cancel: CancelFlag | None = None, *, loaded: LoadedModel | None = None,
                 batch: Batch | None = None, tree: ModuleTree | None = None, lock: Any = None) -> None:
        if not isinstance(options, CaptureOptions):
            raise TypeError(f"CaptureJob needs CaptureOptions, not {type(options).__name__}")
        self.options = options
        self.progress = progress
        self.cancel = cancel
        self.loaded = loaded
        self.batch = batch
        self.tree = tree
        self.lock = lock
        self.labels: torch.Tensor | None = None
        self.output_keys: list[str] = []
        self.probe_error: GradExplorerError | None = None
        self.memory: MemoryEstimate | None = None
        self.over_budget: str | None = None
        self.shortfall: Shortfall | None = None
        self.result: Capture | None = None
        self.timing: dict[str, float] = {}
        self._device: torch.device | None = None
        self._labels_done = False
        self._probed = False
        self._estimated = False

    # -- plumbing ----------------------------------------------------------------------
    def _report(self, stage: str, done: int = 0, total: int = 0) -> None:
        if self.progress is not None:
            self.progress(stage, int(done), int(total))

    def check_cancel(self) -> None:
        """Raise ``CaptureCancelled`` when the cancel flag is set."""
        if self.cancel is not None and self.cancel.is_set():
            raise CaptureCancelled()

    def _timed(self, step: str, start: float) -> None:
        self.timing[step] = round(time.perf_counter() - start, 4)

    def _held(self) -> AbstractContextManager[Any]:
        return self.lock if self.lock is not None else nullcontext()

    # -- steps -------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the capture runs (``options.device`` resolved; ``auto`` picks a GPU).

        Raises
        ------
        GradExplorerError
            The device does not exist here (with the ones that do).
        """
        return self.resolve_device()

    def resolve_device(self) -> torch.device:
        """Resolve ``options.device`` (once): the first check, before anything is loaded.

        Raises
        ------
        GradExplorerError
            The device does not exist here (with the ones that do).
        """
        if self._device is None:
            self._device = resolve_device(self.options.device)
        return self._device

    def load_model(self) -> LoadedModel:
        """Load the model of the options (once), downloading its weights when needed.

        A download reports ``STAGE_DOWNLOAD`` with bytes done and total, and stops when
        the cancel flag is set (nothing partial is left in the cache).

        Returns
        -------
        LoadedModel

        Raises
        ------
        ModelLoadError, TrustRequired, WeightsUnavailable, CaptureCancelled
        """
        if self.loaded is not None:
            return self.loaded
        # Deferred: gradexplorer.models.loading imports torchvision (slow), which a job
        # pays only when it loads a model.
        from gradexplorer.models import check_capturable, load_model

        o = self.options
        start = time.perf_counter()
        self.check_cancel()
        check_capturable(o.model)  # before any download, probe or forward
        self._report(STAGE_LOAD_MODEL)
        if self._fetch_weights():
            self.check_cancel()
            self._report(STAGE_LOAD_MODEL)
        self.loaded = load_model(o.model, weights=o.weights, arch=o.arch, trust=o.trust, hf_class=o.hf_class,
                                 memory_budget=o.memory_budget,
                                 progress=lambda done, total: self._report(STAGE_DOWNLOAD, done, total))
        if o.tokenizer is not None:
            # Deferred, as load_model: it imports hf_models, which brings torchvision's weight tables.
            from gradexplorer.models.tokenizer import load_tokenizer, with_tokenizer

            self.check_cancel()
            tok = load_tokenizer(o.tokenizer, trust=o.trust,
                                 progress=lambda done, total: self._report(STAGE_DOWNLOAD, done, total))
            self.loaded = with_tokenizer(self.loaded, tok)
        self.check_cancel()
        self._timed("load_model", start)
        return self.loaded

    def _fetch_weights(self) -> bool:
        # torchvision weights not in the cache are downloaded here, where the cancel flag
        # is honoured between chunks; load_model then reads the cached file.
        o = self.options
        if not o.weights or o.model.startswith("demo:"):
            return False
        if Path(o.weights).expanduser().exists():
            return False
        import torchvision

        if o.model not in torchvision.models.list_models():
            return False
        from gradexplorer.models.weights import (  # deferred: imports torchvision (slow)
            fetch_weights,
            is_cached,
            resolve_weights,
        )

        try:
            enum = resolve_weights(o.model, o.weights)
        except GradExplorerError:
            return False  # load_model says what is wrong with the name, in its words
        if enum is None or is_cached(enum):
            return False
        # fetch_weights only asks the flag is_set(), the one cancel protocol.
        cancel = cast("threading.Event | None", self.cancel)
        fetch_weights(enum, progress=lambda done, total: self._report(STAGE_DOWNLOAD, done, total), cancel=cancel)
        return True

    def load_batch(self) -> Batch:
        """Load the batch of the options (once) and the labels the target uses.

        Without inputs named, the default for the model (:meth:`batch_spec`: the demo
        model's own batch, else random samples that follow the model).
        ``options.labels`` replace the batch's own labels.

        Returns
        -------
        Batch

        Raises
        ------
        BatchError, GradExplorerError
            No input for a model whose input shape is not known, unreadable inputs, a shape the
            model does not take, labels that do not fit, or ``cross_entropy`` without
            labels.
        """
        loaded = self.load_model()
        if self.batch is None:
            start = time.perf_counter()
            self._report(STAGE_LOAD_BATCH)
            sources = self._sources(loaded)
            self.batch = batches.load_batch(sources, loaded, self.options.labels,
                                            skip_unreadable=self.options.batch.skip_unreadable,
                                            memory_budget=self.options.memory_budget)
            batches.check_batch_shape(self.batch, loaded.input_shape)
            self.labels = self.batch.labels
            self._labels_done = True
            self._timed("load_batch", start)
            self.check_cancel()
        if not self._labels_done:
            self.labels = self._labels_for(self.batch, loaded)
            self._labels_done = True
        self._check_labels()
        return self.batch

    def _sources(self, loaded: LoadedModel) -> list[str]:
        spec = self.options.batch
        is_demo = loaded.spec.startswith("demo:")
        if spec.demo and not is_demo:
            raise GradExplorerError(
                f"--demo-input needs a demo model, and '{loaded.spec}' is not one;",
                INPUT_HINT.replace(" or --demo-input", "") + ".",
            )
        return self.batch_spec().sources()

    def batch_spec(self) -> BatchSpec:
        """The options' batch, or the default for the model when they name none
        (:func:`default_batch_spec`).

        Raises
        ------
        GradExplorerError
            No input was named and the model's input shape is not known.
        """
        spec = self.options.batch
        if not spec.is_default:
            return spec
        loaded = self.load_model()
        default = default_batch_spec(loaded)
        if default is None:
            raise GradExplorerError(
                f"No input was given for '{loaded.spec}', and its input shape is not known;",
                INPUT_HINT.replace("--random [SHAPE]", "--random SHAPE") + ".",
            )
        return default

    def _labels_for(self, batch: Batch, loaded: LoadedModel) -> torch.Tensor | None:
        if self.options.labels:
            return batches.parse_labels(self.options.labels, len(batch), loaded.categories)
        return batch.labels

    def _check_labels(self) -> None:
        if parse_target(self.options.target).kind == "cross_entropy" and self.labels is None:
            raise GradExplorerError(
                "the cross_entropy target needs labels, and this batch has none;",
                "give the labels (class indices or names, comma separated): --labels on the command "
                "line, the Labels box beside the target in the window.",
            )

    def check_target(self) -> None:
        """Refuse a ``class:N`` target beyond the model's classes, before any forward.

        Raises
        ------
        GradExplorerError
        """
        loaded = self.load_model()
        target = parse_target(self.target())
        index = target.class_index
        if target.kind == "class" and loaded.categories and index is not None and index >= len(loaded.categories):
            n = len(loaded.categories)
            raise GradExplorerError(
                f"target class {index} is out of range: {loaded.name} has {n} classes;",
                f"pick a class from 0 to {n - 1}.",
            )

    def selected_layers(self) -> list[str]:
        """The qualified names the options' layers select (every leaf when none).

        Raises
        ------
        GradExplorerError
            A pattern that matches no module (near names suggested).
        """
        return resolve_layers(self.load_model().module, self.options.layer_spec())

    def probe(self) -> ModuleTree | None:
        """Run one sample through the model (no gradients) to learn calls and sizes.

        Reuses a tree given to the job when it was probed with a sample of this batch's
        size. A failing probe does not raise (the capture's own forward reports the
        failure with more context): it returns None and sets ``probe_error``.

        Returns
        -------
        ModuleTree or None
        """
        if self._probed:
            return self.tree if self.probe_error is None else None
        loaded = self.load_model()
        batch = self.load_batch()
        self.check_target()
        if not self._tree_fits(batch):
            start = time.perf_counter()
            self._report(STAGE_PROBE)
            o = self.options
            prepared = probe_model(loaded, batch.model_input, self.lock, memory_budget=o.memory_budget, force=o.force)
            if isinstance(prepared.probe_error, ProbeOverBudget):
                raise prepared.probe_error
            self.tree, self.output_keys, self.probe_error = prepared.tree, prepared.output_keys, prepared.probe_error
            self._timed("probe", start)
        self._probed = True
        self.check_cancel()
        return self.tree if self.probe_error is None else None

    def _tree_fits(self, batch: Batch) -> bool:
        tree = self.tree
        if tree is None or not tree.probed or not tree.call_io:
            return False
        x = batch.tensor
        if x.dim() == 0 or len(x) == 0:
            return False
        return tree.call_io[0].input_bytes == x[:1].numel() * x.element_size()

    def estimate(self) -> MemoryEstimate | None:
        """Estimate the memory the capture needs and check it against the budget.

        The budget is ``options.memory_budget``, or half the free memory of the device
        (``gradexplorer.capturing.memory_estimate.check_budget``).

        Returns
        -------
        MemoryEstimate or None
            None when the probe failed (no estimate can be made).

        Raises
        ------
        OverBudget
            Over the budget and ``options.force`` is false: the message names the figure
            and the ways out (statistics only, fewer layers, a smaller batch, force).
        """
        if not self._estimated:
            tree = self.probe()
            selected = self.selected_layers()
            if tree is not None:
                o = self.options
                module = self.load_model().module
                x = self.load_batch().model_input
                self.memory = estimate_capture_memory(tree, selected, o.mode, x, o.input_grad, module)
                self.shortfall = budget_shortfall(self.memory, self.device, budget=o.memory_budget)
                self.over_budget = budget_message(self.memory, self.shortfall) if self.shortfall else None
            self._estimated = True
        if self.over_budget is not None and self.memory is not None and not self.options.force:
            raise self._over_budget_error()
        return self.memory

    def _over_budget_error(self) -> OverBudget:
        est, short = self.memory, self.shortfall
        assert est is not None and short is not None and self.over_budget is not None
        # The figures as the estimate line prints them (gradexplorer.base.units.format_bytes), in the
        # command line's words; the window shows check_budget's sentence instead.
        free = "half of the free RAM" if short.device.type == "cpu" else f"half of the free memory of {short.device}"
        source = "set by --memory-budget" if short.set_by_user else free
        if short.device.type == "cpu":
            kept = f"≈ {format_bytes(est.total)} kept"
            if short.need > est.total:
                kept += f" and {format_bytes(short.need - est.total)} while forward and backward run"
            problem = (f"this capture needs {format_bytes(short.need)} of memory ({kept}) but the budget "
                       f"is {format_bytes(short.budget)} ({source});")
        else:
            problem = (f"the forward and backward pass need about {format_bytes(short.need)} on {short.device} "
                       f"but the budget is {format_bytes(short.budget)} ({source});")
        larger = f"a --memory-budget above {format_bytes(short.need)}"
        if stats_only_fits(est, short):
            fix = (f"pass --stats-only (about {format_bytes(est.stats + est.io)}), fewer --layers "
                   f"or a smaller batch, {larger}, or --force to run anyway.")
        else:  # statistics only would not fit either: the batch is what must shrink
            fix = f"use a smaller batch, {larger}, or --force to run anyway."
        return OverBudget(problem, fix, est, self.over_budget)

    def metadata(self) -> dict:
        """The model, batch and option part of the capture's metadata
        (``gradexplorer.pipeline.provenance.build_meta``)."""
        batch = self.load_batch()
        return build_meta(self.load_model(), batch, self.labels, self.options)

    def capture(self) -> Capture:
        """Run forward and backward with the options and fill the metadata.

        Returns
        -------
        Capture
            Also kept in ``result``.

        Raises
        ------
        GradExplorerError
            Bad layers or target; ``CaptureError`` when forward or backward fails or
            memory runs out; ``CaptureCancelled``.
        """
        import gradexplorer.capturing.capture as capture_module  # looked up at call time: tests replace it

        o = self.options
        loaded = self.load_model()
        batch = self.load_batch()
        device = self.device
        tree = self.tree if self.probe_error is None else None
        expected = tree.expected_calls() if tree is not None and tree.probed else None
        meta = self.metadata()
        self._prepare_kernels(loaded.module, batch.model_input)
        self.check_cancel()
        start = time.perf_counter()
        with self._held():
            settings = o.capture_settings(ReportSettings(progress=self.progress, cancel=self.cancel, meta=meta),
                                          target=self.target(), labels=self.labels, device=device,
                                          expected_calls=expected)
            cap = capture_module.capture(loaded.module, batch.model_input, settings=settings)
            # Its records written here, on the job's thread, not by the window's first read
            # (gradexplorer.stats.pending: about a millisecond per 200 calls).
            cap.layers  # noqa: B018 - (the first read writes them)
            cap.graph = self._graph_for(cap, loaded.module, batch.model_input)
        self._timed("capture", start)
        cap.meta["timing"] = dict(self.timing)
        cap.meta["target_words"] = parse_target(self.target()).describe()
        predicted = predicted_tokens(cap, loaded.tokenizer, parse_target(self.target()))
        if predicted is not None:
            cap.meta["predicted_tokens"] = predicted
        self.result = cap
        return cap

    def target(self) -> str:
        """The target the capture runs: the options', except that the plain ``top1`` of a
        model with a default target of its own (a causal language model: the predicted next
        token at the last position) stands for that one."""
        loaded = self.load_model()
        if self.options.target == "top1" and loaded.default_target:
            return loaded.default_target
        return self.options.target

    def _prepare_kernels(self, model: Any, inputs: torch.Tensor | ModelInputs) -> None:
        """Compile the CPU statistics kernels for the dtypes this capture will summarise,
        as a stage of its own: on a fresh machine that takes seconds per dtype
        (docs/benchmarks.md, "Where the time goes"), which otherwise looked like a forward
        stuck at its first call."""
        if self.device.type != "cpu":
            return
        values = [*inputs.args, *inputs.kwargs.values()] if isinstance(inputs, ModelInputs) else [inputs]
        dtypes = {t.dtype for t in itertools.chain(model.parameters(), model.buffers(), values)
                  if isinstance(t, torch.Tensor) and t.is_floating_point()}
        dtypes |= {torch.float32}  # statistics of float32 gradients under autocast, and a float32 fallback
        if self.options.autocast:
            dtypes.add(torch.bfloat16 if self.options.autocast == "bf16" else torch.float16)
        if cpu_stats.needs_preparing(dtypes):
            self._report(STAGE_KERNELS)
            start = time.perf_counter()
            cpu_stats.prepare(sorted(dtypes, key=str))
            self._timed("kernels", start)

    def _graph_for(self, cap: Capture, model: Any, inputs: torch.Tensor | ModelInputs) -> dict | None:
        """The model graph the capture file carries (``gradexplorer.model_graph.graph``): one more forward of
        one sample, without gradients. A model whose graph cannot be found still gets its
        capture (the window then draws no graph)."""
        try:
            return graph_for_capture(model, inputs, cap).to_dict()
        except GradExplorerError:
            return None

    def run(self) -> Capture:
        """Every step in order: device, model, batch, probe, estimate, capture.

        Returns
        -------
        Capture

        Raises
        ------
        GradExplorerError
            From any step (``OverBudget`` unless ``options.force``).
        """
        self.resolve_device()  # a device that is not there fails before anything is loaded
        self.load_model()
        self.load_batch()
        self.probe()
        self.estimate()
        return self.capture()
