"""What the user is looking at in a capture: an evented model the views share.

``ViewState`` holds the selection every view of a capture follows (the layer, its call,
the sample) and the heatmap's choices (the channel, the tensor kind, the channel
reduction). Widgets never own these: they set a field when the user changes a control
and listen to ``state.events.<field>`` to update themselves (psygnal emits only when a
value really changes, so a widget that writes back the value it was given ends the
round trip). This follows ndv's ``ArrayDisplayModel``: the model is plain data that
knows nothing about Qt, and tests drive it without a window.

What depends on the capture itself (the flags, the norms, the layer to open on) is in
``gradexplorer.analysis.capture_summary``; ``fit`` uses it to keep the selection valid when the capture
changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from psygnal import evented

from gradexplorer.analysis.capture_summary import summarize
from gradexplorer.capturing.data import Capture

if TYPE_CHECKING:
    from psygnal import SignalGroup

#: Tensor kinds a heatmap can show, with the words the views use for them.
TENSOR_KINDS = {
    "grad_output": "gradient",
    "activation": "activation",
    "grad_x_activation": "gradient × activation",
    "grad_input": "input gradient",
}
#: Ways to reduce the channels of a map to one picture.
REDUCTIONS = ("mean", "mean_abs", "l2")


@evented
@dataclass
class ViewState:
    """The selection and display choices shared by the views.

    Attributes
    ----------
    layer : str or None
        Qualified name of the selected layer.
    call : int
        Which call of the layer (a module called twice has calls 0 and 1).
    sample : int
        Index in the batch.
    channel : int
        The channel a one-channel heatmap shows (clamped by the view to the layer's).
    tensor : str
        A key of ``TENSOR_KINDS``.
    reduction : str
        One of ``REDUCTIONS``, for channel-reduced heatmaps.
    """

    if TYPE_CHECKING:
        # Added by @evented: one signal per field (``state.events.layer.connect(...)``).
        events: ClassVar[SignalGroup]

    layer: str | None = None
    call: int = 0
    sample: int = 0
    channel: int = 0
    tensor: str = "grad_output"
    reduction: str = "mean"

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        if self.tensor not in TENSOR_KINDS:
            raise ValueError(f"unknown tensor kind {self.tensor!r}; use one of {', '.join(TENSOR_KINDS)}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {self.reduction!r}; use one of {', '.join(REDUCTIONS)}")

    def select(self, layer: str | None, call: int = 0) -> None:
        """Select a layer and one of its calls in one step.

        Observers of ``layer`` already read the new ``call`` when they are told, so a
        view redraws once, not once for the layer and again for the call.
        """
        if layer == self.layer:
            self.call = int(call)
            return
        with self.events.call.blocked():
            self.call = int(call)
        self.layer = layer

    def fit(self, capture: Capture | None, batch_size: int) -> bool:
        """Keep the selection inside ``capture``: a layer it lacks is replaced by the
        layer the views open on, the call and sample are clamped to what exists.

        Parameters
        ----------
        capture : Capture or None
            ``None`` clears the layer.
        batch_size : int
            Samples in the batch shown.

        Returns
        -------
        bool
            Whether the layer was replaced (by the default layer, or by ``None``).
        """
        replaced = False
        if capture is None:
            replaced = self.layer is not None
            self.select(None, 0)
        elif self.layer not in capture:
            first = summarize(capture).first_view
            self.select(*(first if first is not None else (None, 0)))
            replaced = True
        self.call = clamp(self.call, calls_of(capture, self.layer))
        self.sample = clamp(self.sample, batch_size)
        return replaced


def calls_of(capture: Capture | None, layer: str | None) -> int:
    """How many calls of ``layer`` the capture holds (0 when it has no such layer)."""
    if capture is None or layer is None or layer not in capture:
        return 0
    return len(capture[layer].calls)


def clamp(index: int, count: int) -> int:
    """``index`` within ``0 … count - 1`` (0 when ``count`` is 0)."""
    return min(max(int(index), 0), max(int(count) - 1, 0))
