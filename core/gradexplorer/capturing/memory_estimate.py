"""How much memory a capture will hold, told before anything is allocated.

The estimate follows what ``gradexplorer.capturing.capture`` keeps, tensor by tensor, using what one probe
forward (``ModuleTree.probe``) saw: each call's output and first input, their sizes, and
their identity (the same tensor object at the same version counter):

* activations: one per call of a selected module. Capture copies each to the CPU, except
  (on the CPU, from the second full capture of a model on) outputs it learnt are never
  modified later: those are kept as they are, so a module that returns its input
  unchanged (``Dropout`` in eval, ``Identity``) then shares the previous output's memory.
* gradients: capture hooks each tensor value once and gives its gradient to every record
  that saw it (a module's input gradient is usually the previous module's output
  gradient), so unique tensor values are counted. Two sharing rules of autograd matter:
  an in-place ``+=`` outside any module (ResNet, EfficientNet residuals) passes the same
  gradient to the value before and after it; and an output that no later module takes
  as its input (a residual branch, a ``cat`` branch, ``flatten`` before the classifier)
  gets its gradient as a view of, or the very tensor of, a gradient that is counted
  elsewhere, so it adds nothing.
* parameter gradients: a copy per trainable parameter of each selected module.
* input, output, input gradient, and the statistics (a 64-bin histogram and a few
  numbers per tensor: about 1 KiB each).

Statistics-only captures hold only the statistics, whatever the batch size: layers x
calls x about 1 KiB. ``transient`` is the working memory of the forward and backward
pass itself (what autograd saves, roughly every module output once, plus the gradients
of all parameters), needed on the run's device while the capture runs, whatever is
selected.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from gradexplorer.base import devices
from gradexplorer.base.units import counted, format_bytes
from gradexplorer.capturing.inputs import ModelInputs
from gradexplorer.capturing.module_tree import ModuleTree, TensorKey
from gradexplorer.stats.record import TensorStats
from gradexplorer.stats.tensor_stats import tensor_stats

if TYPE_CHECKING:
    from gradexplorer.capturing.data import Capture

#: Share of the free memory a capture may use before ``check_budget`` warns.
BUDGET_SHARE = 0.5


def _stats_dict_bytes() -> int:
    stats = tensor_stats(torch.arange(4.0))
    size = sys.getsizeof(stats)
    for value in stats.values():
        if isinstance(value, torch.Tensor):
            size += value.untyped_storage().nbytes() + sys.getsizeof(value)
        else:
            size += sys.getsizeof(value)
    return size


#: Bytes one statistics dict holds (its histogram, numbers and the dict itself).
STATS_BYTES = _stats_dict_bytes()


@dataclass
class MemoryEstimate:
    """Bytes a capture will hold, by kind.

    Attributes
    ----------
    activations, grad_outputs, grad_inputs, param_grads : int
        Tensors of the selected layers (0 in statistics-only mode). ``grad_inputs`` counts
        only input gradients that are not also some selected call's output gradient.
    io : int
        The input batch, the output, and the input gradient when asked for.
    stats : int
        The statistics dicts.
    transient : int
        Working memory of the forward and backward pass on the run's device, freed when
        the capture returns (not in ``total``).
    mode : str
    layers, calls : int
        Selected layers and their calls per forward.
    moments : int
        A dataset capture's element-wise gradient moments across batches (its gradient
        signal-to-noise ratio): two float64 values per recorded parameter element, on this
        rank (a part of them when the model is sharded). Held to the end, where the
        gradients are: in ``total`` on the CPU, in ``transient`` on a GPU
        (``moments_on_device``).
    moments_on_device : bool
        The moments live on the run's GPU rather than in RAM.
    shard_world : int
        Ranks the model's parameters are sharded over (1: whole on every rank).
    shard_params : int
        With a sharded model: this rank's shards of every parameter (in ``transient``).
    gathered : int
        With a sharded model: the parameters gathered whole at once (a block and the next
        one fetched ahead) and a block's gradients (in ``transient``).
    """

    activations: int = 0
    grad_outputs: int = 0
    grad_inputs: int = 0
    param_grads: int = 0
    io: int = 0
    stats: int = 0
    transient: int = 0
    mode: str = "full"
    layers: int = 0
    calls: int = 0
    moments: int = 0
    moments_on_device: bool = False
    shard_world: int = 1
    shard_params: int = 0
    gathered: int = 0

    @property
    def gradients(self) -> int:
        return self.grad_outputs + self.grad_inputs + self.param_grads

    @property
    def total(self) -> int:
        """Bytes held by the finished capture."""
        in_ram = 0 if self.moments_on_device else self.moments
        return self.activations + self.gradients + self.io + self.stats + in_ram

    def describe(self) -> str:
        """One line for the Run button and the CLI, e.g.
        ``"≈ 1.2 GiB (activations 600 MiB, gradients 550 MiB, input/output 12 MiB)"``."""
        if self.mode == "stats":
            moments = (f", gradient moments {format_bytes(self.moments)}"
                       if self.moments and not self.moments_on_device else "")
            line = (f"≈ {format_bytes(self.total)} (statistics only: {counted(self.layers, 'layer')} × "
                    f"{counted(self.calls, 'call')}, bounded; input/output {format_bytes(self.io)}{moments})")
            if self.shard_world > 1:
                on_device = self.moments if self.moments_on_device else 0
                batch = self.transient - self.shard_params - self.gathered - on_device
                line += (f"; while running, per rank ≈ {format_bytes(self.transient)} (parameters sharded over "
                         f"{counted(self.shard_world, 'rank')}: {format_bytes(self.shard_params)}, blocks gathered "
                         f"whole {format_bytes(self.gathered)}, a batch's forward and backward {format_bytes(batch)}"
                         + (f", gradient moments {format_bytes(on_device)}" if on_device else "") + ")")
            elif self.moments_on_device:
                line += f"; on the device, gradient moments {format_bytes(self.moments)}"
            return line
        parts = [f"activations {format_bytes(self.activations)}",
                 f"gradients {format_bytes(self.grad_outputs + self.grad_inputs)}"]
        if self.param_grads:
            parts.append(f"parameter gradients {format_bytes(self.param_grads)}")
        parts.append(f"input/output {format_bytes(self.io)}")
        return f"≈ {format_bytes(self.total)} ({', '.join(parts)})"


def _input_bytes(inputs: torch.Tensor | ModelInputs | tuple | None) -> int:
    if isinstance(inputs, torch.Tensor):
        return inputs.numel() * inputs.element_size()
    if inputs is None:
        return 0
    if isinstance(inputs, ModelInputs):
        return _input_bytes(inputs.primary)
    shape, dtype = (inputs, torch.float32) if isinstance(inputs[0], int) else inputs
    n = 1
    for s in shape:
        n *= int(s)
    return n * torch.empty((), dtype=dtype).element_size()


def estimate_capture_memory(
    tree: ModuleTree,
    selected: list[str],
    mode: str = "full",
    inputs: torch.Tensor | ModelInputs | tuple | None = None,
    input_grad: bool = False,
    model: nn.Module | None = None,
) -> MemoryEstimate:
    """Estimate the memory a capture of ``selected`` will hold, from a probed tree.

    Parameters
    ----------
    tree : ModuleTree
        Probed (``tree.probe(model, x)``) with a batch of the size the capture will use.
    selected : list of str
        Qualified names of the layers to capture (``gradexplorer.capturing.selection.resolve_layers``).
    mode : {"full", "stats"}
    inputs : Tensor, ModelInputs, shape tuple, or (shape, dtype), optional
        The batch (only its size is used); defaults to what the probe saw. When it is
        larger or smaller than the probe's batch (a tree probed with one sample), the
        sizes the probe saw are scaled by the ratio of the two batches' bytes. For a model
        of several inputs (``ModelInputs``) the capture keeps the first (``primary``) and
        forward holds them all.
    input_grad : bool
        Whether the input gradient is asked for.
    model : nn.Module, optional
        The model (for its parameters and what capture already learnt about it); without
        it parameter gradients are not counted and every output is assumed trainable.

    Returns
    -------
    MemoryEstimate

    Raises
    ------
    ValueError
        When the tree has not been probed.
    """
    if not tree.probed or not tree.call_io:
        raise ValueError("estimate_capture_memory needs a probed ModuleTree (tree.probe(model, x)).")
    chosen = set(selected)
    params = _Trainable(model)
    root = tree.call_io[0]
    x_bytes = _input_bytes(inputs) if inputs is not None else root.input_bytes
    # Activations and gradients grow with the batch: scale a probe of another batch size.
    scale = x_bytes / root.input_bytes if root.input_bytes else 1.0

    walk = _CallWalk(tree, chosen, params, want_x_grad=input_grad or not params.any)
    walk.run()
    est = MemoryEstimate(mode=mode, layers=len(chosen), calls=walk.calls)
    param_bytes, param_count = params.selected_bytes(chosen)
    if mode == "full":
        est.activations = walk.activation_bytes
        est.grad_outputs, est.grad_inputs = _gradient_bytes(walk, root.output_key)
        est.param_grads = param_bytes
    for name in ("activations", "grad_outputs", "grad_inputs"):
        setattr(est, name, round(getattr(est, name) * scale))

    x_key = root.input_key
    x_grad_shared = x_key is not None and x_key in walk.grad_keys and mode == "full"
    est.io = x_bytes + round(root.output_bytes * scale)
    if input_grad and not x_grad_shared:
        est.io += x_bytes
    # One statistics dict per kept activation, per hooked tensor value, per parameter.
    est.stats = (walk.activation_count + len(walk.grad_keys) + param_count) * STATS_BYTES

    leaf_outputs = sum(c.output_bytes for c in tree.call_io if c.name and tree.nodes[c.name].is_leaf)
    # Forward holds every input of a model of several inputs, not only the recorded one.
    all_inputs = _all_input_bytes(inputs) if isinstance(inputs, ModelInputs) else x_bytes
    est.transient = round(leaf_outputs * scale) + params.all_bytes() + all_inputs
    return est


def _all_input_bytes(inputs: ModelInputs) -> int:
    return sum(_input_bytes(v) for v in (*inputs.args, *inputs.kwargs.values()) if isinstance(v, torch.Tensor))


class _Trainable:
    """Which modules of the model have trainable parameters, and their bytes."""

    def __init__(self, model: nn.Module | None):
        self.model = model
        self.modules = dict(model.named_modules()) if model is not None else {}
        #: Whether any parameter is trainable (without a model: assume so).
        self.any = model is None or any(p.requires_grad for p in model.parameters())

    def has(self, name: str, recurse: bool) -> bool:
        m = self.modules.get(name)
        if m is None:
            return self.model is None
        return any(p.requires_grad for p in m.parameters(recurse=recurse))

    def selected_bytes(self, chosen: set[str]) -> tuple[int, int]:
        """Bytes and count of the trainable parameters held by the ``chosen`` modules."""
        total = count = 0
        for name in chosen:
            m = self.modules.get(name)
            if m is None:
                continue
            for p in m.parameters(recurse=False):
                if p.requires_grad:
                    count += 1
                    total += p.numel() * p.element_size()
        return total, count

    def all_bytes(self) -> int:
        if self.model is None:
            return 0
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)


class _Event(NamedTuple):
    """A call's start or return, in the probe's time order."""

    tick: int
    returned: bool
    call: int


class _CallWalk:
    """Walk the probe's calls in time order, tracking which tensor values get gradients.

    After ``run``: ``grad_keys`` maps each hooked tensor value to ``"out"`` or ``"in"``
    (whether it was first met as a selected call's output or input); ``parent`` links a
    value changed in place outside any module to the value before (they share one
    gradient); ``consumed`` holds the values some module took as input.
    """

    def __init__(self, tree: ModuleTree, chosen: set[str], params: _Trainable, *, want_x_grad: bool):
        self.tree = tree
        self.chosen = chosen
        self.params = params
        self.own_trainable = {name: params.has(name, False) for name in tree.nodes}
        self.flags: dict[TensorKey, bool] = {}  # whether a value's gradient is computed
        x_key = tree.call_io[0].input_key
        if x_key is not None:
            self.flags[x_key] = want_x_grad
        self.size: dict[TensorKey, int] = {}
        self.parent: dict[TensorKey, TensorKey] = {}
        self.latest: dict[int, TensorKey] = {}  # serial -> latest version seen
        self.consumed: set[TensorKey] = set()
        self.grad_keys: dict[TensorKey, str] = {}
        self.input_flag: dict[int, bool] = {}
        self.seen_grad = False  # a trainable parameter or grad-requiring input came before
        self.shared_acts: set[TensorKey] = set()
        self.calls = 0
        self.activation_bytes = 0
        self.activation_count = 0

    def run(self) -> None:
        events = []
        for i, call in enumerate(self.tree.call_io):
            events.append(_Event(call.start, False, i))
            events.append(_Event(call.end, True, i))
        for event in sorted(events):
            if event.returned:
                self._returned(event.call)
            else:
                self._started(event.call)

    def _see(self, key: TensorKey) -> None:
        if self.latest.get(key.serial, key) <= key:
            self.latest[key.serial] = key

    def _started(self, i: int) -> None:
        call = self.tree.call_io[i]
        key = call.input_key
        flag = False
        if key is not None:
            self.size.setdefault(key, call.input_bytes)
            if key not in self.flags:
                last = self.latest.get(key.serial)
                if last is not None and last.version < key.version:
                    # Changed in place outside any module (``+=``): same gradient.
                    self.parent[key] = last
                    self.flags[key] = self.flags.get(last, self.seen_grad)
                else:
                    self.flags[key] = self.seen_grad
            flag = self.flags[key]
            if call.name:
                self.consumed.add(key)
            self._see(key)
            self.seen_grad |= flag
        self.input_flag[i] = flag
        if self.own_trainable.get(call.name, False):
            self.seen_grad = True

    def _returned(self, i: int) -> None:
        call = self.tree.call_io[i]
        key = call.output_key
        if key is not None:
            self.size.setdefault(key, call.output_bytes)
            self.flags.setdefault(key, self.seen_grad or self.params.has(call.name, True))
            self._see(key)
        if call.name not in self.chosen:
            return
        self.calls += 1
        if key is not None:
            if key not in self.shared_acts:
                # Capture keeps one summary and one copy (or none) per tensor value, however
                # many calls return it.
                self.shared_acts.add(key)
                self.activation_count += 1
                self.activation_bytes += call.output_bytes
            if self.flags[key]:
                self.grad_keys.setdefault(key, "out")
        if call.input_key is not None and self.input_flag[i]:
            self.grad_keys.setdefault(call.input_key, "in")

    def group_of(self, key: TensorKey) -> TensorKey:
        """The value before any in-place changes outside modules: one gradient for all."""
        while key in self.parent:
            key = self.parent[key]
        return key


class _GradGroup(NamedTuple):
    """Tensor values that share one gradient tensor: its bytes and how it is counted."""

    bytes: int
    kind: str


def _gradient_bytes(walk: _CallWalk, root_out: TensorKey | None) -> tuple[int, int]:
    # Bytes of output gradients and of input gradients, one per group of shared values.
    x_key = walk.tree.call_io[0].input_key
    group_consumed = {walk.group_of(k) for k in walk.consumed}
    groups: dict[TensorKey, _GradGroup] = {}
    for key, kind in walk.grad_keys.items():
        group = walk.group_of(key)
        if group not in group_consumed and key != root_out and key != x_key:
            continue  # a branch whose gradient is a view of one counted elsewhere
        held = groups.get(group, _GradGroup(0, kind))
        groups[group] = _GradGroup(max(held.bytes, walk.size.get(key, 0)), held.kind)
    outputs = sum(g.bytes for g in groups.values() if g.kind == "out")
    inputs = sum(g.bytes for g in groups.values() if g.kind != "out")
    return outputs, inputs


def measure_capture_memory(capture: Capture) -> int:
    """Bytes a ``Capture`` holds: every tensor storage once (views and shared tensors
    counted once), plus its statistics dicts.

    Parameters
    ----------
    capture : gradexplorer.capturing.data.Capture

    Returns
    -------
    int
    """
    seen: set[tuple] = set()
    seen_stats: set[int] = set()
    total = 0

    def add(t: object) -> None:
        nonlocal total
        if not isinstance(t, torch.Tensor):
            return
        storage = t.untyped_storage()
        key = (t.device.type, t.device.index, storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()

    def add_stats(stats: TensorStats | None) -> None:
        nonlocal total
        if not stats or id(stats) in seen_stats:
            return
        seen_stats.add(id(stats))  # one dict is shared by the records that saw one tensor
        total += sys.getsizeof(stats)
        for value in stats.values():
            if isinstance(value, torch.Tensor):
                total += sys.getsizeof(value)
                add(value)
            else:
                total += sys.getsizeof(value)

    for t in capture.tensors():
        add(t)
    for _name, _i, call in capture.iter_calls():
        for stats in call.stats.values():
            add_stats(stats)
    for layer in capture.layers.values():
        for stats in layer.param_stats.values():
            add_stats(stats)
    return total


def largest_tensor_bytes(capture: Capture) -> int:
    """The largest single tensor a capture holds in its layers (activations, gradients,
    parameter gradients and histograms; not the input and output): the storage each
    tensor keeps alive, and each histogram's own bytes."""
    largest = 0

    def see(t: object, *, row: bool = False) -> None:
        # A tensor is judged by the storage it keeps alive; a histogram by itself,
        # because the histograms of one batch of statistics are rows of one table
        # (measure_capture_memory counts that table once).
        nonlocal largest
        if isinstance(t, torch.Tensor):
            size = t.numel() * t.element_size() if row else t.untyped_storage().nbytes()
            largest = max(largest, size)

    for _name, _i, call in capture.iter_calls():
        for t in (call.activation, call.grad_output, call.grad_input):
            see(t)
        for stats in call.stats.values():
            if stats:
                see(stats.get("hist"), row=True)
    for layer in capture.layers.values():
        for g in layer.param_grads.values():
            see(g)
        for stats in layer.param_stats.values():
            if stats:
                see(stats.get("hist"), row=True)
    return largest


def budget_bytes(device: str | torch.device = "cpu") -> int | None:
    """The memory a capture may use on ``device``: ``BUDGET_SHARE`` of what is free now.

    Returns
    -------
    int or None
        None when the free memory cannot be told.
    """
    free = devices.free_memory(device)  # looked up at call time: tests replace it
    return None if free is None else int(free * BUDGET_SHARE)


class Shortfall(NamedTuple):
    """A capture that does not fit its memory budget (:func:`budget_shortfall`).

    Attributes
    ----------
    need : int
        Bytes it needs where it does not fit: in RAM, what the capture keeps (``estimate.total``)
        plus, on the CPU, the working memory of forward and backward (``estimate.transient``);
        on a GPU, that working memory.
    budget : int
        Bytes allowed there.
    device : torch.device
        ``cpu`` for RAM, else the GPU whose working memory does not fit.
    set_by_user : bool
        The budget is ``CaptureOptions.memory_budget`` (else a share of the free memory).
    """

    need: int
    budget: int
    device: torch.device
    set_by_user: bool


class Budget(NamedTuple):
    """What a capture may use, read at one moment (:func:`read_budget`): the window reads it
    once with its estimate, so that the figure it shows is the one its check applies (free
    memory moves between a look and a click).

    Attributes
    ----------
    ram : int or None
        Bytes of RAM; None when the free memory cannot be told.
    device : int or None
        Bytes on the GPU a capture runs on (None on the CPU, or not told).
    set_by_user : bool
        The budget is ``CaptureOptions.memory_budget`` (else a share of the free memory).
    """

    ram: int | None
    device: int | None
    set_by_user: bool


def read_budget(device: str | torch.device = "cpu", budget: int | None = None) -> Budget:
    """The budget of a capture on ``device``: ``budget`` bytes when given (in RAM and on
    the device alike), else ``BUDGET_SHARE`` of what is free on each, now."""
    device = torch.device(device)
    if budget is not None:
        return Budget(budget, budget if device.type == "cuda" else None, True)
    return Budget(budget_bytes("cpu"), budget_bytes(device) if device.type == "cuda" else None, False)


def budget_shortfall(estimate: MemoryEstimate, device: str | torch.device = "cpu",
                     budget: int | Budget | None = None) -> Shortfall | None:
    """Where the capture does not fit, and by how much; None when it fits.

    The finished capture lives in RAM (full tensors are moved to the CPU); the forward and
    backward pass need ``estimate.transient`` on the run's device as well.

    Parameters
    ----------
    estimate : MemoryEstimate
    device : str or torch.device
        Where the capture runs.
    budget : int or Budget, optional
        Bytes the capture may use, in RAM and on the device (``CaptureOptions.memory_budget``),
        or a budget read before (:func:`read_budget`); default: ``BUDGET_SHARE`` of what is
        free on each, now.

    Returns
    -------
    Shortfall or None
    """
    device = torch.device(device)
    limits = budget if isinstance(budget, Budget) else read_budget(device, budget)
    need_ram = estimate.total + (estimate.transient if device.type == "cpu" else 0)
    if limits.ram is not None and need_ram > limits.ram:
        return Shortfall(need_ram, limits.ram, torch.device("cpu"), limits.set_by_user)
    if device.type == "cuda" and limits.device is not None and estimate.transient > limits.device:
        return Shortfall(estimate.transient, limits.device, device, limits.set_by_user)
    return None


def check_budget(estimate: MemoryEstimate, device: str | torch.device = "cpu",
                 budget: int | None = None) -> str | None:
    """A warning when the capture would not fit (:func:`budget_shortfall`), or None when it does.

    Parameters
    ----------
    estimate : MemoryEstimate
    device : str or torch.device
        Where the capture runs.
    budget : int, optional
        Bytes the capture may use (``CaptureOptions.memory_budget``); default:
        ``BUDGET_SHARE`` of what is free.

    Returns
    -------
    str or None
        The problem and what to do about it, in one or two sentences (the window's words).
    """
    short = budget_shortfall(estimate, device, budget)
    return None if short is None else budget_message(estimate, short)


def stats_only_fits(estimate: MemoryEstimate, short: Shortfall) -> bool:
    """Whether keeping statistics only would end this shortfall: the one case in which the
    window and the CLI advise switching (advising it where it cannot fit sent users round).

    Parameters
    ----------
    estimate : MemoryEstimate
        The estimate of a full capture.
    short : Shortfall
        Its shortfall (:func:`budget_shortfall`).
    """
    if estimate.mode != "full" or short.device.type != "cpu":
        return False  # on the GPU, forward and backward alone are over: statistics only needs them too
    # what statistics only keeps, plus what running adds in RAM (need_ram in budget_shortfall)
    return estimate.io + estimate.stats + (short.need - estimate.total) <= short.budget


def budget_message(estimate: MemoryEstimate, short: Shortfall) -> str:
    """The window's words for a shortfall: the problem and what to do about it
    (:func:`check_budget`; the CLI says it in its flags, ``gradexplorer.pipeline.job.OverBudget``)."""
    if short.device.type == "cpu":
        share = "the memory budget you set" if short.set_by_user else "half of the free RAM"
        held = estimate.total
        if stats_only_fits(estimate, short):
            fix = ("Switch to statistics-only capture (about "
                   f"{format_bytes(estimate.stats + estimate.io)}), or tick fewer layers.")
        else:
            fix = "Use a smaller batch, or a GPU."
        # The figure the estimate line showed (what the capture keeps), and what running adds.
        kept = f"≈ {format_bytes(held)}"
        needs = (f"{format_bytes(short.need)} of memory ({kept} kept, plus {format_bytes(short.need - held)} "
                 "while forward and backward run)" if short.need > held else f"{kept} of memory")
        return f"This capture needs {needs} but the budget is {format_bytes(short.budget)} ({share}). {fix}"
    share = "the memory budget you set" if short.set_by_user else "half of its free memory"
    return (f"The forward and backward pass need about {format_bytes(short.need)} on "
            f"{short.device} but the budget is {format_bytes(short.budget)} ({share}). "
            "Use a smaller batch, or run on the CPU.")
