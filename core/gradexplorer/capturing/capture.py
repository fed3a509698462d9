"""Capture: one forward and backward pass that records, for every selected module and
every call of it, the activation, the gradient with respect to that activation and to the
module's first input, and the gradients of the module's own parameters.

Why it is built this way (the hook facts behind it: docs/ARCHITECTURE.md, "Facts the code
relies on"):

* Module backward hooks are not used. The deprecated one reports the wrong tensors; the
  full one breaks on in-place ReLUs and ``+=`` residuals and never fires for dict outputs.
  Instead a forward hook takes note of the output's gradient edge (its node in the autograd
  graph and its place among the node's outputs), and a forward pre-hook of the input's; the
  backward is asked for the gradients at those edges with the parameters'. An edge taken (or
  a tensor hook registered) before an in-place change yields the gradient with respect to the
  value before the change, which is what the user means by "the gradient at this layer's
  output". Only small outputs' gradients are asked of the backward that way (up to
  ``EDGE_BYTES``, which it holds until it returns): larger ones and views (an in-place op on a
  view can reroute its gradient past its node) go to *tensor* hooks, summarised as backward
  produces them, and one of a node's several outputs to a pre-hook on the node, set after
  forward (autograd hands it ``None`` for an output the target does not use, where the
  backward's own answer is ``None`` also for a node it never reached). A tensor hook costs
  as much again as the rest of a small module's call: registering it, the engine calling
  back into Python, taking it off.
* The activation is summarised, and in full mode copied, inside the forward hook, in every
  capture: a later in-place op can overwrite it, and one through ``.data`` (or a kernel of
  the model's own) does so without moving its version counter, so neither the counter nor
  an earlier capture can promise that it stays as it is. Where two calls return one tensor
  object at one version (a block returning its last child's output), the second record
  reuses the first one's copy only after comparing the two, element for element (on the
  CPU; on a GPU it is summarised and copied again).
* Each call of a module gets its own record: the call index is bound into the closures.
* The hooks only take note (records, references, versions, call order) and hand the tensors
  to the statistics (``gradexplorer.stats.device.DeferredStats``), which summarise the
  small ones together at the end of forward and of backward (``gradexplorer.stats.batched``),
  and write them into their records when the capture's records are first read (writing a
  record cost more than computing it: ``gradexplorer.stats.pending``); where NaN/Inf began
  is read from those statistics at the end (``nonfinite``; the records are written first
  only when some tensor held NaN or Inf, an unwritten one being finite); the module
  tree is the one kept for this model (``structure``), and no garbage collection runs while
  the capture does. On a 200-layer MLP of 256-value tensors (``benchmarks/call_overhead.py``)
  each of these took microseconds of every call.
* A module's input is often the previous module's output, same object, same version:
  their gradients are the same tensor, so we hook it once and give it to both records.
* Backward is ``torch.autograd.grad`` with the trainable parameters (and the input, when
  asked, and any leaf tensor whose gradient a hook waits for) as ``inputs``: it runs the
  same graph as ``loss.backward()`` but returns the gradients instead of accumulating into
  ``.grad``, so the user's ``.grad`` is untouched.
* A tensor hook fires in every backward through its tensor, also in one the model's own
  forward runs (``torch.autograd.grad(energy, pos, create_graph=True)`` in a force field,
  a gradient penalty, a PINN). The hooks record only while the capture's own backward
  runs, so each gradient is the one ``torch.autograd.grad(target, tensor)`` gives.
* Autograd hands a hook ``None`` for an output of a multi-output node that the target does
  not use (``nn.LSTM``'s sequence output when only ``h_n`` is read): recorded as absent,
  with the reason (``CallRecord.absent``), as is every gradient a call lacks.
* The default selection (``layers=None``, ``gradexplorer.capturing.selection``) holds every
  leaf and every module that owns trainable parameters itself (the root is ``""``), so that
  every trainable parameter's gradient is in the capture under the module that owns it;
  the hooks also record each container in a call that ran no other module
  (``nn.MultiheadAttention``, which uses its ``out_proj``'s weight itself). A selected
  module that never ran has a record without calls (``LayerRecord.called``).
* Every hook is registered through ``gradexplorer.hooks.hooks_installed``, which removes
  them all in ``finally``; the module modes, every buffer (in train and in eval mode) and
  the device are restored too.
"""

from __future__ import annotations

import datetime as _dt
import functools
import gc
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from typing import Any, cast

import torch
from torch import nn
from torch.autograd.graph import GradientEdge

from gradexplorer.base import devices
from gradexplorer.base.errors import CaptureCancelled, CaptureError, GradExplorerError
from gradexplorer.base.forward_errors import forward_fix
from gradexplorer.capturing import compiled, recomputation
from gradexplorer.capturing.data import (
    CHANGED_INPUT,
    FROZEN,
    NO_GRAD_REQUIRED,
    NO_TENSOR_INPUT,
    NO_TENSOR_OUTPUT,
    NOT_REACHED,
    UNUSED_OUTPUT,
    CallRecord,
    Capture,
    LayerRecord,
    records_pending,
)
from gradexplorer.capturing.inputs import ModelInputs, first_tensor_input
from gradexplorer.capturing.nonfinite import Note, OnsetTracker
from gradexplorer.capturing.selection import LayerSpec
from gradexplorer.capturing.settings import (
    CancelFlag as CancelFlag,  # (re-exported: the pipeline's and the recorders' type of a cancel flag)
    CaptureSettings,
    ProgressCallback as ProgressCallback,
    RecordSettings,
    ReportSettings,
    RunSettings,
)
from gradexplorer.capturing.sharded_params import refuse_sharded_params
from gradexplorer.capturing.structure import ModelStructure, structure_of
from gradexplorer.capturing.targets import Target, parse_target, select_output, target_scalar
from gradexplorer.hooks.installed import Hooks, hooks_installed, model_device
from gradexplorer.stats.device import SMALL_DTYPES, SMALL_VALUES, DeferredStats
from gradexplorer.stats.moments import HIST_EXACT_LIMIT
from gradexplorer.stats.pending import PendingRecords
from gradexplorer.stats.record import TensorStats

MODES = ("full", "stats")



def primary_tensor(output: Any) -> tuple[str, torch.Tensor | None]:
    """The tensor gradexplorer records for a module output, with the key that found it.

    A tensor is itself (key ``""``); for tuples, namedtuples, lists and dicts, the first
    floating-point tensor in order (key ``"0"``, ``"out"``, ``"0.1"``...).
    """
    if isinstance(output, torch.Tensor):
        return "", output
    items: list
    if isinstance(output, Mapping):
        items = [(str(k), v) for k, v in output.items()]
    elif isinstance(output, (tuple, list)):
        fields = getattr(output, "_fields", None)
        items = [(fields[i] if fields else str(i), v) for i, v in enumerate(output)]
    else:
        return "", None
    fallback: tuple[str, torch.Tensor | None] = ("", None)
    for key, value in items:
        sub_key, t = primary_tensor(value)
        if t is None:
            continue
        full_key = f"{key}.{sub_key}" if sub_key else key
        if t.is_floating_point() or t.is_complex():
            return full_key, t
        if fallback[1] is None:
            fallback = (full_key, t)
    return fallback


