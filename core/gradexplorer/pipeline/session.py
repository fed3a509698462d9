"""The state of one exploring session, shared by the GUI's panels, without Qt.

A :class:`Session` holds the loaded model and its module tree, the input batch, the
layers selected for capture, the run settings (target, device, mode...) and the last
capture. Widgets never own this state: they change it through the methods below and
listen to its psygnal signals to update themselves.

Long work (loading a model, probing it, running a capture) is done by the same
:class:`gradexplorer.pipeline.job.CaptureJob` the CLI runs, called from a worker thread
(:func:`prepare_model`, :meth:`RunRequest.run`); :meth:`Session.capture_options` gives the
session's settings as the :class:`gradexplorer.pipeline.options.CaptureOptions` the CLI would build. The
session itself is changed only from the thread that owns it (the GUI thread).

Runs are numbered: :meth:`Session.begin_run` hands out a generation number, and
:meth:`Session.finish_run` keeps a result only when no newer run, model or batch came
in between, so a stale result arriving late never replaces a fresh one.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from psygnal import Signal

from gradexplorer.base.devices import resolve_device
from gradexplorer.base.errors import CaptureCancelled, CaptureError, GradExplorerError
from gradexplorer.capturing.capture import CancelFlag, ProgressCallback
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.inputs import Batch
from gradexplorer.capturing.module_tree import ModuleNode, ModuleTree
from gradexplorer.capturing.selection import resolve_layers
from gradexplorer.capturing.targets import parse_target
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.job import CaptureJob, PreparedModel, probe_model
from gradexplorer.pipeline.options import MODES, TEXT_SOURCE, BatchSpec, CaptureOptions

__all__ = ["MODES", "PreparedModel", "RunRequest", "Session", "prepare_model", "probe_failed_message",
           "tree_from_names"]


# ---------------------------------------------------------------------------
# Work done off the GUI thread
# ---------------------------------------------------------------------------


def prepare_model(loaded: LoadedModel, sample: torch.Tensor | None = None) -> PreparedModel:
    """Build the module tree of ``loaded`` and probe it with one forward.

    The job's probe step (``gradexplorer.pipeline.job.probe_model``); runs the model (call it from a
    worker thread, never the GUI thread).

    Parameters
    ----------
    loaded : LoadedModel
    sample : Tensor, optional
        A batch to probe with (only its first sample is used). Without one, one random
        sample of ``loaded.input_shape`` when the shape is known (``probe_model``).

    Returns
    -------
    PreparedModel
        A failed probe does not raise: it is reported in ``probe_error``.
    """
    return probe_model(loaded, sample)


def tree_from_names(names: Iterable[str], types: dict[str, str] | None = None,
                    model_type: str = "model") -> ModuleTree:
    """A module tree made from qualified names alone (a capture file without its model).

    Containers that are not named themselves (``layer1`` for ``layer1.0.conv1``) are
    added so the tree nests as the model did.

    Parameters
    ----------
    names : iterable of str
        Qualified module names, in forward order.
    types : dict, optional
        Type name per qualified name.
    model_type : str
        Type shown for the root.
    """
    types = types or {}
    nodes: dict[str, ModuleNode] = {"": ModuleNode(name="", type=model_type, depth=0, parent=None)}

    def add(name: str) -> None:
        # The missing ancestors outermost first, iteratively: a name from a file can have
        # more dots than Python's stack has frames.
        missing = []
        while name not in nodes:
            missing.append(name)
            name = name.rsplit(".", 1)[0] if "." in name else ""
        for name in reversed(missing):
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            nodes[name] = ModuleNode(name=name, type=types.get(name, ""), depth=name.count(".") + 1, parent=parent)
            nodes[parent].children.append(name)

    for name in names:
        if name:
            add(name)
    return ModuleTree(nodes, model_type)


@dataclass
class RunRequest:
    """Everything one capture needs, copied from the session when the run starts.

    The worker thread calls :meth:`run`, which runs a :class:`~gradexplorer.pipeline.job.CaptureJob` of
    ``options`` on the session's model, batch and probed tree (nothing is loaded again);
    the session can change meanwhile without affecting the run.

    Attributes
    ----------
    options : CaptureOptions
        What the run does (the same object the CLI builds from its arguments).
    loaded, batch, tree :
        The session's model, batch and module tree at the start of the run.
    labels : Tensor or None
        The labels the target uses (checked when the request was made).
    generation : int
    lock : context manager, optional
        Shared by the session's runs and probes (hooks of two runs must not meet).
    """

    options: CaptureOptions
    loaded: LoadedModel
    batch: Batch
    tree: ModuleTree | None
    labels: torch.Tensor | None
    generation: int
    lock: Any = None

    @property
    def layers(self) -> list[str]:
        return list(self.options.layers)

    @property
    def device(self) -> str:
        return self.options.device

    @property
    def target(self) -> str:
        return self.options.target

    @property
    def mode(self) -> str:
        return self.options.mode

    @property
    def expected_calls(self) -> int | None:
        """Module calls per forward, from the session's probed tree (None when unknown)."""
        return self.tree.expected_calls() if self.tree is not None and self.tree.probed else None

    def job(self, progress: ProgressCallback | None = None, cancel: CancelFlag | None = None) -> CaptureJob:
        """The job that runs this request (on the session's model, batch and tree)."""
        # Two captures on one model at once would see each other's hooks: a cancelled
        # run still unwinding finishes before the next one starts.
        lock = self.lock if self.lock is not None else threading.Lock()
        return CaptureJob(self.options, progress, cancel, loaded=self.loaded, batch=self.batch,
                          tree=self.tree, lock=lock)

    def meta(self) -> dict:
        """The model, batch and option metadata the capture will carry (``gradexplorer.files.meta``)."""
        return self.job().metadata()

    def run(self, progress: ProgressCallback | None = None, cancel: CancelFlag | None = None) -> Capture:
        """Run the capture (forward and backward): call from a worker thread.

        Raises
        ------
        GradExplorerError
            Including ``CaptureCancelled`` when ``cancel`` is set.
        """
        return self.job(progress, cancel).run()


