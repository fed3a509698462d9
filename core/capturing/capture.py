"""Capture: one forward and backward pass that records, for every selected module and
every call of it, the activation, the gradient with respect to that activation and to the
module's first input, and the gradients of the module's own parameters.

Why it is built this way (the hook facts behind it: docs/ARCHITECTURE.md, "Facts the code
relies on"):

* Module backward hooks are not used. The deprecated one reports the wrong tensors; the
  full one breaks on in-place ReLUs and ``+=`` residuals and never fires for dict outputs.
  Instead a forward hook registers a *tensor* hook on the output, and a forward pre-hook
  one on the input. A tensor hook registered before an in-place change receives the
  gradient with respect to the value before the change, which is what the user means by
  "the gradient at this layer's output".
* The activation is summarised (and, in full mode, copied) inside the forward hook, before
  a later in-place op can overwrite it.
* Each call of a module gets its own record: the call index is bound into the closures.
* A module's input is often the previous module's output, same object, same version:
  their gradients are the same tensor, so we hook it once and give it to both records.
* Backward is ``torch.autograd.grad`` with the trainable parameters (and the input, when
  asked) as ``inputs``: it runs the same graph as ``loss.backward()`` but returns the
  gradients instead of accumulating into ``.grad``, so the user's ``.grad`` is untouched.
* Every hook is registered through ``gradexplorer.hooks.hooks_installed``, which removes
  them all in ``finally``; the module modes, BatchNorm running statistics (in train mode)
  and the device are restored too.
"""

from __future__ import annotations

import datetime as _dt
import gc
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import nn

from gradexplorer.base import devices
from gradexplorer.base.errors import CaptureCancelled, CaptureError, GradExplorerError
from gradexplorer.base.forward_errors import forward_fix
from gradexplorer.capturing import compiled, recomputation
from gradexplorer.capturing.data import CallRecord, Capture, LayerRecord
from gradexplorer.capturing.inputs import ModelInputs, first_tensor_input
from gradexplorer.capturing.nonfinite import OnsetTracker
from gradexplorer.capturing.selection import LayerSpec, resolve_layers
from gradexplorer.capturing.sharded_params import refuse_sharded_params
from gradexplorer.capturing.targets import Target, parse_target, select_output, target_scalar
from gradexplorer.hooks.installed import Hooks, hooks_installed, model_device
from gradexplorer.stats.device import DeferredStats
from gradexplorer.stats.moments import HIST_EXACT_LIMIT
from gradexplorer.stats.record import TensorStats

MODES = ("full", "stats")

ProgressCallback = Callable[[str, int, int], None]

# Per model: (module name, call index) -> whether a later in-place op modified that output
# in the last full capture. Outputs known to stay unmodified are kept without a copy on the
# CPU (checked by their version counter at the end of forward; a surprise triggers a rerun
# with copies). A clone of every activation would otherwise cost as much as the statistics.
_MUTATED_OUTPUTS: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


class _CopyNeeded(Exception):
    """An output kept without a copy was modified in place: run again with copies."""