#: Share of the machine's memory one capture may pin (page-lock) for its copies from a GPU.
#: Pinned copies run without waiting (far faster than synchronous copies to ordinary
#: memory in a full capture on a GPU: docs/benchmarks.md), but pinned memory
#: cannot be swapped and PyTorch keeps freed pinned blocks for reuse: past this share,
#: copies are synchronous ones.
PINNED_SHARE = 0.25


#: Share of the device memory free at a capture's start that ``keep_on_device`` may fill
#: with kept tensors; the rest is left to forward and backward. Past it, tensors are
#: copied to the host as without the option.
KEEP_SHARE = 0.5


def _pinned_budget() -> int:
    total = devices.meminfo_bytes("MemTotal")  # looked up at call time: tests replace it
    return int(total * PINNED_SHARE) if total else 4 << 30


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same values, NaN facing NaN included."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b) or (
        a.is_floating_point() and torch.isnan(a).any() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)))


def _new_call() -> CallRecord:
    """``CallRecord()``, made without the dataclass's ``__init__`` and its two factories
    (a capture makes one per module call): the same attributes, the same defaults
    (``test_records_made_by_the_hooks_are_default_ones``)."""
    call = _object_new(CallRecord)
    call.__dict__ = {"activation": None, "grad_output": None, "grad_input": None,
                     "stats": {"activation": None, "grad_output": None, "grad_input": None},
                     "output_key": "", "shape": (), "dtype": "", "absent": {}}
    return call


def _new_layer(type_name: str) -> LayerRecord:
    """``LayerRecord(type_name)``, made as ``_new_call`` makes a call's (one per module)."""
    layer = _object_new(LayerRecord)
    layer.__dict__ = {"type": type_name, "calls": [], "param_grads": {}, "param_stats": {}, "param_absent": {}}
    return layer


_object_new = object.__new__
#: ``GradientEdge(node, output_nr)`` without the named tuple's ``__new__`` in Python.
_tuple_new = tuple.__new__


#: Bytes of gradients one capture may ask of the backward itself (``_Recorder.edges``): they
#: are all held until it returns. Past it, gradients go to hooks, summarised as they come.
EDGE_BYTES = 64 << 20
#: The largest gradient asked of the backward itself; larger ones go to hooks.
_EDGE_MAX_BYTES = 1 << 17
#: With progress or cancel, one in this many gradients asked of the backward itself also
#: gets a hook that reports progress and checks the flag (cancel stays prompt).
_TICK_EVERY = 16
#: ``torch._C._current_autograd_node``: the node the engine runs while a hook is called.
_current_node = torch._C._current_autograd_node

#: ``recomputation.recomputing()`` and ``torch.is_grad_enabled()``, called without a Python
#: frame of ours in the hooks that every module call runs.
_graph_task_id = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled

