"""What is derived from a capture once, for every view and the CLI: the layer flags, the
gradient norm of each layer, and the layer the views open on.

``summarize(capture)`` computes these the first time it is asked for a capture object and
returns the same ``CaptureSummary`` afterwards (captures are not changed once made), so
the module tree, the gradient-flow chart, the window and the CLI share one computation.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass, field

import torch

from gradexplorer.analysis.gradcam import cam_supported
from gradexplorer.analysis.gradient_flow import GradientStop, gradient_stop, layer_flags, seed_calls
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.inputs import Batch

#: Activation modules whose repeated calls mark a residual block's output (ResNet's shared
#: ``relu``: its last call comes after the ``+= identity``).
ACTIVATION_TYPES = frozenset(
    {"ReLU", "ReLU6", "SiLU", "GELU", "Hardswish", "LeakyReLU", "ELU", "Mish", "Tanh", "Sigmoid"}
)


@dataclass(frozen=True)
class CaptureSummary:
    """Per-capture facts the views and the CLI share.

    Attributes
    ----------
    flags : dict
        Every captured layer, in forward order, to its flags (``gradexplorer.analysis.gradient_flow``
        rules: ``"no gradient"``, ``"nan/inf"``, ``"zero"``, ``"vanishing"``,
        ``"exploding"``); empty lists when all is well.
    grad_norms : dict
        Layer to the L2 norm of its output gradient over all its calls (``inf`` when
        a call's norm is not finite); layers that no gradient reached are absent.
    first_view : (str, int) or None
        The layer and call the views open on (``default_layer``).
    not_called : tuple of str
        The captured layers that never ran during forward (``LayerRecord.called``), in
        forward order: they have no gradient because they computed nothing (not flagged
        ``"no gradient"``); their parameters may still have gradients, used by a parent.
    stop : GradientStop or None
        The layer below which every gradient is zero, and why
        (``gradexplorer.analysis.gradient_flow.gradient_stop``).
    notes : dict
        Layer to the words that explain its flags or its look: where its zero gradient comes
        from, or that its gradient is the target's seed.
    """

    flags: dict[str, list[str]] = field(default_factory=dict)
    grad_norms: dict[str, float] = field(default_factory=dict)
    first_view: tuple[str, int] | None = None
    not_called: tuple[str, ...] = ()
    stop: GradientStop | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def flagged(self) -> dict[str, str]:
        """Only the flagged layers, each with its flags in one string (``"nan/inf, zero"``)."""
        return {name: ", ".join(f) for name, f in self.flags.items() if f}

    def layers_with(self, flag: str) -> list[str]:
        """The layers carrying ``flag``, in forward order."""
        return [name for name, f in self.flags.items() if flag in f]


def _grad_norm(capture: Capture, name: str) -> float | None:
    # The layer's calls as if their gradients were concatenated (gradexplorer.analysis.gradient_flow's L2
    # rule); a call whose norm overflowed makes the layer's norm infinite.
    values = [float(s["l2"]) for c in capture[name].calls if (s := c.stats.get("grad_output"))]
    if not values:
        return None
    if not all(math.isfinite(v) for v in values):
        return math.inf
    return math.sqrt(sum(v * v for v in values))


def input_shape_of(capture: Capture | None, batch: Batch | None = None) -> tuple[int, ...] | None:
    """The shape of the model input (batch first): the capture's, else the batch's.

    Parameters
    ----------
    capture : Capture or None
    batch : gradexplorer.capturing.inputs.Batch, optional

    Returns
    -------
    tuple of int or None
        ``None`` when the input is not one tensor (several inputs) or is unknown.
    """
    for x in (getattr(capture, "input", None), getattr(batch, "tensor", None)):
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return tuple(int(d) for d in x.shape)
    return None


def default_layer(capture: Capture) -> tuple[str, int] | None:
    """The layer (and call) the views open on: where Grad-CAM is usually taken, else the
    first captured layer.

    That is the last spatial map (a conv output of at least 2×2, or ViT tokens on a
    square grid that lines up with the input picture) in forward order; a sequence
    model has none. Layers are ordered by their first call, so a block's
    shared activation (ResNet's ``layer4.1.relu``, called two or three times) comes before
    the block's last conv; its last call is the block's output (after the residual add),
    and it is preferred when it sits in the same block (not the model's top level) and
    its shape matches.

    Parameters
    ----------
    capture : Capture

    Returns
    -------
    (str, int) or None
        ``None`` for a capture without any called layer.
    """

    input_shape = input_shape_of(capture)

    def spatial(shape: tuple) -> bool:
        if not cam_supported(shape, input_shape):
            return False
        return len(shape) != 4 or (shape[2] > 1 and shape[3] > 1)

    order = capture.layer_order
    last = None
    for name in reversed(order):
        calls = capture[name].calls
        if calls and spatial(tuple(calls[-1].shape)):
            last = name
            break
    if last is not None:
        shape = tuple(capture[last].calls[-1].shape)
        parent = last.rpartition(".")[0]
        # Only inside a block (a named container): a model-level activation reused all
        # over the network is not one block's output.
        for name in reversed(order[: order.index(last)] if parent else []):
            layer = capture[name]
            if name.rpartition(".")[0] != parent or not layer.calls:
                continue
            # ResNet's Bottleneck registers its relu between bn1 and conv2: the scan must
            # pass the block's other layers (other shapes) to reach it.
            if (len(layer.calls) > 1 and layer.type in ACTIVATION_TYPES
                    and tuple(layer.calls[-1].shape) == shape):
                return name, len(layer.calls) - 1
        return last, len(capture[last].calls) - 1
    # No spatial map (an MLP): the first layer, whose gradient has travelled furthest; the
    # whole model (the root, captured for parameters of its own) only when no other ran.
    for name in [n for n in order if n] + [n for n in order if not n]:
        if capture[name].calls:
            return name, len(capture[name].calls) - 1
    return None


def block_call(capture: Capture, name: str) -> tuple[str, int] | None:
    """The call that stands for a module the capture holds no record of, but some of whose
    submodules it does (a ticked block: ``layer4`` ticks its leaves, not the block itself).

    That is the last call to return inside it during the forward (the capture's
    ``call_order``; for a capture without one, the last call of the last captured layer
    inside it). A block's output is that call's output, or a residual sum of it
    (``out += identity`` before ResNet's last ReLU call, ``x + mlp(x)`` in a transformer
    layer), so its gradient is the block's output gradient.

    Parameters
    ----------
    capture : Capture
    name : str
        Qualified module name ("" for the model itself).

    Returns
    -------
    (str, int) or None
        The layer and call index; None when ``name`` is captured itself or nothing inside
        it was called.
    """
    if name in capture:
        return None
    prefix = f"{name}." if name else ""
    inside = [n for n in capture.layer_order if n.startswith(prefix) and capture[n].calls]
    if not inside:
        return None
    order = capture.meta.get("call_order") if isinstance(capture.meta, dict) else None
    for entry in reversed(order or ()):
        layer, call = str(entry[0]), int(entry[1])
        if layer.startswith(prefix) and layer in capture and call < len(capture[layer].calls):
            return layer, call
    last = inside[-1]
    return last, len(capture[last].calls) - 1


def _notes(capture: Capture, stop: GradientStop | None) -> dict[str, str]:
    notes: dict[str, str] = {}
    for name, _call in sorted(seed_calls(capture)):
        notes[name] = ("its output is what the target was taken from: its gradient is the target's seed (a one-hot "
                       "of the class for top1, ones for sum), set by the target, not passed back; it is not judged "
                       "against its neighbours")
    if stop is not None:
        notes[stop.layer] = f"the gradient stops here: {stop.reason}"
        for name in stop.below:
            notes.setdefault(name, f"zero because the gradient stops at {stop.layer} ({stop.type}): {stop.reason}")
    return notes


_cache: dict[int, CaptureSummary] = {}
_lock = threading.Lock()


def summarize(capture: Capture) -> CaptureSummary:
    """The summary of ``capture``, computed on the first call for this object.

    Parameters
    ----------
    capture : Capture

    Returns
    -------
    CaptureSummary
        The same object for every later call with the same capture.
    """
    key = id(capture)
    with _lock:
        cached = _cache.get(key)
    if cached is not None:
        return cached
    norms = {}
    for name in capture.layer_order:
        norm = _grad_norm(capture, name)
        if norm is not None:
            norms[name] = norm
    not_called = tuple(n for n in capture.layer_order if not capture[n].called)
    stop = gradient_stop(capture)
    summary = CaptureSummary(layer_flags(capture), norms, default_layer(capture), not_called, stop,
                             _notes(capture, stop))
    with _lock:
        if key not in _cache:
            _cache[key] = summary
            # The id may be reused once the capture is gone: forget it with the capture.
            weakref.finalize(capture, _cache.pop, key, None)
        return _cache[key]