class CancelFlag(Protocol):
    def is_set(self) -> bool: ...


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
#: Pinned copies run without waiting (full capture of resnet50 at batch 64 on an H200: 0.53 s,
#: against 11 s with a synchronous copy of each tensor to ordinary memory), but pinned memory
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
                 expected_calls: int, hist_limit: int | None, mutated: dict | None = None,
                 keep_on_device: bool = False):
        self.model = model
        self.selected = set(selected)
        self.full = mode == "full"
        self.device = device
        self.progress = progress
        self.cancel = cancel
        self.hist_limit = hist_limit
        self.summaries = DeferredStats(hist_limit)
        self.onset = OnsetTracker()  # where NaN/Inf began (core/capturing/nonfinite.py)
        self.pinned_left: int | None = None  # bytes, measured at the first GPU copy
        # Bytes of device memory kept tensors may still take (keep_on_device); None: none.
        self.device_left: int | None = None
        if keep_on_device and self.full and device.type != "cpu":
            free = devices.free_memory(device)  # looked up at call time: tests replace it
            self.device_left = int(free * KEEP_SHARE) if free is not None else None
        self.records: dict[str, LayerRecord] = {}
        self.first_call: dict[str, int] = {}
        self.open_calls: dict[str, list[CallRecord]] = {}
        self.open_inputs: dict[str, list[list]] = {}
        self.running: list[str] = []
        self.call_count = 0
        self.expected_calls = max(expected_calls, 1)
        # (id, version) of a hooked tensor -> (weak reference to it, [(record, attr)]): one
        # hook per value. Weak, as in ``activations``: a capture that held every output
        # until the end made backward 6% slower (the memory autograd frees and reuses).
        self.grad_sinks: dict[tuple[int, int], tuple[weakref.ref, list[tuple[CallRecord, str]]]] = {}
        # id of a gradient handed to a hook -> (weak reference to it, its version, its stats,
        # what was kept of it). Autograd hands one gradient object to several hooks (both
        # sides of ``out += identity``; a module's output and the next one's input when they
        # are different objects over one value): one summary serves them all (resnet50: 9%
        # of the values a capture summarised, vit_b_16: 19%).
        self.grad_values: dict[int, tuple[weakref.ref, int, TensorStats, torch.Tensor | None]] = {}
        self.hooks = Hooks()  # replaced by the capture's own while it runs (install)
        self.grads_expected = 0
        self.grads_seen = 0
        self.last_report = 0.0
        # Outputs seen in forward: (name, call index, tensor, version, whether the record
        # relies on it staying unchanged). Held to the end of forward in full mode, and
        # with batched statistics (which learn from them which outputs they may leave for
        # later); statistics-only capture otherwise holds no output.
        self.track_outputs = self.full or self.summaries.batches_on(device)
        self.outputs: list[tuple[str, int, torch.Tensor, int, bool]] = []
        # (name, call index) in the order the calls returned: gradexplorer.comparison.compare's forward order.
        self.call_order: list[list] = []
        # (id, version) of an output -> (weak reference to it, its stats, what was kept of it).
        self.activations: dict[tuple[int, int], tuple] = {}
        self.mutated = mutated

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
        if self.device_left is not None and t.device.type != "cpu":
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
    def pre_hook(self, name: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if recomputation.recomputing():
            return None  # activation checkpointing re-running forward in backward
        if recomputation.reentrant_checkpoint():
            raise recomputation.reentrant_refusal(name)
        self.call_count += 1
        self._tick("forward", self.call_count, self.expected_calls)
        self.running.append(name)
        self.onset.enter(name, args, kwargs)
        if name in self.selected:
            rec = self.records.get(name)
            if rec is None:
                rec = self.records[name] = LayerRecord(type(module).__name__)
                self.first_call[name] = self.call_count
            call = CallRecord()
            rec.calls.append(call)
            self.open_calls.setdefault(name, []).append(call)
            self.open_inputs.setdefault(name, []).append(
                [(a, a._version) for a in args if isinstance(a, torch.Tensor)])
            x = first_tensor_input(args, kwargs)
            if x is not None and x.requires_grad:
                self._watch_grad(x, call, "grad_input")
        return None

    def forward_hook(self, name: str, module: nn.Module, args: tuple, kwargs: dict,
                     output: Any) -> torch.Tensor | None:
        if recomputation.recomputing():
            return None
        if self.running and self.running[-1] == name:
            self.running.pop()
        if name not in self.selected:
            _, y = primary_tensor(output)
            self.onset.leave(name, module, y)
            if self.cancel is not None:
                # Backward reaches selected layers only near its end when they sit near the
                # input: a check at every module's output keeps cancel prompt.
                if y is not None and y.requires_grad:
                    self.hooks.tensor(y, self._cancel_check)
            return None
        call = self.open_calls[name].pop()
        inputs = self.open_inputs[name].pop()
        key, y = primary_tensor(output)
        call.output_key = key
        if y is None:
            self.onset.leave(name, module, None)
            return None
        replaced = None
        if key == "" and y.requires_grad and any(a is y and v == y._version for a, v in inputs):
            # The module hands its input through unchanged (Identity, eval-mode Dropout).
            # Its "output gradient" is what flows back through the value it returned, not
            # every use of its input: give the output an identity of its own.
            seen_input = self.activations.get((id(y), y._version))
            replaced = y.clone()
            if seen_input is not None and seen_input[0]() is y:
                self.activations[(id(replaced), replaced._version)] = (weakref.ref(replaced), *seen_input[1:])
            y = replaced
        call.shape = tuple(y.shape)
        call.dtype = str(y.dtype).replace("torch.", "")
        index = len(self.records[name].calls) - 1
        self.call_order.append([name, index])
        value_key = (id(y), y._version)
        seen = self.activations.get(value_key)
        if seen is not None and seen[0]() is y:
            # The same value again (Identity, eval-mode Dropout, a block returning its
            # last child's output): one summary and one copy serve both records.
            call.stats["activation"], call.activation = seen[1], seen[2]
        else:
            # Whether what is recorded of y relies on y staying as it is until the end of
            # forward (kept without a copy, or summarised there): checked by check_outputs.
            relies = False
            # Known from the last run not to be modified later: kept without a copy where
            # it stays (on the CPU, or on the device with keep_on_device), and with batched
            # statistics summarised together with the other such outputs after forward.
            unmodified = self.mutated is not None and self.mutated.get((name, index)) is False
            with torch.no_grad():
                if unmodified and self.summaries.batches(y):
                    call.stats["activation"] = self.summaries.summarize_later(y)
                    relies = True
                    if self.full:
                        call.activation = self.keep(y, copy=False)
                elif not self.full:
                    call.stats["activation"] = self.summaries.summarize(y)
                elif y.device.type == "cpu" and unmodified:
                    call.stats["activation"] = self.summaries.summarize(y)
                    call.activation = y.detach()
                    relies = True
                else:
                    # A copy now: a later in-place op (ReLU(inplace), +=) would change y. On
                    # the CPU the pass that computes the statistics writes it (one read).
                    call.stats["activation"], call.activation = self.summaries.summarize_copy(y)
                    if call.activation is None:
                        call.activation = self.keep(y, copy=not unmodified)
                        relies = y.numel() > 0 and call.activation.data_ptr() == y.data_ptr()
            self.activations[value_key] = (weakref.ref(y), call.stats["activation"], call.activation)
            if self.track_outputs:
                self.outputs.append((name, index, y, y._version, relies))
        self.onset.leave(name, module, y, call.stats["activation"])
        if y.requires_grad:
            self._watch_grad(y, call, "grad_output")
        return replaced

    # -- gradients ------------------------------------------------------------------
    def _cancel_check(self, grad: torch.Tensor) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise CaptureCancelled()

    def _watch_grad(self, t: torch.Tensor, call: CallRecord, attr: str) -> None:
        key = (id(t), t._version)
        entry = self.grad_sinks.get(key)
        if entry is not None and entry[0]() is t:
            entry[1].append((call, attr))
            return
        sinks: list[tuple[CallRecord, str]] = [(call, attr)]
        self.grad_sinks[key] = (weakref.ref(t), sinks)
        self.grads_expected += 1

        def on_grad(grad: torch.Tensor, sinks: list[tuple[CallRecord, str]] = sinks) -> None:
            self.grads_seen += 1
            self._tick("backward", self.grads_seen, self.grads_expected)
            seen = self.grad_values.get(id(grad))
            if seen is not None and seen[0]() is grad and seen[1] == grad._version:
                stats, kept = seen[2], seen[3]
            else:
                with torch.no_grad():
                    stats = self.summaries.summarize_later(grad)
                    # Autograd does not modify a gradient it has handed to a hook while we
                    # hold it, so on the CPU it is kept as it is (the tests compare after
                    # backward).
                    kept = self.keep(grad, copy=False) if self.full else None
                self.grad_values[id(grad)] = (weakref.ref(grad), grad._version, stats, kept)
            self.onset.grad(stats, sinks)
            for rec, name in sinks:
                rec.stats[name] = stats
                if kept is not None:
                    setattr(rec, name, kept)

        # Also when an in-place op on a view rebases its history (Hooks.gradient).
        self.hooks.gradient(t, on_grad)

    def check_outputs(self) -> None:
        """After forward: learn which outputs were modified in place; rerun if one that was
        kept without a copy, or left to be summarised now, was. Then summarise the outputs
        left for now (batched statistics), together."""
        if not self.track_outputs:
            return
        known = _MUTATED_OUTPUTS.setdefault(self.model, {})
        surprise = False
        for n, i, t, v, relies in self.outputs:
            changed = t._version != v
            known[(n, i)] = changed
            surprise |= changed and relies
        self.outputs.clear()
        if surprise:
            raise _CopyNeeded()
        self.summaries.flush()

    def forward_failed_at(self) -> str:
        return self.running[-1] if self.running else ""


@contextmanager
def _module_hooks(model: nn.Module, recorder: _Recorder, hooks: Hooks) -> Iterator[None]:
    """Hooks on every module (progress, cancel, where forward failed), recording hooks on
    the selected ones, all through ``hooks``, which removes them; the recorder forgets the
    tensors it saw on exit, also when forward or backward raised."""
    recorder.hooks = hooks
    try:
        for name, module in model.named_modules():
            hooks.forward_pre(module, lambda m, a, k, _n=name: recorder.pre_hook(_n, m, a, k), with_kwargs=True)
            hooks.forward(module, lambda m, a, k, o, _n=name: recorder.forward_hook(_n, m, a, k, o),
                          with_kwargs=True)
        yield
    finally:
        recorder.grad_sinks.clear()
        recorder.grad_values.clear()
        recorder.activations.clear()


def _embedding_outputs(model: nn.Module, x: torch.Tensor, hooks: Hooks) -> list[tuple[str, torch.Tensor]]:
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

    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
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
) -> Capture:
    """Run one forward and backward pass and record gradients at the selected modules.

    Parameters
    ----------
    model : nn.Module
        Left as it was: hooks removed, modes and BatchNorm statistics restored, ``.grad``
        of every parameter untouched, device restored. A model under ``torch.compile`` is
        captured through its eager module (``model._orig_mod``, whose names the layers
        use); layers inside a compiled submodule are refused
        (``gradexplorer.capturing.compiled``).
    inputs : Tensor or ModelInputs
        The batch ``(B, ...)``; it is not modified. For a model of several inputs, all its
        arguments (``gradexplorer.capturing.inputs.ModelInputs``): the first tensor is the recorded input.
    layers : None, str, iterable of str, or callable
        Modules to record: ``None`` for every leaf module, names or glob patterns
        (``"layer4.*"``), or a predicate ``(name, module) -> bool``.
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
        Histogram subsampling threshold (``gradexplorer.stats.summary``); default
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
    settings = _CaptureSettings(
        layers=layers, target=target, labels=labels, mode=mode, input_grad=input_grad, device=device,
        train=train, progress=progress, cancel=cancel, meta=meta, expected_calls=expected_calls,
        hist_exact_limit=hist_exact_limit, autocast=autocast, keep_on_device=keep_on_device,
    )
    refuse_sharded_params(
        model, "a capture",
        "capture the model before sharding it, watch its training with gradexplorer.watch (which merges "
        "the shards), or capture a dataset with torchrun ... gradexplorer capture --batch-size N --stats-only "
        "--shard fsdp, which shards the model itself.")
    eager = compiled.eager_root(model)
    if eager is not model:
        # Hooks on a compiled model that has run never fire: the eager module has the
        # same parameters, and its names lose the wrapper's prefix.
        model = eager
        if isinstance(layers, str):
            layers = layers.removeprefix(compiled.ORIG_PREFIX)
        elif layers is not None and not callable(layers):
            layers = [str(n).removeprefix(compiled.ORIG_PREFIX) for n in layers]
        settings = replace(settings, layers=layers)
    with _old_objects_frozen():
        try:
            return _capture_once(model, inputs, settings, _MUTATED_OUTPUTS.get(model))
        except _CopyNeeded:
            return _capture_once(model, inputs, settings, {})


@contextmanager
def _old_objects_frozen() -> Iterator[None]:
    """The objects that exist before the capture are left out of the garbage collector's
    passes while it runs (``gc.freeze``), then put back. The capture's few thousand small
    objects trigger collections, and a full one walks every object of the process (over
    400,000 with torch, torchvision and numba loaded): 0.46 s, a third of a whole capture
    of efficientnet_b0 at batch 8. Young garbage is still collected as usual."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass(frozen=True)