_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    """``"float32"`` for ``torch.float32``: what a record says (kept: it runs at every call)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text or "not enough memory" in text
    )


def _oom_error(device: torch.device, exc: BaseException) -> CaptureError:
    where = "GPU" if device.type == "cuda" else "memory"
    return CaptureError(
        f"The capture ran out of {where} on {device} ({str(exc).splitlines()[0][:160]}).",
        "Tick fewer layers, switch to statistics-only capture, or use a smaller batch.",
    )


class _Recorder:
    """The state of one capture while hooks run; nothing here outlives ``capture``."""

    def __init__(self, model: nn.Module, selected: list[str], mode: str, device: torch.device,
                 progress: ProgressCallback | None, cancel: CancelFlag | None,
                 expected_calls: int, hist_limit: int | None, keep_on_device: bool = False,
                 computing: set[str] | None = None, structure: ModelStructure | None = None):
        self.model = model
        self.selected = set(selected)
        # id(module) -> name, for the hooks that every module shares (_module_hooks).
        self.names: dict[int, str] = structure.name_by_id if structure is not None else {
            id(m): n for n, m in model.named_modules()}
        # Modules recorded for each call in which they ran no other module (the default
        # selection's containers that compute by themselves: ``selection``'s docstring).
        self.computing = computing or set()
        self.full = mode == "full"
        self.device = device
        self.progress = progress
        self.cancel = cancel
        # Whether the hooks check the cancel flag and report progress at all (_tick).
        self.ticking = progress is not None or cancel is not None
        self.hist_limit = hist_limit
        # The small tensors' statistics are written into their records when the capture's
        # records are first read (gradexplorer.stats.pending: Capture.layers).
        self.pending = PendingRecords()
        self.summaries = DeferredStats(hist_limit, later=self.pending)
        # Where NaN/Inf began (core/gradexplorer/capturing/nonfinite.py); which modules have children
        # is known from the module tree kept for this model.
        # (grad_sinks, below: the onset reads recorded outputs' sources from it)
        self.grad_sinks: dict[tuple[int, int], tuple[weakref.ref, list[tuple[CallRecord, str]]]] = {}
        self.onset = OnsetTracker(structure.children_of if structure is not None else None, self.grad_sinks)
        self.pinned_left: int | None = None  # bytes, measured at the first GPU copy
        # Bytes of device memory kept tensors may still take (keep_on_device); None: none.
        self.device_left: int | None = None
        if keep_on_device and self.full and device.type != "cpu":
            free = devices.free_memory(device)  # looked up at call time: tests replace it
            self.device_left = int(free * KEEP_SHARE) if free is not None else None
        self.records: dict[str, LayerRecord] = {}
        self.first_call: dict[str, int] = {}
        # The calls running now, outermost first, each with what its forward hook needs:
        # [name, whether it ran another module, the onset's note (OnsetTracker.enter),
        #  its CallRecord (a selected module's call) or None,
        #  its tensor inputs with their versions (a selected module's call), or
        #  (call count at start, those inputs, first input with its version) (a call of a
        #  ``computing`` module), or None].
        self.running: list[list] = []
        self.call_count = 0
        self.expected_calls = max(expected_calls, 1)
        # (id, version) of a hooked tensor -> (weak reference to it, [(record, attr)]): one
        # hook per value. Weak, as in ``activations``: a capture that held every output
        # until the end made backward 6% slower (the memory autograd frees and reuses).
        # (self.grad_sinks, made above)
        # id of a gradient handed to a hook -> (weak reference to it, its version, its stats,
        # what was kept of it). Autograd hands one gradient object to several hooks (both
        # sides of ``out += identity``; a module's output and the next one's input when they
        # are different objects over one value): one summary serves them all (resnet50: 9%
        # of the values a capture summarised, vit_b_16: 19%).
        self.grad_values: dict[int, tuple[weakref.ref, int, TensorStats, torch.Tensor | None]] = {}
        self.hooks = Hooks()  # replaced by the capture's own while it runs (install)
        # True only while the capture's own backward runs: tensor hooks also fire in a
        # backward that the model's forward runs itself (``_watch_grad``).
        self.own_backward = False
        # Leaf tensors whose gradient is watched (_watch_grad): asked of the backward too.
        self.leaves: list[torch.Tensor] = []
        # Gradients asked of the backward itself, as edges of its graph, instead of handed
        # to a tensor hook (_watch_grad): a hook costs as much again as the rest of a small
        # module's call (registering it, the engine calling back into Python, taking it
        # off). torch.autograd.grad returns them all at its end, so their bytes are bounded.
        self.edges: list[GradientEdge] = []
        self.edge_sinks: list[list[tuple[CallRecord, str]]] = []
        self.edge_bytes_left = EDGE_BYTES
        self.edge_ticked = 0  # edges' gradients counted by _tick_in_backward
        self.grads_expected = 0
        self.grads_seen = 0
        self.last_report = 0.0
        # (name, call index) in the order the calls returned: gradexplorer.comparison.compare's forward order.
        self.call_order: list[list] = []
        # (id, version) of an output -> (weak reference to it, its stats, what was kept of it).
        self.activations: dict[tuple[int, int], tuple] = {}

    def backward_running(self) -> bool:
        return self.own_backward

    def to_host(self, t: torch.Tensor, copy: bool) -> torch.Tensor:
        """``t`` on the CPU. From a CUDA device the copy is queued into pinned memory without
        waiting, while the capture's pinned budget lasts: ``capture`` synchronises once
        before it returns (a synchronous copy per tensor stalled the GPU hundreds of times
        per capture)."""
        t = t.detach()
        if t.is_cuda:
            size = t.numel() * t.element_size()
            if self.pinned_left is None:
                self.pinned_left = _pinned_budget()
            if size <= self.pinned_left:
                self.pinned_left -= size
                return t.to("cpu", non_blocking=True)
            return t.to("cpu")
        return t.to("cpu", copy=copy)

    def keep(self, t: torch.Tensor, copy: bool) -> torch.Tensor:
        """What a full capture keeps of ``t``: ``t`` itself (or a copy of it on its device,
        with ``copy``) while the ``keep_on_device`` budget lasts, else ``to_host``."""
        t = t.detach()
        if t.is_cpu:  # (most of a CPU capture: no device budget, no transfer)
            return t.clone() if copy else t
        if self.device_left is not None:
            size = t.numel() * t.element_size()
            if size <= self.device_left:
                self.device_left -= size
                return t.clone() if copy else t
            self.device_left = 0  # full: the next tensors go to the host, in order
        return self.to_host(t, copy)

    # -- progress and cancel ------------------------------------------------------
    def _tick(self, stage: str, done: int, total: int, force: bool = False) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise CaptureCancelled()
        if self.progress is not None:
            now = time.monotonic()
            if force or now - self.last_report > 0.05:
                self.last_report = now
                self.progress(stage, min(done, total), total)

    # -- module hooks ---------------------------------------------------------------
    # Every hooked call runs these two hooks: they only take note (records, references,
    # versions, call order) and hand the tensors to the statistics, which summarise small
    # ones together later (gradexplorer.stats.device.DeferredStats). Written for speed.
    def pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if _graph_task_id() != -1:  # recomputation.recomputing(), without a call
            return None  # activation checkpointing re-running forward in backward
        name = self.names[id(module)]
        if not _grad_enabled() and recomputation.reentrant_checkpoint():
            raise recomputation.reentrant_refusal(name)
        self.call_count += 1
        if self.ticking:
            self._tick("forward", self.call_count, self.expected_calls)
        running = self.running
        if running:
            running[-1][1] = True  # the module running now ran another one
        if name in self.selected:
            rec = self.records.get(name)
            if rec is None:
                rec = self.records[name] = _new_layer(type(module).__name__)
                self.first_call[name] = self.call_count
            call = _object_new(CallRecord)  # _new_call, inline
            call.__dict__ = {"activation": None, "grad_output": None, "grad_input": None,
                             "stats": {"activation": None, "grad_output": None, "grad_input": None},
                             "output_key": "", "shape": (), "dtype": "", "absent": {}}
            calls = rec.calls
            calls.append(call)
            if len(args) == 1:  # (most calls: no comprehension's frame for one argument)
                x = args[0]
                inputs = [(x, x._version)] if isinstance(x, torch.Tensor) else []
            else:
                inputs = [(a, a._version) for a in args if isinstance(a, torch.Tensor)]
            # first_tensor_input: the first positional tensor, found above (most calls)
            x = inputs[0][0] if inputs else first_tensor_input(args, kwargs)
            if x is not None and x.requires_grad:  # (_watch_input, inline)
                joined = self._watch_grad(x, call, "grad_input")
            else:
                joined = self._watch_input(x, call)
            # The onset's note: when the one input is the output a recorded call returned (the
            # gradient sinks just joined: the same value), that call's record, read at the end
            # (OnsetTracker.linked); else the inputs' sources, taken now.
            index = len(calls) - 1  # (taken now: a module may call itself before this call returns)
            note = (joined[0][0] if joined is not None and joined[0][1] == "grad_output" and len(args) == 1
                    and len(inputs) == 1 and not kwargs and name != ""
                    else self.onset.enter(name, args, kwargs, index))
            running.append([name, False, note, call, inputs, index])
        elif name in self.computing:
            note = self.onset.enter(name, args, kwargs)
            x = first_tensor_input(args, kwargs)
            running.append([name, False, note, None,
                            (self.call_count, [(a, a._version) for a in args if isinstance(a, torch.Tensor)],
                             x if x is None else (x, x._version))])
        else:
            running.append([name, False, self.onset.enter(name, args, kwargs), None, None])
        return None

    def _watch_input(self, x: torch.Tensor | None, call: CallRecord) -> list[tuple[CallRecord, str]] | None:
        """Watch the gradient at ``x``, the call's input; the sinks of an earlier watch of the
        same value that it joined (``_watch_grad``), or None."""
        if x is None:
            call.absent["grad_input"] = NO_TENSOR_INPUT
        elif not x.requires_grad:
            call.absent["grad_input"] = NO_GRAD_REQUIRED
        else:
            return self._watch_grad(x, call, "grad_input")
        return None

    def _leave(self, name: str) -> list | None:
        """Take the call of ``name`` off the running calls: its entry (``running``), or
        ``None`` when no call of it is running."""
        running = self.running
        if running and running[-1][0] == name:  # (the usual case: the innermost call returns)
            return running.pop()
        for i in range(len(running) - 2, -1, -1):
            if running[i][0] == name:
                entry = running[i]
                # Calls above it that never returned (a child whose exception the module
                # caught) end with it.
                del running[i:]
                return entry
        return None

    def forward_hook(self, module: nn.Module, args: tuple, output: Any) -> torch.Tensor | None:
        if _graph_task_id() != -1:  # recomputation.recomputing()
            return None
        name = self.names[id(module)]
        running = self.running
        entry: list | None
        if running and running[-1][0] == name:  # (_leave's usual case, inline: the innermost call returns)
            entry = running.pop()
        else:
            entry = self._leave(name)
            if entry is None:
                return None
        call = entry[3]
        if call is not None:  # a selected module's call
            return self._record_output(name, module, output, call, entry[5], entry[4], entry[2])
        if entry[4] is not None and not entry[1]:
            # A ``computing`` module's call that ran no other module (when it did, its
            # children computed: they are recorded, not it).
            start, inputs, first = entry[4]
            call = self._computing_call(name, module, start, first)
            return self._record_output(name, module, output, call, len(self.records[name].calls) - 1, inputs,
                                       entry[2])
        self._not_recorded(module, output, entry[2])
        return None

    def _not_recorded(self, module: nn.Module, output: Any, note: Note) -> None:
        _, y = primary_tensor(output)
        self.onset.leave(note, module, y)
        if self.cancel is not None:
            # Backward reaches selected layers only near its end when they sit near the
            # input: a check at every module's output keeps cancel prompt.
            if y is not None and y.requires_grad:
                self.hooks.tensor(y, self._cancel_check)
        return None

    def _computing_call(self, name: str, module: nn.Module, start: int,
                        first: tuple[torch.Tensor, int] | None) -> CallRecord:
        """The record of a call in which a container ran no other module: it is recorded as
        a leaf is (its gradient at the input taken now, on the value it was called with)."""
        rec = self.records.get(name)
        if rec is None:
            rec = self.records[name] = _new_layer(type(module).__name__)
            self.first_call[name] = start
        call = _new_call()
        rec.calls.append(call)
        if first is not None and first[0]._version != first[1]:
            call.absent["grad_input"] = CHANGED_INPUT
        else:
            self._watch_input(None if first is None else first[0], call)
        return call

    def _record_output(self, name: str, module: nn.Module, output: Any, call: CallRecord, index: int,
                       inputs: list, note: Note | CallRecord) -> torch.Tensor | None:
        y: torch.Tensor | None
        if isinstance(output, torch.Tensor):  # (most outputs: primary_tensor without the call)
            key, y = "", output
        else:
            key, y = primary_tensor(output)
        call.output_key = key
        if y is None:
            call.absent.update(activation=NO_TENSOR_OUTPUT, grad_output=NO_TENSOR_OUTPUT)
            if not isinstance(note, CallRecord):  # (a call without an output is no onset)
                self.onset.leave(note, module, None)
            return None
        replaced = None
        seen_as = y
        handed = False
        if key == "" and y.requires_grad:
            for a, v in inputs:  # one of the call's inputs, unchanged (same object, same version)
                if a is y and v == y._version:
                    handed = True
                    break
        if handed:
            # The module hands its input through unchanged (Identity, eval-mode Dropout).
            # Its "output gradient" is what flows back through the value it returned, not
            # every use of its input: give the output an identity of its own.
            replaced = y.clone()
            y = replaced
        call.shape = tuple(y.shape)
        call.dtype = _DTYPE_NAMES.get(y.dtype) or _dtype_name(y.dtype)
        self.call_order.append([name, index])
        # One key and one weak reference for y, shared by the maps below.
        known = ((id(y), y._version), weakref.ref(y))
        summaries = self.summaries
        now = summaries.now
        # Statistics only, a small output: its bytes copied at once into the capture's buffer
        # (gradexplorer.stats.immediate; the clone that _activation's batch needs cost more
        # than the rest of a small call's statistics). Most outputs of statistics-only capture.
        stats = (now(y) if now is not None and not self.full and 0 < y.numel() <= summaries.now_values
                 else None)
        if stats is None:  # (one the buffer cannot take, or full capture)
            stats, call.activation = self._activation(y, seen_as, known)
        call.stats["activation"] = stats
        if not isinstance(note, CallRecord):
            self.onset.leave(note, module, y, stats, known)
        else:  # its input was the output the call ``note`` returned (pre_hook)
            if not y.requires_grad:  # (then not among grad_sinks, where the onset finds the others)
                self.onset.known_stats(y, stats)
            self.onset.linked(call, note, module)
        if y.requires_grad:
            self._watch_grad(y, call, "grad_output", known)
        else:
            call.absent["grad_output"] = NO_GRAD_REQUIRED
        return replaced

    def _activation(self, y: torch.Tensor, seen_as: torch.Tensor,
                    known: tuple[tuple[int, int], weakref.ref]) -> tuple[TensorStats, torch.Tensor | None]:
        """The statistics of ``y`` and what a full capture keeps of it, as it is now.

        Always taken now, a copy in full mode: a later in-place operation would change
        ``y``, and one through ``.data`` (or a kernel of the model's own) does so without
        bumping its version counter, so no earlier capture, nor the counter, can promise
        that ``y`` stays as it is. ``seen_as`` is the tensor whose value ``y`` is (itself,
        or the input a pass-through module cloned): when an earlier call of this forward
        returned that very value and its copy is at hand on the same device, the two are
        compared, element for element, and the earlier record serves both when they are
        equal (an Identity, a block returning its last child's output).
        """
        summaries = self.summaries
        if not self.full:
            # Statistics only (an output the capture's buffer did not take: _record_output
            # offers it first): no copy is kept, so no earlier record can be compared with y
            # and serve it, nor can this one serve a later call: no note of it either.
            if (summaries.small_on and y.is_cpu and y.dtype in SMALL_DTYPES
                    and 0 < y.numel() <= SMALL_VALUES):  # as below
                return summaries.hold_small(y.detach().clone(memory_format=torch.contiguous_format)), None
            if summaries.batches(y):
                return summaries.summarize_later(y.detach().clone()), None
            return summaries.summarize(y), None
        value_key = known[0] if seen_as is y else (id(seen_as), seen_as._version)
        seen = self.activations.get(value_key)
        # No torch.no_grad() here (entering and leaving it cost a microsecond per call):
        # every tensor op below is on a detached y or returns no tensor.
        # Compared on the CPU only: on a GPU the comparison would wait for the device,
        # where summarising and copying again are cheap.
        if (seen is not None and seen[0]() is seen_as and seen[2] is not None
                and seen[2].is_cpu and y.is_cpu and _same_values(seen[2], y.detach())):
            stats, kept = seen[1], seen[2]
        elif (self.summaries.small_on and y.is_cpu and y.dtype in SMALL_DTYPES
              and 0 < y.numel() <= SMALL_VALUES):
            # A small CPU tensor (most of a small model's): a copy, summarised with the
            # others at the end of forward (DeferredStats.summarize and summarize_copy, inline).
            kept = y.detach().clone(memory_format=torch.contiguous_format)
            stats = self.summaries.hold_small(kept)
            if not self.full:
                kept = None
        elif self.summaries.batches(y):
            # Batched statistics: summarised with the others at the end of forward, from
            # a copy taken now (the one a full capture keeps, when it stays on y's device).
            kept = self.keep(y, copy=True) if self.full else None
            taken = kept if kept is not None and kept.device == y.device else y.detach().clone()
            stats = self.summaries.summarize_later(taken)
        elif not self.full:
            stats, kept = self.summaries.summarize(y), None
        else:
            # On the CPU the pass that computes the statistics writes the copy (one read).
            stats, kept = self.summaries.summarize_copy(y)
            if kept is None:
                kept = self.keep(y, copy=True)
        if y is seen_as:
            self.activations[value_key] = (known[1], stats, kept)
        else:  # a pass-through module's clone: the next one may hand it on
            self.activations[value_key] = (weakref.ref(seen_as), stats, kept)
            self.activations[known[0]] = (known[1], stats, kept)
        return stats, kept

    # -- gradients ------------------------------------------------------------------
    def _cancel_check(self, grad: torch.Tensor) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise CaptureCancelled()

    def _watch_grad(self, t: torch.Tensor, call: CallRecord, attr: str,
                    known: tuple[tuple[int, int], weakref.ref] | None = None) -> list[tuple[CallRecord, str]] | None:
        """Record the gradient at ``t`` (as it is now) into ``call``'s ``attr``. Returns the
        sinks of an earlier watch of the same value that this one joined (the first of them
        the call that returned it, when a recorded call did), or None for a new watch."""
        key = (id(t), t._version) if known is None else known[0]
        entry = self.grad_sinks.get(key)
        if entry is not None and entry[0]() is t:
            entry[1].append((call, attr))
            return entry[1]
        sinks: list[tuple[CallRecord, str]] = [(call, attr)]
        self.grad_sinks[key] = (weakref.ref(t) if known is None else known[1], sinks)
        self.grads_expected += 1
        if t.is_leaf:  # (no grad_fn: is_leaf reads a flag, grad_fn builds a Python object)
            # A leaf (a tensor the forward made to require grad: a force field's positions):
            # its hook fires only if the backward computes its gradient, which
            # torch.autograd.grad does for the tensors it is asked for.
            self.leaves.append(t)
        elif self.edge_bytes_left > 0:
            node = t.grad_fn
            size = t.numel() * t.element_size()
            # Asked of the backward itself (see _take_edge_grads) rather than handed to a
            # hook: a small tensor, not a view (an in-place op on a view can reroute its
            # gradient past its node: Hooks.gradient's case). Whether its node has other
            # outputs is asked after forward (settle_edges): inside a forward hook the
            # question took microseconds of every call.
            if node is not None and size <= _EDGE_MAX_BYTES and not t._is_view():
                self.edge_bytes_left -= size
                self.edges.append(_tuple_new(GradientEdge, (node, t.output_nr)))
                self.edge_sinks.append(sinks)
                if self.ticking and len(self.edges) % _TICK_EVERY == 0:
                    self.hooks.tensor(t, functools.partial(self._tick_in_backward, _TICK_EVERY))
                return None
        # Also when an in-place op on a view rebases its history (Hooks.gradient); only in
        # the capture's own backward, not in one the model's forward runs itself.
        self.hooks.gradient(t, functools.partial(self._on_grad, sinks), when=self.backward_running)
        return None

    def settle_edges(self) -> None:
        """After forward, before backward: each edge whose node has other outputs becomes a
        pre-hook on that node, recorded as a tensor hook's gradient would be. There,
        ``torch.autograd.grad`` returns ``None`` both for an output the target does not use
        and for a node the backward never reached; the pre-hook runs only in the first case,
        and hands it ``None`` (``UNUSED_OUTPUT``: ``nn.LSTM``'s sequence output when only
        ``h_n`` is read). A node that takes no pre-hook keeps its edge."""
        edges, sinks = self.edges, self.edge_sinks
        moved: set[int] = set()
        for i, edge in enumerate(edges):
            if len(edge.node._input_metadata) == 1:  # (the usual case: one output)
                continue
            try:
                self.hooks.node_prehook(edge.node, functools.partial(self._on_node_grads, edge.output_nr, sinks[i]))
            except (RuntimeError, AttributeError, TypeError):  # a node without pre-hooks: keep the edge
                continue
            moved.add(i)
        if moved:
            self.edges = [e for i, e in enumerate(edges) if i not in moved]
            self.edge_sinks = [s for i, s in enumerate(sinks) if i not in moved]

    def _on_node_grads(self, nr: int, sinks: list[tuple[CallRecord, str]],
                       grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        """A node pre-hook of ``settle_edges``: the gradient at the node's output ``nr``,
        in the capture's own backward only."""
        if self.backward_running():
            self._on_grad(sinks, grad_outputs[nr])

    def _on_grad(self, sinks: list[tuple[CallRecord, str]], grad: torch.Tensor | None) -> None:
        """A gradient handed to a hook during the capture's own backward."""
        self.grads_seen += 1
        if self.ticking:
            self._tick("backward", self.grads_seen, self.grads_expected)
        node = _current_node()
        self._record_grad(sinks, grad, node._sequence_nr() if node is not None else -1)

    def _record_grad(self, sinks: list[tuple[CallRecord, str]], grad: torch.Tensor | None, order: int | None) -> None:
        if grad is None:
            for rec, name in sinks:
                rec.absent[name] = UNUSED_OUTPUT
            return
        seen = self.grad_values.get(id(grad))
        if seen is not None and seen[1] == grad._version and seen[0]() is grad:
            stats, kept = seen[2], seen[3]
        else:
            # (No torch.no_grad(): the statistics and keep detach the gradient.)
            summaries = self.summaries
            if (summaries.small_on and grad.is_cpu and grad.dtype in SMALL_DTYPES
                    and 0 < grad.numel() <= SMALL_VALUES):  # summarize_later, inline
                stats = summaries.hold_small(grad.detach() if grad.requires_grad else grad)
            else:
                stats = summaries.summarize_later(grad)
            # Autograd does not modify a gradient it has handed to a hook while we hold
            # it, so on the CPU it is kept as it is (the tests compare after backward).
            kept = self.keep(grad, copy=False) if self.full else None
            self.grad_values[id(grad)] = (weakref.ref(grad), grad._version, stats, kept)
        if order is not None:  # (None: an edge's, read by the onset from the records at the end)
            self.onset.grad(stats, sinks, order)
        for rec, name in sinks:
            rec.stats[name] = stats
            if kept is not None:
                setattr(rec, name, kept)

    def _take_edge_grads(self, grads: Sequence[torch.Tensor | None]) -> None:
        """The gradients ``torch.autograd.grad`` returned for ``edges``, recorded as hooks
        would have recorded them (a ``None``: the backward never reached the tensor)."""
        summaries, grad_values = self.summaries, self.grad_values
        small = summaries.small_on and not self.full
        hold_small = summaries.hold_small
        for sinks, grad in zip(self.edge_sinks, grads):
            if grad is None:
                continue
            if (small and id(grad) not in grad_values and grad.is_cpu and grad.dtype in SMALL_DTYPES
                    and 0 < grad.numel() <= SMALL_VALUES):
                # _record_grad's usual case, inline (one per edge): a gradient no hook was
                # handed, held for the small batch, nothing kept.
                stats = hold_small(grad.detach() if grad.requires_grad else grad)
                grad_values[id(grad)] = (weakref.ref(grad), grad._version, stats, None)
                for rec, name in sinks:
                    rec.stats[name] = stats
            else:
                # (no order: the onset reads these from the records, OnsetTracker.result's edges)
                self._record_grad(sinks, grad, None)
        self.grads_seen += len(self.edges) - self.edge_ticked

    def _tick_in_backward(self, done: int, grad: torch.Tensor | None) -> None:
        """Progress and cancel in a backward whose small gradients come back at its end
        (``edges``): checked where it starts (``done`` 0) and at every ``_TICK_EVERY``-th
        of them (``done``: the edges' gradients computed by then, about)."""
        if self.backward_running():
            self.edge_ticked += done
            self.grads_seen += done
            self._tick("backward", self.grads_seen, self.grads_expected)

    def forward_failed_at(self) -> str:
        return self.running[-1][0] if self.running else ""


@contextmanager
def _module_hooks(structure: ModelStructure, recorder: _Recorder, hooks: Hooks) -> Iterator[None]:
    """Hooks on every module (progress, cancel, where forward failed), recording hooks on
    the selected ones, all through ``hooks``, which removes them; the recorder forgets the
    tensors it saw on exit, also when forward or backward raised."""
    recorder.hooks = hooks
    try:
        # Two hooks shared by every module, which look the module's name up
        # (recorder.names): no closure nor handle per module. The forward hook without
        # kwargs: the pre-hook took what the call was given.
        hooks.call_hooks(structure.modules, recorder.forward_hook, pre=recorder.pre_hook)
        yield
    finally:
        recorder.grad_sinks.clear()
        recorder.leaves.clear()
        recorder.edges.clear()
        recorder.edge_sinks.clear()
        recorder.grad_values.clear()
        recorder.activations.clear()


def _embedding_outputs(structure: ModelStructure, x: torch.Tensor, hooks: Hooks) -> list[tuple[str, torch.Tensor]]:
    """Hooks that collect, as forward runs, the output of each ``nn.Embedding`` call that
    reads the token ids ``x`` (a view of them counts: models reshape their ids), first
    first. The list fills during forward."""
    found: list[tuple[str, torch.Tensor]] = []

    def grab(name: str, args: tuple, kwargs: dict, output: Any) -> None:
        ids = first_tensor_input(args, kwargs)
        if (ids is None or found or not isinstance(output, torch.Tensor) or not output.requires_grad
                or ids.numel() != x.numel() or ids.data_ptr() != x.data_ptr()):
            return
        found.append((name, output))

    for name, module in structure.of_type(nn.Embedding):
        hooks.forward(module, lambda m, a, k, o, _n=name: grab(_n, a, k, o), with_kwargs=True)
    return found


def capture(
    model: nn.Module,
    inputs: torch.Tensor | ModelInputs,
    *,
    layers: LayerSpec = None,
    target: Target | str = "top1",
    labels: torch.Tensor | None = None,
    mode: str = "full",
    input_grad: bool = False,
    device: str | torch.device | None = None,
    train: bool = False,
    progress: ProgressCallback | None = None,
    cancel: CancelFlag | None = None,
    meta: dict | None = None,
    expected_calls: int | None = None,
    hist_exact_limit: int | None = None,
    autocast: str | None = None,
    keep_on_device: bool = False,
    settings: CaptureSettings | None = None,
) -> Capture:
    """Run one forward and backward pass and record gradients at the selected modules.

    Parameters
    ----------
    model : nn.Module
        Left as it was: hooks removed, modes and every buffer restored (BatchNorm's running
        statistics, a quantization-aware model's observers, in eval mode too), ``.grad``
        of every parameter untouched, device restored. A model under ``torch.compile`` is
        captured through its eager module (``model._orig_mod``, whose names the layers
        use); layers inside a compiled submodule are refused
        (``gradexplorer.capturing.compiled``).
    inputs : Tensor or ModelInputs
        The batch ``(B, ...)``; it is not modified. For a model of several inputs, all its
        arguments (``gradexplorer.capturing.inputs.ModelInputs``): the first tensor is the recorded input.
    layers : None, str, iterable of str, or callable
        Modules to record: ``None`` for the default selection (every leaf module, every
        module that owns trainable parameters itself, the root ``""`` included, and each
        module in a call that ran no other module: the module docstring), names or glob
        patterns (``"layer4.*"``), or a predicate ``(name, module) -> bool``.
    target : str or Target
        The scalar to differentiate (``gradexplorer.capturing.targets.parse_target``).
    labels : Tensor, optional
        Class indices, for ``cross_entropy``.
    mode : {"full", "stats"}
        ``full`` keeps activations and gradients (on the CPU) and statistics;
        ``stats`` keeps statistics only, computed on the device.
    input_grad : bool
        Also record the gradient with respect to the input batch.
    device : str or torch.device, optional
        Where to run; ``None`` runs where the model is. ``"auto"`` picks a GPU if any.
    train : bool
        Run in train mode (dropout active, BatchNorm batch statistics); eval by default.
    progress : callable, optional
        ``progress(stage, done, total)`` with stage ``"forward"`` or ``"backward"``.
    cancel : object with ``is_set()``, optional
        Checked at every module call and every gradient; when set the capture stops with
        ``CaptureCancelled`` and leaves the model as it was.
    meta : dict, optional
        Extra metadata (model, weights, categories...) stored in ``Capture.meta``.
    expected_calls : int, optional
        Module calls per forward (from ``gradexplorer.capturing.module_tree.ModuleTree.probe``), for progress.
    hist_exact_limit : int, optional
        Histogram subsampling threshold (``gradexplorer.stats.tensor_stats``); default
        ``gradexplorer.stats.moments.HIST_EXACT_LIMIT``.
    autocast : {None, "bf16", "fp16"}
        Run forward under ``torch.autocast`` with this dtype on the capture device
        (activations and their gradients are then of that dtype; parameter gradients stay
        in the parameters' dtype).
    keep_on_device : bool
        Full mode on a GPU: keep activations and gradients (of the layers, the parameters
        and the input) in device memory instead of copying them to the host, while they
        fit in ``KEEP_SHARE`` of the memory free there when the capture starts (later ones
        are copied as without the option). ``Capture.on_host`` copies them when they are
        viewed or saved (``gradexplorer.files.capture_file.save_capture`` does). No effect on the CPU
        or in statistics-only mode.
    settings : CaptureSettings, optional
        All of the above at once, one object per concern
        (``gradexplorer.capturing.settings``: what to record, where to run, what to report),
        as the pipeline passes them. With it, leave the other keywords at their defaults:
        one that is set as well is refused (``GradExplorerError``).

    Returns
    -------
    Capture

    Raises
    ------
    GradExplorerError
        Bad layers or target, a model whose parameters are split over ranks
        (``gradexplorer.capturing.sharded_params``); ``CaptureError`` when forward or backward
        fails (naming the module and the layers that ran) or memory runs out; ``CaptureCancelled``.
    """
    built = CaptureSettings(
        record=RecordSettings(layers=layers, target=target, labels=labels, mode=mode, input_grad=input_grad,
                              hist_exact_limit=hist_exact_limit, expected_calls=expected_calls),
        run=RunSettings(device=device, train=train, autocast=autocast, keep_on_device=keep_on_device),
        report=ReportSettings(progress=progress, cancel=cancel, meta=meta),
    )
    if settings is None:
        settings = built
    else:
        settings.refuse_alongside(built)
    eager = compiled.eager_root(model)
    # The module tree as the last capture of this model walked it, when it is the same
    # (one pass over the child dictionaries): no walk of it below.
    structure = structure_of(eager)
    refuse_sharded_params(  # (the eager module has the compiled one's parameters)
        model, "a capture",
        "capture the model before sharding it, watch its training with gradexplorer.watch (which merges "
        "the shards), or capture a dataset with torchrun ... gradexplorer capture --batch-size N --stats-only "
        "--shard fsdp, which shards the model itself.", structure.modules)
    if eager is not model:
        # Hooks on a compiled model that has run never fire: the eager module has the
        # same parameters, and its names lose the wrapper's prefix.
        model = eager
        settings = replace(settings, record=replace(settings.record, layers=_eager_layers(settings.record.layers)))
    with _old_objects_frozen():
        return _capture_once(model, inputs, settings, structure)


def _eager_layers(layers: LayerSpec) -> LayerSpec:
    """A compiled model's layer names as its eager module's (without ``_orig_mod.``)."""
    if isinstance(layers, str):
        return layers.removeprefix(compiled.ORIG_PREFIX)
    if layers is not None and not callable(layers):
        return [str(n).removeprefix(compiled.ORIG_PREFIX) for n in layers]
    return layers


@contextmanager
def _old_objects_frozen() -> Iterator[None]:
    """No garbage collection while the capture runs. Its thousands of small objects (records,
    hooks' closures and handles, weak references) trigger collections: a full one walks
    every object of the process (over 400,000 with torch, torchvision and numba loaded), a
    third of a whole capture of efficientnet_b0 at batch 8, and the young ones were a tenth
    of a statistics-only capture of a 200-layer MLP (docs/benchmarks.md). Reference counting
    still frees everything but cycles, which the collector takes after the capture, as
    usual. The objects that exist before it are also left out of later passes while it
    runs (``gc.freeze``), then put back."""
    enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()


_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _autocast(device: torch.device, autocast: str | None) -> AbstractContextManager[Any]:
    """Forward under ``torch.autocast`` with the dtype named (or no autocast)."""
    if autocast is None:
        return nullcontext()
    if autocast not in _AUTOCAST_DTYPES:
        raise GradExplorerError(f"unknown autocast dtype '{autocast}';", "use bf16 or fp16.")
    return torch.autocast(device_type=device.type, dtype=_AUTOCAST_DTYPES[autocast])


def _capture_once(model: nn.Module, inputs: torch.Tensor | ModelInputs, settings: CaptureSettings,
                  structure: ModelStructure) -> Capture:
    """One capture, step by step: check, hook, forward, backward, assemble."""
    record, run = settings.record, settings.run
    batch, several = _checked_batch(inputs, record.mode)
    target = parse_target(record.target)
    selected, computing = _selection(model, structure, record.layers)
    run_device = _run_device(run.device)
    recorder = _Recorder(
        model, selected, record.mode, run_device or model_device(model) or torch.device("cpu"),
        settings.report.progress, settings.report.cancel, record.expected_calls or len(structure),
        HIST_EXACT_LIMIT if record.hist_exact_limit is None else record.hist_exact_limit,
        keep_on_device=run.keep_on_device, computing=computing, structure=structure,
    )
    dev = recorder.device
    t0 = time.perf_counter()
    with (hooks_installed(model, train=run.train, device=run_device, modules=structure.modules) as hooks,
          _module_hooks(structure, recorder, hooks)):
        params = _trainable_parameters(structure)
        x, several = _batch_on(dev, batch, several)
        # Without trainable parameters nothing would need a gradient: then differentiate
        # with respect to the input, so that the layers' gradients still exist.
        want_x_grad = record.input_grad or not params
        if want_x_grad and x.is_floating_point():
            x = x.detach().requires_grad_(True)
        # Token ids have no gradient: the input gradient is then taken at their vectors,
        # the output of the embedding that reads them.
        embedded = (_embedding_outputs(structure, x, hooks) if record.input_grad and not x.is_floating_point()
                    else None)
        output = _forward(model, x, several, run.autocast, structure, recorder, len(selected))
        # The outputs' copies left for batched statistics are summarised now, before
        # backward needs the memory.
        recorder.summaries.flush()
        recorder.settle_edges()
        recorder._tick("forward", recorder.expected_calls, recorder.expected_calls, force=True)
        y = select_output(output, target.output_key)
        scalar = _checked_scalar(output, target, record.labels, x, embedded)
        emb_name, emb_out = embedded[0] if embedded else (None, None)
        grad_inputs = _backward_inputs(params, x if want_x_grad and x.requires_grad else None, emb_out,
                                       recorder.leaves)
        grads = _backward(scalar, grad_inputs, recorder, hooks)
        recorder._take_edge_grads(grads[len(grad_inputs):])
        grad_of = {id(p): g for p, g in zip(grad_inputs, grads)}
        recorder._tick("backward", recorder.grads_expected, recorder.grads_expected, force=True)
        order = sorted(recorder.records, key=recorder.first_call.__getitem__)
        not_called = [n for n in selected if n not in recorder.records]
        layers_out = {name: _layer_record(name, structure, recorder, grad_of) for name in order + not_called}
        x_grad = _input_gradient(grad_of, x, record.input_grad, emb_out)
        # Queued before the wait below, as the other copies are.
        kept_x_grad = recorder.keep(x_grad, copy=False) if x_grad is not None else None
        if dev.type == "cuda":
            # Copies to pinned host memory and the statistics kernels were queued without
            # waiting: wait for all of them, once, before anything is read.
            torch.cuda.synchronize(dev)
        recorder.summaries.resolve()
        info = _capture_meta(model, settings, target, dev, x, recorder, order, not_called, t0, emb_name)
        model_inputs, primary = _host_inputs(batch, several)
        if recorder.pending.nonfinite:
            # The onset reads the NaN/Inf counts of the records (an empty one reads as finite).
            recorder.pending.fill()
        return records_pending(Capture(
            meta=info,
            model_inputs=model_inputs,
            input=primary,
            output=y.detach().to("cpu", copy=True),
            input_grad=kept_x_grad,
            layers=layers_out,
            nonfinite_onset=recorder.onset.result(layers_out, order, zip(recorder.edges, recorder.edge_sinks)),
        ), recorder.pending)


def _checked_batch(inputs: torch.Tensor | ModelInputs, mode: str) -> tuple[torch.Tensor, ModelInputs | None]:
    """The mode checked, and the batch: its recorded tensor, with all the arguments of a
    model of several inputs (``None`` for a model of one)."""
    if mode not in MODES:
        raise GradExplorerError(f"Unknown capture mode '{mode}'.", "Use 'full' or 'stats'.")
    several = inputs if isinstance(inputs, ModelInputs) else None
    if several is not None:
        inputs = several.primary
    if not isinstance(inputs, torch.Tensor):
        raise GradExplorerError(
            f"The input batch is a {type(inputs).__name__}, not a tensor.", "Load images or a tensor file."
        )
    return inputs, several


def _selection(model: nn.Module, structure: ModelStructure, layers: LayerSpec) -> tuple[list[str], set[str]]:
    """The selected modules' names, and the containers recorded in a call that ran no other
    module (the default selection only: selection's docstring; nn.MultiheadAttention uses
    out_proj's weight itself)."""
    selected = structure.selected(layers)
    compiled.refuse_compiled_layers(model, selected, structure.of_type)
    computing = set(structure.containers()) - set(selected) if layers is None else set()
    return selected, computing


def _run_device(device: str | torch.device | None) -> torch.device | None:
    """The device asked for (``"auto"`` resolved), or ``None``: where the model is."""
    if device is None:
        return None
    return devices.resolve_device(device) if isinstance(device, str) else torch.device(device)


def _trainable_parameters(structure: ModelStructure) -> list[nn.Parameter]:
    """``model.parameters()`` that require a gradient: each once, in the same order."""
    params = []
    seen = set()
    for m in structure.modules:
        for p in m._parameters.values():
            if p is not None and p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def _batch_on(dev: torch.device, batch: torch.Tensor,
              several: ModelInputs | None) -> tuple[torch.Tensor, ModelInputs | None]:
    """The batch (and every argument) moved to the capture's device, in words when it cannot be."""
    try:
        x = batch.to(dev)
        if several is not None:
            several = several.to(dev)
            x = several.primary
    except Exception as exc:
        if _is_oom(exc):
            raise _oom_error(dev, exc) from exc
        raise CaptureError(f"The batch cannot be moved to {dev}: {exc}", "Choose another device.") from exc
    return x, several


def _forward(model: nn.Module, x: torch.Tensor, several: ModelInputs | None, autocast: str | None,
             structure: ModelStructure, recorder: _Recorder, n_selected: int) -> Any:
    """The model's forward with the hooks on; a failure names the module it failed in and
    the captured layers that ran before it."""
    try:
        with torch.enable_grad(), _autocast(recorder.device, autocast):
            return several.call(model, x) if several is not None else model(x)
    except GradExplorerError:
        raise
    except Exception as exc:
        if _is_oom(exc):
            raise _oom_error(recorder.device, exc) from exc
        where = recorder.forward_failed_at()
        ran = [n for n, r in recorder.records.items() if r.calls and r.calls[0].stats["activation"] is not None]
        ran_text = ", ".join(ran[-5:]) if ran else "none"
        at = f" in module '{where}' ({type(structure.module(where)).__name__})" if where else ""
        raise CaptureError(
            f"The model's forward failed{at}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            f" (captured layers that ran: {ran_text}{' ...' if len(ran) > 5 else ''}; "
            f"{len(ran)} of {n_selected}).",
            forward_fix(exc),
        ) from exc


def _checked_scalar(output: Any, target: Target, labels: torch.Tensor | None, x: torch.Tensor,
                    embedded: list[tuple[str, torch.Tensor]] | None) -> torch.Tensor:
    """The target's scalar, refused when nothing it depends on has a gradient, or when the
    input gradient of token ids was asked for and no embedding reads them."""
    scalar = target_scalar(output, target, labels)
    if not scalar.requires_grad:
        raise CaptureError(
            "The target does not depend on anything that requires a gradient.",
            "Check that the model has trainable parameters or ask for the input gradient.",
        )
    if embedded is not None and not embedded:
        raise CaptureError(
            f"The input gradient was asked for, but the input is {str(x.dtype).replace('torch.', '')} "
            "token ids, which have no gradient, and no nn.Embedding of the model reads them.",
            "Leave the input gradient off, or capture the layer that turns the ids into vectors.",
        )
    return scalar


def _backward_inputs(params: list[nn.Parameter], x: torch.Tensor | None, emb_out: torch.Tensor | None,
                     leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """What backward returns gradients for: the trainable parameters, the input (``x``, when
    its gradient is wanted), the token embeddings, and each leaf a hook waits for, once."""
    grad_inputs: list[torch.Tensor] = list(params) + ([x] if x is not None else [])
    if emb_out is not None:
        grad_inputs.append(emb_out)
    asked = {id(t) for t in grad_inputs}
    for leaf in leaves:
        if id(leaf) not in asked:
            asked.add(id(leaf))
            grad_inputs.append(leaf)
    return grad_inputs


def _backward(scalar: torch.Tensor, grad_inputs: list[torch.Tensor], recorder: _Recorder,
              hooks: Hooks) -> tuple[torch.Tensor | None, ...]:
    """``torch.autograd.grad`` of the scalar: the gradients of ``grad_inputs``, then those of
    the recorder's edges; the gradient hooks record only while it runs."""
    if recorder.ticking and recorder.edges:
        # The edges' gradients come back at the end: check progress and cancel where
        # backward starts (and at the hooks' gradients, as ever).
        hooks.tensor(scalar, functools.partial(recorder._tick_in_backward, 0))
    recorder.own_backward = True  # the gradient hooks record from here on (_watch_grad)
    try:
        # (tensors and gradient edges in one list: torch.autograd.grad takes either)
        return torch.autograd.grad(scalar, cast(list[torch.Tensor], [*grad_inputs, *recorder.edges]),
                                   allow_unused=True)
    except GradExplorerError:
        raise
    except Exception as exc:
        if _is_oom(exc):
            raise _oom_error(recorder.device, exc) from exc
        raise CaptureError(
            f"Backward failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            "This model may use operations without gradients.",
        ) from exc
    finally:
        recorder.own_backward = False


def _layer_record(name: str, structure: ModelStructure, recorder: _Recorder,
                  grad_of: dict[int, torch.Tensor | None]) -> LayerRecord:
    """One selected module's record, completed: the gradients its calls never received
    marked absent, and its own parameters' gradients (``grad_of``: by the parameter's id)."""
    module = structure.module(name)
    rec = recorder.records.get(name) or _new_layer(type(module).__name__)
    for call in rec.calls:
        for kind in ("grad_output", "grad_input"):
            if call.stats[kind] is None and kind not in call.absent:
                call.absent[kind] = NOT_REACHED  # hooked, and never reached by the backward
    own: set[int] = set()
    summaries = recorder.summaries
    small_on, hold_small = summaries.small_on, summaries.hold_small
    for pname, p in module._parameters.items():  # named_parameters(recurse=False)
        if p is None or id(p) in own:
            continue
        own.add(id(p))
        g = grad_of.get(id(p)) if p.requires_grad else None
        rec.param_stats[pname] = rec.param_grads[pname] = None
        if g is None:
            rec.param_absent[pname] = NOT_REACHED if p.requires_grad else FROZEN
            continue
        # autograd.grad returned a tensor of our own that nothing modifies later:
        # summarised with the gradients when they are batched, kept as it is on
        # the CPU (no copy), copied from a GPU unless kept there.
        if (small_on and g.is_cpu and g.dtype in SMALL_DTYPES
                and 0 < g.numel() <= SMALL_VALUES):  # summarize_later, inline (as _record_grad)
            rec.param_stats[pname] = hold_small(g.detach() if g.requires_grad else g)
        else:
            rec.param_stats[pname] = summaries.summarize_later(g)
        if recorder.full:
            rec.param_grads[pname] = recorder.keep(g, copy=False)
    return rec


def _input_gradient(grad_of: dict[int, torch.Tensor | None], x: torch.Tensor, input_grad: bool,
                    emb_out: torch.Tensor | None) -> torch.Tensor | None:
    """The input gradient, when asked for: the batch's own, or, for token ids, the token
    embeddings' (one vector per id)."""
    x_grad = grad_of.get(id(x)) if input_grad else None
    if emb_out is not None:
        x_grad = grad_of.get(id(emb_out))
        if x_grad is None:  # the target does not depend on the tokens: a zero gradient, truly
            x_grad = torch.zeros_like(emb_out)
        x_grad = x_grad.detach().reshape(*x.shape, -1)
    return x_grad


def _capture_meta(model: nn.Module, settings: CaptureSettings, target: Target, dev: torch.device,
                  x: torch.Tensor, recorder: _Recorder, order: list[str], not_called: list[str], t0: float,
                  emb_name: str | None) -> dict[str, Any]:
    """``Capture.meta``: the caller's metadata, then the facts of this run."""
    info: dict[str, Any] = {
        "model": type(model).__name__,
        "weights": None,
        "categories": None,
    }
    info.update(settings.report.meta or {})
    info.update({
        "target": str(target),
        "device": str(dev),
        "dtype": str(x.dtype).replace("torch.", ""),
        "mode": settings.record.mode,
        "train": bool(settings.run.train),
        "autocast": settings.run.autocast,
        "torch_version": str(torch.__version__),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "layer_order": order,
        "call_order": recorder.call_order,
        "not_called": not_called,
        "seconds": round(time.perf_counter() - t0, 4),
    })
    if emb_name is not None:
        info["input_grad_of"] = f"the output of '{emb_name}' (the token embeddings)"
    return info


def _host_inputs(batch: torch.Tensor, several: ModelInputs | None) -> tuple[dict | None, torch.Tensor]:
    """The batch as the capture keeps it, on the host: every argument of a model of several
    inputs (so that a notebook can run the batch again), and the recorded tensor."""
    if several is None:
        return None, batch.detach().cpu()
    kept = several.map(lambda t: t.detach().cpu())
    # One host copy of the recorded tensor (from a GPU, .cpu() twice made two).
    return {"args": list(kept.args), "kwargs": dict(kept.kwargs)}, kept.primary
