"""What a capture holds: per module, per call, the activation and its gradients.

Everything is detached and keyed by qualified module name, then call index (a module
called three times in one forward has three ``CallRecord``s). Statistics are always
present; tensors are ``None`` in statistics-only mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeAlias, overload

import torch

from gradexplorer.capturing.nonfinite import NonfiniteOnset
from gradexplorer.stats.pending import PendingRecords
from gradexplorer.stats.record import TensorStats

#: A call's statistics per tensor kind: ``activation``, ``grad_output``, ``grad_input``
#: (``None`` where the call has no such tensor), and any kind a capture adds (a dataset
#: capture's ``grad_norm``).
CallStats: TypeAlias = dict[str, TensorStats | None]


def _no_stats() -> CallStats:
    return {"activation": None, "grad_output": None, "grad_input": None}


#: Why a gradient is absent, in words (``CallRecord.absent``, ``LayerRecord.param_absent``).
#: Autograd computed the module's backward but gave no gradient for this tensor: one output
#: of several that the target does not use (``nn.LSTM``'s sequence output when only ``h_n``
#: is read).
UNUSED_OUTPUT = "autograd gave none: the target does not use this output"
#: The backward from the target never reached the tensor.
NOT_REACHED = "the target does not depend on it"
#: The tensor does not require a gradient (the input batch, a value computed without
#: gradient or from frozen parameters only).
NO_GRAD_REQUIRED = "it does not require a gradient"
#: The call had no tensor argument to take a gradient at.
NO_TENSOR_INPUT = "the call has no tensor input"
#: The call's output holds no tensor.
NO_TENSOR_OUTPUT = "the output holds no tensor"
#: A container recorded for a call in which it ran no other module changed its input in
#: place during that call: the gradient at the value it was called with cannot be taken.
CHANGED_INPUT = "the module changed its input in place"
#: A parameter with ``requires_grad=False``.
FROZEN = "frozen (requires_grad=False)"


@dataclass
class CallRecord:
    """One call of a module during the forward pass.

    Attributes
    ----------
    activation : Tensor or None
        The module's output as it was when the call returned (cloned, so later in-place
        operations do not change it). For tuple/dict outputs, the element named by
        ``output_key``.
    grad_output : Tensor or None
        Gradient of the target with respect to that output; ``None`` when the output
        does not reach the target.
    grad_input : Tensor or None
        Gradient of the target with respect to the module's first tensor input, when that
        input requires grad.
    stats : CallStats
        ``{"activation": stats, "grad_output": stats or None, "grad_input": stats or None}``
        (``TensorStats`` records: see ``gradexplorer.stats.tensor_stats.tensor_stats``).
    output_key : str
        Which element of a tuple/dict output was recorded ("" for a plain tensor).
    shape, dtype : tuple, str
        The activation's shape and dtype (also known in statistics-only mode).
    absent : dict of str to str
        Why a tensor kind has no statistics, in words, per kind (``"grad_output"``:
        ``UNUSED_OUTPUT``, ``NOT_REACHED``, ``NO_GRAD_REQUIRED``...); a kind that was
        recorded is not in it. Empty in captures that predate it.
    """

    activation: torch.Tensor | None = None
    grad_output: torch.Tensor | None = None
    grad_input: torch.Tensor | None = None
    stats: CallStats = field(default_factory=_no_stats)
    output_key: str = ""
    shape: tuple = ()
    dtype: str = ""
    absent: dict[str, str] = field(default_factory=dict)

    def tensor(self, kind: str) -> torch.Tensor | None:
        """``kind`` is ``activation``, ``grad_output`` or ``grad_input``."""
        return getattr(self, kind)


@dataclass
class LayerRecord:
    """Everything captured for one module.

    Attributes
    ----------
    type : str
        The module's class name.
    calls : list of CallRecord
        One per call during forward; empty when the module never ran (its parent used its
        weights directly, as ``nn.MultiheadAttention`` does with ``out_proj``): see
        ``called``.
    param_grads, param_stats : dict
        The gradient (full captures) and statistics of each parameter the module owns
        directly (``named_parameters(recurse=False)``), by its own name (``"weight"``);
        ``None`` where it has none.
    param_absent : dict of str to str
        Why a parameter has no gradient, in words (``FROZEN``, ``NOT_REACHED``).
    """

    type: str
    calls: list[CallRecord] = field(default_factory=list)
    param_grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    param_stats: dict[str, TensorStats | None] = field(default_factory=dict)
    param_absent: dict[str, str] = field(default_factory=dict)

    @property
    def called(self) -> bool:
        """Whether the module ran during the captured forward: a layer that never ran has no
        gradient because it computed nothing, not because no gradient reached it."""
        return bool(self.calls)


#: How the root module's record (layer ``""``) is shown to people.
ROOT_LABEL = "(model)"


def layer_label(name: str) -> str:
    """A layer's name as tables and messages show it: the root module, named ``""``, is
    ``ROOT_LABEL``."""
    return name or ROOT_LABEL


def param_name(layer: str, pname: str) -> str:
    """The full name of parameter ``pname`` of module ``layer``, as
    ``model.named_parameters()`` gives it (the root module's name is ``""``)."""
    return f"{layer}.{pname}" if layer else pname


class _LayersFilledOnRead:
    """``Capture.layers``: the layers' records, their statistics written on first read.

    A capture leaves the statistics of its small tensors computed but not yet written into
    their records (``gradexplorer.stats.pending``: writing them cost more than computing
    them); the first read of ``layers`` (and so of any record: every reader comes through
    it) writes them all. Assigning ``layers`` sets the records as they are.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = "_" + name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _LayersFilledOnRead: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> dict[str, LayerRecord]: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> Any:
        if obj is None:
            # (read on the class: no default value, so a Capture is always given its layers)
            raise AttributeError(self._slot)
        state = obj.__dict__
        pending = state.get("_pending")
        if pending is not None:
            pending.fill()  # (every caller returns after the records are written: fill's lock)
            state.pop("_pending", None)
        return state[self._slot]

    def __set__(self, obj: object, value: dict[str, LayerRecord]) -> None:
        obj.__dict__[self._slot] = value


def records_pending(capture: Capture, pending: PendingRecords) -> Capture:
    """``capture``, whose records ``pending`` writes when ``capture.layers`` is first read."""
    if len(pending):
        capture.__dict__["_pending"] = pending
    return capture


@dataclass
class Capture:
    """The result of one capture: a dict-like view ``capture[name] -> LayerRecord``.

    Attributes
    ----------
    meta : dict
        model, weights, target, device, dtype, mode, torch_version, created, layer_order,
        categories (docs/capture.md, "The .pt capture format").
    input, output : Tensor
        The batch as fed to the model, and the output tensor the target used (CPU).
    input_grad : Tensor or None
        Gradient of the target with respect to the input batch, when asked for.
    layers : dict
        Qualified name -> ``LayerRecord``, in the order of each module's first call.
    graph : dict or None
        The model's dataflow graph, when one was recorded (reserved in capture format
        version 2; ``None`` when absent).
    nonfinite_onset : NonfiniteOnset or None
        Where NaN/Inf began (``gradexplorer.capturing.nonfinite``): ``{"forward": ..., "backward": ...}``,
        ``None`` when every value was finite (or the capture predates it).
    model_inputs : dict or None
        For a model of several inputs, every argument of its forward (CPU):
        ``{"args": [...], "kwargs": {...}}``, so that ``model(*args, **kwargs)`` runs the
        batch again; ``input`` is only the first tensor. ``None`` for one input.
    """

    meta: dict
    input: torch.Tensor | None
    output: torch.Tensor | None
    input_grad: torch.Tensor | None
    layers: _LayersFilledOnRead = _LayersFilledOnRead()
    graph: dict | None = None
    nonfinite_onset: NonfiniteOnset | None = None
    model_inputs: dict | None = None

    def __getitem__(self, name: str) -> LayerRecord:
        return self.layers[name]

    def __getstate__(self) -> dict[str, Any]:
        """What pickling and ``copy`` take: every record written first."""
        self.layers  # noqa: B018 - (the read writes any record still waiting)
        return {k: v for k, v in self.__dict__.items() if k != "_pending"}

    def __contains__(self, name: object) -> bool:
        return name in self.layers

    def __iter__(self) -> Iterator[str]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def layer_order(self) -> list[str]:
        return list(self.layers)

    @property
    def mode(self) -> str:
        return self.meta.get("mode", "full")

    def to_pandas(self) -> Any:
        """A pandas DataFrame with a row per layer, call and kind (and per parameter
        gradient) and its statistics (``gradexplorer.capturing.capture_table``)."""
        from gradexplorer.capturing.capture_table import capture_frame  # pandas, imported when asked

        return capture_frame(self)

    def _repr_html_(self) -> str:
        """The compact table a notebook shows (``gradexplorer.capturing.capture_table``)."""
        from gradexplorer.capturing.capture_table import capture_html

        return capture_html(self)

    @property
    def param_grads(self) -> dict[str, torch.Tensor | None]:
        """Every captured parameter's gradient by full name, as ``model.named_parameters()``
        names it (``"encoder.pos_embedding"``; a parameter the root module owns by its own
        name, ``"class_token"``): ``None`` where there is none (statistics-only captures,
        frozen parameters: ``param_absent`` says why). A parameter shared by two captured
        modules (a tied embedding) is under both names."""
        return {param_name(layer, p): g for layer, rec in self.layers.items() for p, g in rec.param_grads.items()}

    @property
    def param_stats(self) -> dict[str, TensorStats | None]:
        """Every captured parameter gradient's statistics by full name (as ``param_grads``)."""
        return {param_name(layer, p): s for layer, rec in self.layers.items() for p, s in rec.param_stats.items()}

    @property
    def param_absent(self) -> dict[str, str]:
        """Why a captured parameter has no gradient, by full name (as ``param_grads``)."""
        return {param_name(layer, p): why for layer, rec in self.layers.items() for p, why in rec.param_absent.items()}

    def iter_calls(self) -> Iterator[tuple[str, int, CallRecord]]:
        """Every (layer name, call index, record), in forward order by layer."""
        for name, layer in self.layers.items():
            for i, call in enumerate(layer.calls):
                yield name, i, call

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the capture holds (batch, output, input gradient, the layers' tensors)."""
        singles = [self.input, self.output, self.input_grad]
        if self.model_inputs is not None:
            singles += [*self.model_inputs["args"], *self.model_inputs["kwargs"].values()]
        for t in singles:
            if isinstance(t, torch.Tensor):
                yield t
        for rec in self.layers.values():
            for c in rec.calls:
                for t in (c.activation, c.grad_output, c.grad_input):
                    if isinstance(t, torch.Tensor):
                        yield t
            for g in rec.param_grads.values():
                if isinstance(g, torch.Tensor):
                    yield g

    def on_host(self) -> Capture:
        """This capture with every tensor in host memory: itself when they all are, else a
        copy (``to("cpu")``). A capture that kept its tensors on the GPU
        (``gradexplorer.capturing.capture.capture(..., keep_on_device=True)``) is copied when viewed or saved."""
        if all(t.device.type == "cpu" for t in self.tensors()):
            return self
        return self.to("cpu")

    def to(self, device: str | torch.device) -> Capture:
        """A copy with every tensor moved to ``device``; a tensor that several records share
        (one gradient for two layers, one value for an Identity and its input) is moved
        once and stays shared."""
        moved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            if not isinstance(t, torch.Tensor):
                return t
            got = moved.get(id(t))
            if got is None:
                got = moved[id(t)] = (t, t.to(device))  # t held: its id stays its own
            return got[1]

        layers = {}
        for name, rec in self.layers.items():
            calls = [
                CallRecord(mv(c.activation), mv(c.grad_output), mv(c.grad_input), c.stats,
                           c.output_key, c.shape, c.dtype, dict(c.absent))
                for c in rec.calls
            ]
            layers[name] = LayerRecord(
                rec.type, calls, {k: mv(v) for k, v in rec.param_grads.items()}, rec.param_stats,
                dict(rec.param_absent),
            )
        inputs = None
        if self.model_inputs is not None:
            inputs = {"args": [mv(v) for v in self.model_inputs["args"]],
                      "kwargs": {k: mv(v) for k, v in self.model_inputs["kwargs"].items()}}
        return Capture(dict(self.meta), mv(self.input), mv(self.output), mv(self.input_grad), layers,
                       self.graph, self.nonfinite_onset, inputs)
