"""Where NaN/Inf began: the first module call whose output holds NaN or Inf while its
inputs were finite (forward order), and the first gradient that turned non-finite
(backward order).

A capture with an exploding value usually has NaN/Inf in most layers after the first; the
useful fact is where it started. "The layers with NaN/Inf" listed in network order leads
with the first layer whose *gradient* is bad, which says nothing about the forward.

``OnsetTracker`` rides on the capture's hooks (``gradexplorer.capturing.capture._Recorder``): every module
call's tensor inputs and primary output get a finiteness *source*: the statistics record of
a recorded tensor (filled later, on a GPU at the capture's end), the statistics of the same
tensor seen earlier (same object and version), or, for a tensor not seen before, one
``aminmax`` (the cheapest pass that reveals NaN/Inf; on a GPU a flag left on the device
and read once at the end). Module calls complete innermost first, so the first call whose
inputs are finite and whose output is not is the innermost module where the value broke;
when that module has children, it broke in its own forward code between them.

Most calls of a network take one input, the output a recorded call returned (a chain of
layers): the capture finds that output anyway, to route its gradient (the recorder's
gradient sinks, keyed by the value), and hands the tracker the two calls' records
(``OnsetTracker.linked``). Such a call takes no note of its own; its input's source is the
other call's activation record, its output's its own, both read at the end; and the
gradients asked of the backward as edges are read from their records there too.

The inputs of a call matter only when its output is not finite, so on the CPU an input
not seen before (in a ResNet, the sum ``out += identity`` that its ReLU receives) is
checked at the end of the call, and only when the output holds NaN/Inf: none of the
aminmax passes in a finite capture. If the call changed that input in place (an in-place
ReLU), its value on entry is gone: it counts as not finite, which puts the onset in the
code that made it (the enclosing module's own forward code; standard in-place
activations cannot turn finite values into NaN/Inf).

``onset_location`` gives the window the (layer, call, tensor) to mark and jump to;
``describe_onset`` the lines the CLI prints.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias, TypedDict

import torch

from gradexplorer.stats.moments import has_nonfinite
from gradexplorer.stats.record import TensorStats


class _ForwardOnsetPlace(TypedDict):
    layer: str | None
    call: int | None
    type: str


class ForwardOnset(_ForwardOnsetPlace, total=False):
    """Where NaN/Inf began in forward: the first module call whose output holds NaN or Inf
    while its inputs were finite.

    Keys
    ----
    layer : str or None
        Qualified module name (``""``: the model itself); ``None``: the input batch already
        held NaN/Inf.
    call : int or None
        The module's call index (``None`` for the input batch).
    type : str
        The module's class (``"input batch"``).
    own_code : bool
        The module has children, none of which produced it: its own forward code did.
    nan_count, inf_count : int or None
        In that output (``None`` when not known).

    The capture writes every key; a file may leave out the last three.
    """

    own_code: bool
    nan_count: int | None
    inf_count: int | None


class _BackwardOnsetPlace(TypedDict):
    layer: str
    call: int | None
    type: str
    tensor: str


class BackwardOnset(_BackwardOnsetPlace, total=False):
    """Where NaN/Inf began in backward: the first recorded gradient that holds NaN or Inf.

    Keys
    ----
    layer : str
        Qualified module name.
    call : int or None
        Its call index (``None`` for a parameter's gradient).
    type : str
        The module's class.
    tensor : str
        ``activation``, ``grad_output``, ``grad_input`` or ``param:NAME``.
    nan_count, inf_count : int or None
        In that gradient.

    The capture writes every key; a file may leave out the counts.
    """

    nan_count: int | None
    inf_count: int | None


class NonfiniteOnset(TypedDict, total=False):
    """``Capture.nonfinite_onset``: where NaN/Inf began in forward and in backward (``None``
    on a side where every value stayed finite). The capture writes both keys."""

    forward: ForwardOnset | None
    backward: BackwardOnset | None


#: What ``OnsetTracker.enter`` notes of a call for ``leave``: (module name, call index,
#: the inputs' sources, whether any of them is checked only if the output is not finite).
Note: TypeAlias = "tuple[str, int, list, bool]"

#: A source: True (finite), False (not), a statistics record (empty until the capture
#: fills it), or a 0-d bool device tensor (True when non-finite), resolved by ``_bad``;
#: None for no tensor.
Source: TypeAlias = "bool | TensorStats | torch.Tensor | None"


def _bad(source: Source) -> bool:
    if source is None or source is True:
        return False
    if source is False:
        return True
    if isinstance(source, dict):
        return has_nonfinite(source)
    return bool(source)


def _counts(source: Source) -> tuple[int | None, int | None]:
    if isinstance(source, dict) and source:
        return int(source["nan_count"]), int(source["inf_count"])
    return None, None


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of the real CPU tensor ``t`` is finite, in one read: a finite
    sum means every value is (NaN and Inf carry through a sum); only a sum that overflowed
    needs the extremes. A sum reads faster than ``aminmax``, and efficientnet_b0 checks 26
    block outputs per capture this way (docs/benchmarks.md, "Where the time goes")."""
    with torch.no_grad():
        x = t.detach()
        total = x.sum(dtype=torch.float32) if x.element_size() < 4 else x.sum()  # a half sum overflows sooner
        return math.isfinite(total) or bool(torch.isfinite(torch.stack(torch.aminmax(x.reshape(-1)))).all())


class _Later:
    """An input not seen before, checked only if the call's output is not finite."""

    __slots__ = ("tensor", "version")

    def __init__(self, t: torch.Tensor) -> None:
        self.tensor = t
        self.version = t._version

    def resolve(self, tracker: OnsetTracker) -> Any:
        if self.tensor._version != self.version:
            return False  # changed in place by the call: its value on entry is gone
        return tracker._source(self.tensor)


class OnsetTracker:
    """Finiteness of every module call's inputs and output during one capture.

    Parameters
    ----------
    has_children : callable, optional
        ``has_children(name)``: whether the module of that name has children, when the
        caller knows it without asking the module (``gradexplorer.capturing.structure``).

    Per call it only takes note: the sources of the inputs and of the output (statistics
    records, filled when the capture summarises the tensors, often later and together);
    the onset is read from them at the end (``result``).
    """

    def __init__(self, has_children: Callable[[str], bool] | None = None,
                 outputs: dict[tuple[int, int], tuple[weakref.ref, list]] | None = None) -> None:
        self._has_children = has_children
        self._device_flags = False  # whether a source is a flag left on a device (result)
        self._known: dict[tuple[int, int], tuple[Any, Any]] = {}
        # The capture's recorded outputs that need a gradient, by (id, version): (weak
        # reference, [(CallRecord, attr)], the first of them (record, "grad_output") for the
        # call that returned it): their sources, without a note of their own (``linked``).
        self._outputs = outputs if outputs is not None else {}
        self._calls: dict[str, int] = {}
        # Completed calls, innermost first: (name, call index, module, inputs, output).
        # Or, for a call whose input was a recorded output (``linked``): (CallRecord, the
        # CallRecord that returned the input, module).
        self.events: list[tuple[str, int, torch.nn.Module, list, Any] | tuple[Any, Any, torch.nn.Module]] = []
        # Gradients with the place backward produced them at (the sequence number of the
        # autograd node they are an input of: backward runs the highest first):
        # (order, stats, [(CallRecord, attr)]).
        self.grads: list[tuple[int, TensorStats, list]] = []

    def _recorded(self, key: tuple[int, int], t: torch.Tensor) -> TensorStats | None:
        """The activation record of ``t``, a recorded output that needs a gradient (key: its
        (id, version)), or None."""
        entry = self._outputs.get(key)
        if entry is not None and entry[0]() is t:
            call, attr = entry[1][0]
            if attr == "grad_output":
                return call.stats["activation"]
        return None

    def _source(self, t: torch.Tensor, stats: TensorStats | None = None, later: bool = False) -> Any:
        key = (id(t), t._version)
        seen = self._known.get(key)
        if seen is not None and seen[0]() is t:
            return seen[1]
        if stats is None and t.requires_grad:
            recorded = self._recorded(key, t)
            if recorded is not None:
                return recorded
        if later and stats is None and t.device.type == "cpu" and (t.is_floating_point() or t.is_complex()):
            return _Later(t)
        if stats is not None:
            source: Any = stats
        elif not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
            source = True
        elif t.is_cpu and not t.is_complex():
            source = all_finite(t)
        else:
            with torch.no_grad():
                lo, hi = torch.aminmax(t.detach().reshape(-1) if not t.is_complex() else t.detach().abs().reshape(-1))
                flag = ~(torch.isfinite(lo) & torch.isfinite(hi))
            # On the CPU the answer is free now; on a GPU it waits on the device until the end.
            if flag.device.type == "cpu":
                source = not bool(flag)
            else:
                source = flag
                self._device_flags = True
        self._known[key] = (weakref.ref(t), source)
        return source

    def enter(self, name: str, args: tuple, kwargs: dict, index: int | None = None) -> Note:
        """A module call starts: note the finiteness of its tensor inputs. Returns the note
        that :meth:`leave` takes when the call ends (the caller keeps it with the call, as
        it keeps the call's other state: no lookup of the open calls per call). ``index``:
        the call's index among its module's calls, when the caller counts them (a recorded
        module's; else counted here)."""
        if index is None:
            index = self._calls.get(name, 0)
            self._calls[name] = index + 1
        inputs = []
        undecided = False  # an input checked only if the output breaks (_Later)
        later = name != ""  # the root's inputs (the batch) at once: "the input batch holds NaN/Inf"
        known = self._known
        for values in (args, kwargs.values()) if kwargs else (args,):
            for value in values:
                if isinstance(value, torch.Tensor):
                    # An earlier output, as it was (most inputs): its source, without a call.
                    seen = known.get((id(value), value._version))
                    if seen is not None and seen[0]() is value:
                        inputs.append(seen[1])
                        continue
                    source = self._source(value, later=later)  # (also a recorded output's record)
                    undecided = undecided or type(source) is _Later
                    inputs.append(source)
                elif isinstance(value, (tuple, list)):
                    for v in value:
                        if isinstance(v, torch.Tensor):
                            source = self._source(v, later=later)
                            undecided = undecided or type(source) is _Later
                            inputs.append(source)
        return name, index, inputs, undecided

    def leave(self, note: Note | None, module: torch.nn.Module, output: torch.Tensor | None,
              stats: TensorStats | None = None, known: tuple[tuple[int, int], weakref.ref] | None = None) -> None:
        """A module call ends with ``output`` (its primary tensor), summarised by ``stats``
        when the capture recorded it. ``note``: what :meth:`enter` returned for the call
        (``None``: a call it did not see start, which is not noted). ``known``: the output's
        (id, version) key and a weak reference to it, when the caller has them already (one
        of each per output)."""
        if note is None:
            return
        name, index, inputs, undecided_inputs = note
        if output is None:
            source = None
        elif known is not None and stats is not None:
            seen = self._known.get(known[0])
            if seen is not None and seen[0]() is output:
                source = seen[1]
            else:
                source = stats
                self._known[known[0]] = (known[1], stats)
        else:
            source = self._source(output, stats)
        if undecided_inputs:
            # Undecided outputs (a device flag, statistics still to be filled) count as bad.
            undecided = isinstance(source, torch.Tensor) or (isinstance(source, dict) and not source)
            needed = undecided or _bad(source)
            inputs = [(s.resolve(self) if needed else None) if isinstance(s, _Later) else s for s in inputs]
        # The module's class and whether it has children are asked only of the call that
        # turns out to be the onset (result).
        self.events.append((name, index, module, inputs, source))

    def linked(self, call: Any, producer: Any, module: torch.nn.Module) -> None:
        """A recorded call ends whose one input was, on entry, the output that the recorded
        call ``producer`` returned (``CallRecord``s): its input's source is the producer's
        activation record and its output's is its own, read at the end (``result``), and
        its output, which needs a gradient, is found among the capture's ``outputs``: no
        note of its own (most calls of a chain of layers)."""
        self.events.append((call, producer, module))

    def known_stats(self, t: torch.Tensor, stats: TensorStats) -> None:
        """``stats`` summarise ``t`` as it is now (an output the capture recorded)."""
        self._known[(id(t), t._version)] = (weakref.ref(t), stats)

    def grad(self, stats: TensorStats, sinks: list, order: int) -> None:
        """A gradient the capture recorded; ``order``: the sequence number of the autograd
        node it is an input of (backward runs nodes from the highest number down: on one
        device thread, the node with the highest number left is always the next), so that
        gradients handed to hooks as backward ran and ones asked of ``torch.autograd.grad``
        take their places in one order."""
        self.grads.append((order, stats, sinks))

    def result(self, layers: dict, param_order: list[str],
               edges: Iterable[tuple[Any, list]] = ()) -> NonfiniteOnset | None:
        """The onset entry of the capture (``None`` when every value was finite).

        Parameters
        ----------
        layers : dict
            The capture's ``LayerRecord``s by name (to name a gradient's layer and call).
        param_order : list of str
            Layer names in forward order: a non-finite parameter gradient is reported,
            when no recorded activation gradient is, from the layer nearest the output.
        edges : iterable of (GradientEdge, [(CallRecord, attr)])
            Gradients asked of the backward as edges of its graph, after the ones handed to
            :meth:`grad`: each recorded in its first sink's record (none where the backward
            did not reach it), its node asked for its place only if it holds NaN/Inf.
        """
        flags = ([s for e in self.events if len(e) == 5 for s in [*e[3], e[4]] if isinstance(s, torch.Tensor)]
                 if self._device_flags else [])
        if flags:  # GPU flags: one transfer for all
            values = torch.stack(flags).cpu().tolist()
            resolved = {id(f): v for f, v in zip(flags, values)}
        else:
            resolved = {}

        def bad(s: Any) -> bool:
            return bool(resolved[id(s)]) if isinstance(s, torch.Tensor) else _bad(s)

        forward: ForwardOnset | None = None
        where: dict[int, tuple[str, int]] = {}
        for event in self.events:
            if len(event) == 3:  # (linked)
                call, producer, module = event
                out, into = call.stats["activation"], producer.stats["activation"]
                if not (out and (out["nan_count"] or out["inf_count"])) or (
                        into and (into["nan_count"] or into["inf_count"])):
                    continue  # (_bad, inline)
                where = where or _places(layers)
                name, index = where[id(call)]
                inputs, source = [into], out
            else:
                name, index, module, inputs, source = event
            if type(source) is dict:  # (most outputs: a recorded one's statistics; bad, inline)
                if not (source and (source["nan_count"] or source["inf_count"])):
                    continue
            elif not bad(source):
                continue
            if not any(bad(s) for s in inputs):
                nan, inf = _counts(source)
                has_children = (self._has_children(name) if self._has_children is not None
                                else next(module.children(), None) is not None)
                forward = {"layer": name, "call": index, "type": type(module).__name__, "own_code": has_children,
                           "nan_count": nan, "inf_count": inf}
                break
        if forward is None:
            root = next((e for e in self.events if len(e) == 5 and e[0] == ""), None)
            if root is not None and any(bad(s) for s in root[3]):
                forward = {"layer": None, "call": None, "type": "input batch", "own_code": False,
                           "nan_count": None, "inf_count": None}
        backward: BackwardOnset | None = None
        bad_grads = [g for g in self.grads if has_nonfinite(g[1])]
        for edge, sinks in edges:
            call, attr = sinks[0]
            stats = call.stats[attr]
            if stats and (stats["nan_count"] or stats["inf_count"]):  # (has_nonfinite, inline)
                bad_grads.append((edge.node._sequence_nr(), stats, sinks))
        if bad_grads and not where:
            where = _places(layers)
        for _order, stats, sinks in sorted(bad_grads, key=lambda g: -g[0]):  # stable: hooks' order kept
            # The module whose backward produced it: the one it is the input gradient of.
            call, attr = next(((c, a) for c, a in sinks if a == "grad_input"), sinks[0])
            name, index = where.get(id(call), ("", 0))
            backward = {"layer": name, "call": index, "type": layers[name].type if name in layers else "",
                        "tensor": attr, "nan_count": int(stats["nan_count"]), "inf_count": int(stats["inf_count"])}
            break
        if backward is None:
            for name in reversed(param_order):
                rec = layers.get(name)
                if rec is None:
                    continue
                for pname, stats in rec.param_stats.items():
                    if stats is not None and has_nonfinite(stats):
                        backward = {"layer": name, "call": None, "type": rec.type, "tensor": f"param:{pname}",
                                    "nan_count": int(stats["nan_count"]), "inf_count": int(stats["inf_count"])}
                        break
                if backward is not None:
                    break
        if forward is None and backward is None:
            return None
        return {"forward": forward, "backward": backward}


def _places(layers: dict) -> dict[int, tuple[str, int]]:
    """id of each ``CallRecord`` of ``layers`` -> (layer name, call index)."""
    return {id(c): (n, i) for n, rec in layers.items() for i, c in enumerate(rec.calls)}


def onset_location(onset: NonfiniteOnset | None, kind: str = "forward") -> tuple[str, int | None, str] | None:
    """Where the window marks and jumps to: (layer name, call index or None, tensor kind:
    ``activation``, ``grad_output``, ``grad_input`` or ``param:NAME``), or ``None`` (also
    when NaN/Inf was already in the input batch). The layer may be a container or the
    root (``""``), or a module that was not captured: check ``name in capture``.

    Parameters
    ----------
    onset : NonfiniteOnset or None
        ``Capture.nonfinite_onset``.
    kind : {"forward", "backward"}
        Which onset.
    """
    sides: Mapping[str, Any] = onset or {}
    entry = sides.get(kind)
    if not entry or entry["layer"] is None:
        return None
    return entry["layer"], entry.get("call"), entry.get("tensor", "activation")


def _counted(entry: ForwardOnset | BackwardOnset) -> str:
    parts = []
    if entry.get("nan_count"):
        parts.append(f"{entry['nan_count']:,} NaN")
    if entry.get("inf_count"):
        parts.append(f"{entry['inf_count']:,} Inf")
    return " and ".join(parts) if parts else "NaN/Inf"


def describe_onset(onset: NonfiniteOnset | None) -> list[str]:
    """Plain-text lines saying where NaN/Inf began (empty when it never did)."""
    if not onset:
        return []
    lines = []
    f = onset.get("forward")
    if f and f["layer"] is None:
        lines.append("forward: the input batch already holds NaN/Inf")
    elif f:
        label = f"'{f['layer']}'" if f["layer"] else "the model itself"
        text = (f"forward: first at {label} ({f['type']}), call {f['call']}: output holds {_counted(f)}, "
                "inputs were finite")
        if f.get("own_code"):
            text += " (no module inside it produced it: its own forward code did)"
        lines.append(text)
    b = onset.get("backward")
    if b:
        label = f"'{b['layer']}'" if b["layer"] else "the model"
        tensor = b["tensor"]
        if tensor == "grad_input":
            what = f"backward: first at {label} ({b['type']}), call {b['call']}: the gradient it passed to its input"
        elif tensor == "grad_output":
            what = (f"backward: first at the output of {label} ({b['type']}), call {b['call']}: "
                    "the gradient arriving from what consumed it")
        else:
            what = f"backward: first in the gradient of {label}'s parameter {tensor.split(':', 1)[1]}"
        lines.append(f"{what} holds {_counted(b)}")
    return lines