class _CaptureSettings:
    """``capture``'s keyword arguments, handed to each attempt as one object."""

    layers: LayerSpec
    target: Target | str
    labels: torch.Tensor | None
    mode: str
    input_grad: bool
    device: str | torch.device | None
    train: bool
    progress: ProgressCallback | None
    cancel: CancelFlag | None
    meta: dict | None
    expected_calls: int | None
    hist_exact_limit: int | None
    autocast: str | None
    keep_on_device: bool = False


_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _autocast(device: torch.device, autocast: str | None) -> AbstractContextManager[Any]:
    """Forward under ``torch.autocast`` with the dtype named (or no autocast)."""
    if autocast is None:
        return nullcontext()
    if autocast not in _AUTOCAST_DTYPES:
        raise GradExplorerError(f"unknown autocast dtype '{autocast}';", "use bf16 or fp16.")
    return torch.autocast(device_type=device.type, dtype=_AUTOCAST_DTYPES[autocast])


def _capture_once(model: nn.Module, inputs: torch.Tensor | ModelInputs, settings: _CaptureSettings,
                  mutated: dict | None) -> Capture:
    layers, target, labels, mode = settings.layers, settings.target, settings.labels, settings.mode
    input_grad, device, train, meta = settings.input_grad, settings.device, settings.train, settings.meta
    progress, cancel, expected_calls = settings.progress, settings.cancel, settings.expected_calls
    hist_exact_limit = settings.hist_exact_limit
    if mode not in MODES:
        raise GradExplorerError(f"Unknown capture mode '{mode}'.", "Use 'full' or 'stats'.")
    several = inputs if isinstance(inputs, ModelInputs) else None  # a model of several inputs
    if several is not None:
        inputs = several.primary
    if not isinstance(inputs, torch.Tensor):
        raise GradExplorerError(
            f"The input batch is a {type(inputs).__name__}, not a tensor.", "Load images or a tensor file."
        )
    target = parse_target(target)
    selected = resolve_layers(model, layers)
    compiled.refuse_compiled_layers(model, selected)
    run_device = None
    if device is not None:
        run_device = devices.resolve_device(device) if isinstance(device, str) else torch.device(device)
    n_modules = sum(1 for _ in model.modules())
    recorder = _Recorder(
        model, selected, mode, run_device or model_device(model) or torch.device("cpu"),
        progress, cancel, expected_calls or n_modules,
        HIST_EXACT_LIMIT if hist_exact_limit is None else hist_exact_limit, mutated,
        keep_on_device=settings.keep_on_device,
    )
    dev = recorder.device
    t0 = time.perf_counter()
    with hooks_installed(model, train=train, device=run_device) as hooks, _module_hooks(model, recorder, hooks):
        params = []
        seen = set()
        for p in model.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        try:
            x = inputs.to(dev)
            if several is not None:
                several = several.to(dev)
                x = several.primary
        except Exception as exc:
            if _is_oom(exc):
                raise _oom_error(dev, exc) from exc
            raise CaptureError(f"The batch cannot be moved to {dev}: {exc}", "Choose another device.") from exc
        # Without trainable parameters nothing would need a gradient: then differentiate
        # with respect to the input, so that the layers' gradients still exist.
        want_x_grad = input_grad or not params
        if want_x_grad and x.is_floating_point():
            x = x.detach().requires_grad_(True)
        # Token ids have no gradient: the input gradient is then taken at their vectors,
        # the output of the embedding that reads them.
        embedded = _embedding_outputs(model, x, hooks) if input_grad and not x.is_floating_point() else None
        try:
            with torch.enable_grad(), _autocast(dev, settings.autocast):
                output = several.call(model, x) if several is not None else model(x)
        except GradExplorerError:
            raise
        except Exception as exc:
            if _is_oom(exc):
                raise _oom_error(dev, exc) from exc
            where = recorder.forward_failed_at()
            ran = [n for n, r in recorder.records.items() if r.calls and r.calls[0].stats["activation"] is not None]
            ran_text = ", ".join(ran[-5:]) if ran else "none"
            at = f" in module '{where}' ({type(model.get_submodule(where)).__name__})" if where else ""
            raise CaptureError(
                f"The model's forward failed{at}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                f" (captured layers that ran: {ran_text}{' ...' if len(ran) > 5 else ''}; "
                f"{len(ran)} of {len(selected)}).",
                forward_fix(exc),
            ) from exc
        recorder.check_outputs()
        recorder._tick("forward", recorder.expected_calls, recorder.expected_calls, force=True)
        y = select_output(output, target.output_key)
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
        emb_name, emb_out = embedded[0] if embedded else (None, None)
        grad_inputs = list(params) + ([x] if want_x_grad and x.requires_grad else [])
        if emb_out is not None:
            grad_inputs.append(emb_out)
        try:
            grads = torch.autograd.grad(scalar, grad_inputs, allow_unused=True)
        except GradExplorerError:
            raise
        except Exception as exc:
            if _is_oom(exc):
                raise _oom_error(dev, exc) from exc
            raise CaptureError(
                f"Backward failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                "This model may use operations without gradients.",
            ) from exc
        grad_of = {id(p): g for p, g in zip(grad_inputs, grads)}
        recorder._tick("backward", recorder.grads_expected, recorder.grads_expected, force=True)
        order = sorted(recorder.records, key=recorder.first_call.__getitem__)
        not_called = [n for n in selected if n not in recorder.records]
        layers_out: dict[str, LayerRecord] = {}
        for name in order + not_called:
            rec = recorder.records.get(name) or LayerRecord(type(model.get_submodule(name)).__name__)
            module = model.get_submodule(name)
            for pname, p in module.named_parameters(recurse=False):
                g = grad_of.get(id(p)) if p.requires_grad else None
                rec.param_stats[pname] = rec.param_grads[pname] = None
                if g is None:
                    continue
                # autograd.grad returned a tensor of our own that nothing modifies later:
                # summarised with the gradients when they are batched, kept as it is on
                # the CPU (no copy), copied from a GPU unless kept there.
                rec.param_stats[pname] = recorder.summaries.summarize_later(g)
                if recorder.full:
                    rec.param_grads[pname] = recorder.keep(g, copy=False)
            layers_out[name] = rec
        x_grad = grad_of.get(id(x)) if input_grad else None
        if emb_out is not None:
            x_grad = grad_of.get(id(emb_out))
            if x_grad is None:  # the target does not depend on the tokens: a zero gradient, truly
                x_grad = torch.zeros_like(emb_out)
            x_grad = x_grad.detach().reshape(*x.shape, -1)
        # Queued before the wait below, as the other copies are.
        kept_x_grad = recorder.keep(x_grad, copy=False) if x_grad is not None else None
        if dev.type == "cuda":
            # Copies to pinned host memory and the statistics kernels were queued without
            # waiting: wait for all of them, once, before anything is read.
            torch.cuda.synchronize(dev)
        recorder.summaries.resolve()
        info: dict[str, Any] = {
            "model": type(model).__name__,
            "weights": None,
            "categories": None,
        }
        info.update(meta or {})
        info.update({
            "target": str(target),
            "device": str(dev),
            "dtype": str(x.dtype).replace("torch.", ""),
            "mode": mode,
            "train": bool(train),
            "autocast": settings.autocast,
            "torch_version": str(torch.__version__),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "layer_order": order,
            "call_order": recorder.call_order,
            "not_called": not_called,
            "seconds": round(time.perf_counter() - t0, 4),
        })
        if emb_name is not None:
            info["input_grad_of"] = f"the output of '{emb_name}' (the token embeddings)"
        model_inputs = None
        primary = inputs.detach().cpu()
        if several is not None:  # every argument, so that a notebook can run the batch again
            kept = several.map(lambda t: t.detach().cpu())
            model_inputs = {"args": list(kept.args), "kwargs": dict(kept.kwargs)}
            primary = kept.primary  # one host copy of it (from a GPU, .cpu() twice made two)
        return Capture(
            meta=info,
            model_inputs=model_inputs,
            input=primary,
            output=y.detach().to("cpu", copy=True),
            input_grad=kept_x_grad,
            layers=layers_out,
            nonfinite_onset=recorder.onset.result(layers_out, order),
        )