# ---------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------


class _Keep(enum.Enum):
    """``Session.set_model``'s default: the batch stays."""

    BATCH = enum.auto()



class Session:
    """What the user is looking at, and the settings of the next run.

    Signals
    -------
    model_changed(LoadedModel | None)
        A model was loaded (the tree changed with it: ``tree_changed`` follows).
    tree_changed(ModuleTree | None)
    tree_measured(ModuleTree)
        The same modules, their calls and output shapes measured again (on a new batch).
    batch_changed(Batch | None)
    selection_changed(frozenset)
        The qualified names selected for capture.
    settings_changed(str)
        The name of the run setting that changed: ``target``, ``labels``, ``device``,
        ``mode``, ``train`` or ``input_grad``.
    capture_changed(Capture | None)
    run_started(int), run_finished(int, str)
        A run's generation; ``run_finished`` says ``"ok"``, ``"stale"``, ``"cancelled"``
        or ``"failed"``.
    """

    model_changed = Signal(object)
    tree_changed = Signal(object)
    tree_measured = Signal(object)
    batch_changed = Signal(object)
    selection_changed = Signal(object)
    settings_changed = Signal(str)
    capture_changed = Signal(object)
    run_started = Signal(int)
    run_finished = Signal(int, str)

    def __init__(self) -> None:
        self.model: LoadedModel | None = None
        self.tree: ModuleTree | None = None
        self.output_keys: list[str] = []
        self.probe_error: GradExplorerError | None = None
        self.batch: Batch | None = None
        self.batch_sources: list[str] = []
        self.selection: frozenset[str] = frozenset()
        self.target = "top1"
        self.output_key: str | None = None
        self.labels_text = ""
        self.device = "auto"
        self.mode = "full"
        self.train = False
        self.input_grad = False
        self.autocast: str | None = None
        self.memory_budget: int | None = None
        # How the model was loaded (spec, weights, arch, trust), when a job loaded it.
        self.model_options: CaptureOptions | None = None
        self.capture: Capture | None = None
        self.capture_path: str | None = None
        self.generation = 0
        self.running_generation: int | None = None
        self.last_run_seconds: float | None = None
        self._run_lock = threading.Lock()

    # -- model and tree -------------------------------------------------------------
    def set_model(self, prepared: PreparedModel | LoadedModel | None,
                  batch: Batch | _Keep | None = _Keep.BATCH, sources: list[str] | None = None) -> None:
        """Show a new model (or none), with its batch when one is given. Keeps the layer
        selection when the same spec is loaded again (names that still exist), else selects
        every leaf. Drops the capture and invalidates a run in flight.

        Parameters
        ----------
        prepared : PreparedModel, LoadedModel or None
        batch : Batch or None, optional
            The batch that comes with the model (``None``: no batch); by default the batch
            stays. Both are in place before anything is announced: a listener of
            ``model_changed`` never sees the new model with the old batch, nor without its
            own (it would probe a model on a batch made for another, or make a sample of its
            own).
        sources : list of str, optional
            Where ``batch`` came from (as for :meth:`set_batch`).
        """
        if isinstance(prepared, LoadedModel):
            # No probe here: it runs the model, which the GUI thread must not do.
            prepared = PreparedModel(prepared, ModuleTree.build(prepared.module))
        old_spec = self.model.spec if self.model is not None else None
        old_selection = self.selection
        self.generation += 1
        self.model_options = prepared.options if prepared is not None else None
        if prepared is None:
            self.model, self.tree, self.output_keys, self.probe_error = None, None, [], None
        else:
            self.model = prepared.loaded
            self.tree = prepared.tree
            self.output_keys = list(prepared.output_keys)
            self.probe_error = prepared.probe_error
        new_batch = not isinstance(batch, _Keep)
        if not isinstance(batch, _Keep):
            self.batch = batch
            self.batch_sources = list(sources) if sources is not None else []
        if self.output_key is not None and self.output_key not in self.output_keys:
            self.output_key = None
        self.capture = None
        self.capture_path = None
        self.model_changed.emit(self.model)
        self.tree_changed.emit(self.tree)
        if new_batch:
            self.batch_changed.emit(self.batch)
        self.capture_changed.emit(None)
        if self.tree is None:
            new_selection: frozenset[str] = frozenset()
        elif self.model is not None and self.model.spec == old_spec:
            new_selection = frozenset(n for n in old_selection if n in self.tree)
        else:
            new_selection = frozenset(self.tree.leaves())
        self._set_selection(new_selection, force=True)

    # -- batch ---------------------------------------------------------------------
    def measure_tree(self, probed: ModuleTree) -> None:
        """Take the calls and output shapes that a probe of the loaded model measured on a
        new batch (texts of another length, pictures of another size): the tree keeps its
        modules and selection, and its shapes follow the batch. A probe of other modules
        (another model) is ignored."""
        tree = self.tree
        if tree is None or probed is tree or set(probed.nodes) != set(tree.nodes):
            return
        for name, node in probed.nodes.items():
            mine = tree.nodes[name]
            mine.calls, mine.output_shapes, mine.output_dtype = node.calls, list(node.output_shapes), node.output_dtype
            mine.inplace, mine.output_bytes = node.inplace, node.output_bytes
        tree.probed, tree.probe_seconds = probed.probed, probed.probe_seconds
        tree.call_order, tree.call_io = list(probed.call_order), list(probed.call_io)
        self.tree_measured.emit(tree)

    def set_batch(self, batch: Batch | None, sources: list[str] | None = None) -> None:
        """Use a new input batch. Drops the capture (it was made from another batch)."""
        self.batch = batch
        self.batch_sources = list(sources) if sources is not None else []
        self.generation += 1
        self.batch_changed.emit(batch)
        if self.capture is not None:
            self.capture = None
            self.capture_path = None
            self.capture_changed.emit(None)

    # -- selection -------------------------------------------------------------------
    def _set_selection(self, names: Iterable[str], force: bool = False) -> None:
        names = frozenset(names)
        if self.tree is not None:
            names = frozenset(n for n in names if n in self.tree and n != "")
        if names == self.selection and not force:
            return
        self.selection = names
        self.selection_changed.emit(names)

    def set_selection(self, names: Iterable[str]) -> None:
        """Select exactly ``names`` (unknown names are dropped)."""
        self._set_selection(names)

    def select(self, names: Iterable[str], on: bool = True) -> None:
        """Add ``names`` to the selection (or remove them with ``on=False``)."""
        names = set(names)
        self._set_selection(self.selection | names if on else self.selection - names)

    def select_patterns(self, patterns: str | Iterable[str]) -> None:
        """Select the modules whose names equal or glob-match ``patterns``.

        Raises
        ------
        GradExplorerError
            When a pattern matches no module (near names suggested).
        """
        if self.model is None:
            raise GradExplorerError("No model is loaded.", "Load a model first.")
        self._set_selection(resolve_layers(self.model.module, patterns))

    def _leaves_under(self, name: str) -> list[str]:
        assert self.tree is not None
        node = self.tree[name]
        if node.is_leaf:
            return [name] if name else []
        return [n for n in self.tree.descendants(name) if self.tree[n].is_leaf]

    def set_checked(self, name: str, checked: bool) -> None:
        """What ticking a row of the tree means.

        A leaf is selected or not. Ticking a container selects every leaf below it;
        unticking it deselects everything below it, and the container itself.
        """
        if self.tree is None or name not in self.tree:
            return
        node = self.tree[name]
        if node.is_leaf:
            self.select([name], checked)
        elif checked:
            self.select(self._leaves_under(name), True)
        else:
            self.select([name, *self.tree.descendants(name)], False)

    def select_children(self, name: str) -> None:
        """Select the direct children of ``name`` (their own outputs, containers included)."""
        if self.tree is not None and name in self.tree:
            self.select(self.tree[name].children, True)

    def select_type(self, type_name: str, on: bool = True) -> None:
        """Select (or deselect) every module of a type, e.g. ``Conv2d``."""
        if self.tree is not None:
            self.select(self.tree.of_type(type_name), on)

    def select_all_leaves(self) -> None:
        if self.tree is not None:
            self._set_selection(self.tree.leaves())

    def select_none(self) -> None:
        self._set_selection(())

    def selected_in_order(self) -> list[str]:
        """The selection in the tree's (registration) order."""
        if self.tree is None:
            return sorted(self.selection)
        return [n for n in self.tree.nodes if n in self.selection]

    # -- run settings ------------------------------------------------------------------
    def _setting(self, name: str, value: Any) -> None:
        if getattr(self, name) == value:
            return
        setattr(self, name, value)
        self.settings_changed.emit(name)

    def set_target(self, target: str, output_key: str | None = None) -> None:
        """The target in text form (``top1``, ``class:N``, ``sum``, ``mean``,
        ``cross_entropy``) and the output element it applies to.

        Raises
        ------
        GradExplorerError
            When the text is not a target.
        """
        parsed = parse_target(target)
        key = output_key if output_key else None
        changed = str(parsed).split("@")[0] != self.target or key != self.output_key
        self.target = str(parsed).split("@")[0]
        self.output_key = key
        if changed:
            self.settings_changed.emit("target")

    def set_labels(self, text: str) -> None:
        """Labels for ``cross_entropy``: indices or class names, comma separated; empty
        uses the batch's own labels."""
        self._setting("labels_text", text.strip())

    def set_device(self, device: str) -> None:
        self._setting("device", device)

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise GradExplorerError(f"Unknown capture mode '{mode}'.", "Use 'full' or 'stats'.")
        self._setting("mode", mode)

    def set_train(self, train: bool) -> None:
        self._setting("train", bool(train))

    def set_input_grad(self, on: bool) -> None:
        self._setting("input_grad", bool(on))

    def set_memory_budget(self, budget: int | None) -> None:
        """Bytes a capture may use (``None``: half the free memory of the device)."""
        self._setting("memory_budget", budget)

    def apply_options(self, options: CaptureOptions) -> None:
        """Take the run settings of ``options``: target (with its output key), labels,
        mode, train, input gradient, autocast and memory budget; the device unless it is
        ``auto``. Settings already applied stay when a later one is refused. The model,
        batch and layers are the caller's to load (in a worker).

        ``gradexplorer --model X --target ... --run`` builds the options the ``capture``
        command would, and the window starts from them.

        Raises
        ------
        GradExplorerError
            The device is not on this machine.
        """
        target = parse_target(options.target)
        self.set_target(str(target).split("@")[0], target.output_key)
        self.set_labels(options.labels or "")
        self.set_mode(options.mode)
        self.set_train(options.train)
        self.set_input_grad(options.input_grad)
        self._setting("autocast", options.autocast)
        self.set_memory_budget(options.memory_budget)
        if options.device != "auto":
            self.set_device(str(resolve_device(options.device)))  # "cuda" -> "cuda:0", as listed

    # -- runs ------------------------------------------------------------------------
    def target_spec(self) -> str:
        return f"{self.target}@{self.output_key}" if self.output_key else self.target

    def capture_options(self, force: bool = False) -> CaptureOptions:
        """The session's settings as the options the CLI would build for the same capture.

        Parameters
        ----------
        force : bool
            Run even over the memory budget. The window asks the user before it runs
            (``MainWindow._memory_fits``), so its runs pass ``True``.

        Raises
        ------
        GradExplorerError
            No model is loaded, or a setting is not valid.
        """
        if self.model is None:
            raise GradExplorerError("No model is loaded.", "Choose a model in the Model panel first.")
        source = self.model_options
        hf_class = tokenizer = None
        if source is not None and source.model == self.model.spec:
            weights, arch, trust, hf_class = source.weights, source.arch, source.trust, source.hf_class
            tokenizer = source.tokenizer
        else:
            weights = self.model.weights
            if weights is not None and weights.startswith("file:"):
                weights = weights[len("file:"):]
            arch, trust = None, False
        return CaptureOptions(
            model=self.model.spec, weights=weights, arch=arch, trust=trust, hf_class=hf_class, tokenizer=tokenizer,
            batch=BatchSpec.from_sources(self.batch_sources), labels=self.labels_text or None,
            layers=self._layers_option(), target=self.target_spec(), device=self.device,
            mode=self.mode, train=self.train, input_grad=self.input_grad, autocast=self.autocast,
            memory_budget=self.memory_budget, force=force,
        )

    def _layers_option(self) -> tuple[str, ...]:
        """The options' layers: none (the default selection, which also holds the modules
        that own parameters themselves and those that compute without running their
        children: ``gradexplorer.capturing.selection``) while every leaf is ticked, as the
        command line does without ``--layers``; else the ticked modules."""
        if self.tree is not None and self.selection and self.selection == frozenset(self.tree.leaves()):
            return ()
        return tuple(self.selected_in_order())

    def run_request(self, new_generation: bool = True) -> RunRequest:
        """Copy what the next run needs, starting a new generation (unless told not to).

        Raises
        ------
        GradExplorerError
            No model, no batch, no layers selected, or labels that do not fit.
        """
        if self.model is None:
            raise GradExplorerError("No model is loaded.", "Choose a model in the Model panel first.")
        if self.batch is None:
            raise GradExplorerError("There is no input batch.", "Open images, a .pt tensor, or make a random batch.")
        if not self.selection:
            raise GradExplorerError("No layers are selected.", "Tick at least one layer in the module tree.")
        options = self.capture_options(force=True)
        request = RunRequest(options=options, loaded=self.model, batch=self.batch, tree=self.tree,
                             labels=None, generation=self.generation, lock=self._run_lock)
        job = request.job()
        job.load_batch()  # the labels: parsed, and required by cross_entropy
        request.labels = job.labels
        if new_generation:
            self.generation += 1
            request.generation = self.generation
        return request

    def begin_run(self) -> RunRequest:
        """Start a run: :meth:`run_request` and announce it (``run_started``)."""
        request = self.run_request()
        self.running_generation = request.generation
        self.run_started.emit(request.generation)
        return request

    def is_current(self, generation: int) -> bool:
        """Whether a run of ``generation`` is still the one the user waits for."""
        return generation == self.generation

    def finish_run(self, generation: int, result: Capture | BaseException | None,
                   seconds: float | None = None) -> str:
        """Take a run's outcome. Returns ``"ok"``, ``"stale"``, ``"cancelled"`` or ``"failed"``.

        A capture is kept only when ``generation`` is still current.
        """
        if generation == self.running_generation:
            self.running_generation = None
        if not self.is_current(generation):
            outcome = "stale"
        elif isinstance(result, CaptureCancelled):
            outcome = "cancelled"
        elif isinstance(result, BaseException) or result is None:
            outcome = "failed"
        else:
            outcome = "ok"
            self.capture = result
            self.capture_path = None
            self.last_run_seconds = seconds
            self._update_tree_from_capture(result)
            self.capture_changed.emit(result)
        self.run_finished.emit(generation, outcome)
        return outcome

    def cancel_runs(self) -> None:
        """Make any run in flight stale (its result will be dropped)."""
        self.generation += 1

    def run_capture(self, progress: ProgressCallback | None = None, cancel: Any = None) -> Capture:
        """Run a capture with the session's settings, synchronously, and return it.

        The plain function a worker thread calls; it does not change the session, not
        even the generation (hand the result to :meth:`finish_run` from the session's
        own thread).
        """
        return self.run_request(new_generation=False).run(progress, cancel)

    def _update_tree_from_capture(self, cap: Capture) -> None:
        # A run tells calls and shapes of the captured modules even when the probe could
        # not (a model whose input shape was unknown).
        if self.tree is None or self.tree.probed:
            return
        for name, layer in cap.layers.items():
            if name in self.tree:
                node = self.tree[name]
                node.calls = len(layer.calls)
                node.output_shapes = [tuple(c.shape) for c in layer.calls if c.shape or c.dtype]
                node.output_dtype = layer.calls[0].dtype if layer.calls else ""

    # -- capture files --------------------------------------------------------------
    def open_capture(self, cap: Capture, path: str | None = None) -> None:
        """Show a capture read from a file.

        When it was made from the loaded model, the model stays; otherwise the model is
        put aside and the tree is rebuilt from the capture's layer names, so every view
        works without the model.
        """
        self.generation += 1
        same_model = self.model is not None and cap.meta.get("model") == self.model.spec and self.tree is not None \
            and all(n in self.tree for n in cap.layer_order)
        if not same_model:
            types = {name: rec.type for name, rec in cap.layers.items()}
            root_name = str(cap.meta.get("model_name") or cap.meta.get("model") or "model")
            tree = tree_from_names(cap.layer_order, types, root_name)
            for name, rec in cap.layers.items():
                node = tree[name]
                node.calls = len(rec.calls)
                # The parameters the capture holds a gradient of: the model's are not here (the
                # tree had said "0 parameters").
                node.own_params = sum(int(s["numel"]) for s in rec.param_stats.values() if s)
                # A dataset capture records no shape (nor dtype): unknown, not a scalar.
                node.output_shapes = [tuple(c.shape) for c in rec.calls if c.shape or c.dtype]
                node.output_dtype = rec.calls[0].dtype if rec.calls else ""
            for node in sorted(tree.nodes.values(), key=lambda n: -n.depth):  # sums, innermost first
                node.total_params += node.own_params
                if node.parent is not None:
                    tree.nodes[node.parent].total_params += node.total_params
            self.model, self.tree, self.output_keys, self.probe_error = None, tree, [], None
            self.batch, self.batch_sources = None, []
            self.model_changed.emit(None)
            self.tree_changed.emit(tree)
            self.batch_changed.emit(None)
            self._set_selection(cap.layer_order, force=True)
        self.capture = cap
        self.capture_path = str(path) if path is not None else None
        self.capture_changed.emit(cap)

    @property
    def run_lock(self) -> threading.Lock:
        """Held while hooks are on the model (runs and probes): two must never meet."""
        return self._run_lock

    def files_read(self) -> list[str]:
        """The files the session read: the model (a file, or a factory's file), its weights,
        labels and tokenizer, the batch's sources (a folder stands for its files), the capture
        file opened. An export written over one of them would destroy it: every export checks its
        path against these (``gradexplorer.base.file_write.check_output_path``, by inode)."""
        o = self.model_options
        read = [o.model, o.weights, o.labels, o.tokenizer] if o is not None else []
        # A text sample names a file only when it is one (a .txt of samples): the prefix goes.
        read += [s[len(TEXT_SOURCE):] if s.startswith(TEXT_SOURCE) else s for s in self.batch_sources]
        if self.capture_path:
            read.append(self.capture_path)
        return [r for r in read if r]

    # -- facts for the GUI -------------------------------------------------------------
    @property
    def categories(self) -> list[str] | None:
        if self.model is not None and self.model.categories is not None:
            return self.model.categories
        if self.capture is not None:
            return self.capture.meta.get("categories")
        return None

    def can_run(self) -> bool:
        return self.model is not None and self.batch is not None and bool(self.selection)


def probe_failed_message(error: GradExplorerError | None) -> str:
    """One line for the status bar when the probe forward failed."""
    if error is None:
        return ""
    if isinstance(error, CaptureError):
        return f"The module tree has no shapes yet: {error.problem}"
    return str(error)
