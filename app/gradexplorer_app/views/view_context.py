"""What every view of a capture looks at: the capture, the batch, and the selection.

``ViewContext`` is an immutable snapshot handed to each view; ``CaptureView`` is the
base of the views: a stack of the view's content and a message page, and lazy redraws
(a view only recomputes when it is shown and its context changed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PySide6.QtCore import Qt
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QLabel, QStackedWidget, QVBoxLayout, QWidget

from gradexplorer.analysis.capture_summary import input_shape_of
from gradexplorer.analysis.heatmaps import grad_x_activation
from gradexplorer.capturing.data import CallRecord, Capture, LayerRecord, layer_label
from gradexplorer.capturing.inputs import Batch
from gradexplorer.files.meta import capture_meta
from gradexplorer.pipeline.view_state import TENSOR_KINDS as TENSOR_LABELS  # noqa: F401 - the views' name for it

#: The note views that need tensors show for statistics-only captures.
STATS_ONLY_NOTE = (
    "Statistics-only capture: re-run in full mode (uncheck \"statistics only\") to see {what}."
)

@dataclass(frozen=True)
class ViewContext:
    """The capture and what is selected in it."""

    capture: Capture | None = None
    batch: Batch | None = None
    layer: str | None = None
    call: int = 0
    sample: int = 0

    @property
    def record(self) -> LayerRecord | None:
        if self.capture is None or self.layer is None or self.layer not in self.capture:
            return None
        return self.capture[self.layer]

    @property
    def call_record(self) -> CallRecord | None:
        rec = self.record
        if rec is None or not rec.calls:
            return None
        return rec.calls[min(max(self.call, 0), len(rec.calls) - 1)]

    def selected(self) -> tuple[Capture, LayerRecord, CallRecord]:
        """The capture, layer and call shown, for a view whose ``common_problem()`` found
        none of them missing."""
        cap, rec, call = self.capture, self.record, self.call_record
        assert cap is not None and rec is not None and call is not None, "checked by common_problem()"
        return cap, rec, call

    @property
    def stats_only(self) -> bool:
        return self.capture is not None and self.capture.mode == "stats"

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        """The model input's shape (batch first), when one tensor was fed; it tells a
        sequence from a picture (``gradexplorer.analysis.token_grid``)."""
        return input_shape_of(self.capture, self.batch)

    @property
    def batch_size(self) -> int:
        if self.capture is not None:
            dataset = self.capture.meta.get("dataset")
            if dataset:  # a dataset capture (gradexplorer.recording.dataset_capture): every sample it saw
                return int(dataset.get("samples", 0))
            if self.capture.input is not None and self.capture.input.dim() > 0:
                return int(self.capture.input.shape[0])
            for _, _, call in self.capture.iter_calls():
                if call.shape:
                    return int(call.shape[0])
        if self.batch is not None:
            return len(self.batch)
        return 0

    def sample_name(self) -> str:
        if self.batch is not None and 0 <= self.sample < len(self.batch.names):
            return self.batch.names[self.sample]
        if self.capture is not None:  # a capture opened from a file names its samples
            return capture_meta(self.capture).sample_name(self.sample)
        return f"sample {self.sample}"

    def tokens(self) -> tuple[str, ...] | None:
        """The selected sample's token strings, for a batch of texts (else None)."""
        if self.batch is not None and self.batch.tokens is not None:
            rows = self.batch.tokens
            return tuple(rows[self.sample]) if 0 <= self.sample < len(rows) else None
        if self.capture is not None:
            return capture_meta(self.capture).tokens_of(self.sample)
        return None

    def tensor(self, kind: str) -> torch.Tensor | None:
        """The whole batch's tensor of the selected call (``kind`` in ``TENSOR_LABELS``)."""
        call = self.call_record
        if call is None:
            return None
        if kind == "grad_x_activation":
            return grad_x_activation(call.activation, call.grad_output)
        return call.tensor(kind)

    def sample_tensor(self, kind: str) -> torch.Tensor | None:
        """The selected sample's slice of ``tensor(kind)``."""
        call = self.call_record
        if call is None:
            return None
        if kind == "grad_x_activation":
            a, g = call.activation, call.grad_output
            if a is None or g is None:
                return None
            return grad_x_activation(self._slice(a), self._slice(g))
        t = call.tensor(kind)
        return None if t is None else self._slice(t)

    def _slice(self, t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0:
            return t
        return t[min(max(self.sample, 0), t.shape[0] - 1)]


class CaptureView(QWidget):
    """Base of the views: shows either its content or a message, redraws lazily.

    Subclasses build their content widget, pass it to ``__init__`` via ``set_content``,
    and implement ``refresh()`` (draw ``self.context``).
    """

    #: Tab title.
    title = "view"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.context = ViewContext()
        self._dirty = True
        self._stack = QStackedWidget(self)
        self._message = QLabel(self)
        self._message.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._message.setWordWrap(True)
        self._message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._message.setStyleSheet("QLabel { color: palette(placeholder-text); font-size: 13px; padding: 24px; }")
        self._stack.addWidget(self._message)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._stack)

    def set_content(self, widget: QWidget) -> None:
        self._stack.insertWidget(0, widget)
        self._stack.setCurrentIndex(0)

    def show_message(self, text: str) -> None:
        self._message.setText(text)
        self._stack.setCurrentWidget(self._message)

    def show_content(self) -> None:
        self._stack.setCurrentIndex(0)

    def message(self) -> str:
        """The message shown, or "" when the content is shown (for tests)."""
        return self._message.text() if self._stack.currentWidget() is self._message else ""

    def set_context(self, context: ViewContext) -> None:
        """Store the new selection; redraw now only if visible."""
        self.context = context
        self._dirty = True
        if self.isVisible():
            self.ensure_drawn()

    def ensure_drawn(self) -> None:
        if self._dirty:
            self._dirty = False
            self.refresh()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.ensure_drawn()

    def refresh(self) -> None:
        raise NotImplementedError

    def export_widget(self) -> QWidget:
        """The widget a PNG export grabs (each view names its plot)."""
        raise NotImplementedError

    def plot_widgets(self) -> list[QWidget]:
        """The widgets a right-click on offers to copy or export (by default the export's)."""
        return [self.export_widget()]

    def export_detail(self) -> str:
        """What the plot shows, for an export's title line ("gradient, top-k channels")."""
        return ""

    def common_problem(self, needs_tensors: str | None = None) -> str | None:
        """The message for a missing capture, layer or (when asked) tensors, else None."""
        ctx = self.context
        if ctx.capture is None:
            return "No capture yet: choose a model and a batch, then Run (Ctrl+R)."
        if ctx.layer is None:
            return "Select a layer in the module tree or click a bar of the gradient-flow chart."
        name = layer_label(ctx.layer)
        if ctx.record is None:
            return f"Layer '{name}' was not captured. Check it in the module tree and run again."
        if ctx.call_record is None:
            params = ", ".join(p for p, s in ctx.record.param_stats.items() if s)
            return (f"'{name}' never ran during the forward pass (its parent used its weights directly): it "
                    "computed nothing, so it has no output nor output gradient — it is not a gradient that was "
                    "lost." + (f" Its parameters' gradients ({params}) are in the Statistics tab." if params else ""))
        if needs_tensors and ctx.stats_only:
            return STATS_ONLY_NOTE.format(what=needs_tensors)
        return None
