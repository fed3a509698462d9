"""Where NaN/Inf began, in the window: a status-bar link per onset (forward, backward) that
selects that layer and call everywhere (views, module tree, graph).

``gradexplorer.capturing.nonfinite`` finds the places (``Capture.nonfinite_onset``,
``onset_location``); the tree and the graph mark them (``gradexplorer_app.window.module_tree_view``,
``gradexplorer_app.views.graph_view``); this label says it in words and jumps there.
"""

from __future__ import annotations

from html import escape
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLabel, QWidget

from gradexplorer.capturing.nonfinite import onset_location

KINDS = ("forward", "backward")


class OnsetLinkLabel(QLabel):
    """"NaN/Inf began at <layer> · gradient at <layer>", each a link; hidden when all was finite.

    Signals
    -------
    jump_requested(str, int)
        The layer and call (0-based) of the link the user clicked.
    """

    jump_requested = Signal(str, int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.places: dict[str, tuple[str, int]] = {}
        self.input_bad = False
        self.setOpenExternalLinks(False)
        self.linkActivated.connect(self.jump)
        self.hide()

    def set_capture(self, capture: Any) -> None:
        onset = getattr(capture, "nonfinite_onset", None) if capture is not None else None
        self.places = {}
        for kind in KINDS:
            where = onset_location(onset, kind)
            if where is not None:
                self.places[kind] = (where[0], int(where[1] or 0))
        forward = (onset or {}).get("forward") or {}
        self.input_bad = bool(forward) and forward.get("layer") is None
        parts = []
        for kind in KINDS:
            if kind in self.places:
                name, call = self.places[kind]
                what = "NaN/Inf began at" if kind == "forward" else "its gradient at"
                if kind == "backward" and "forward" not in self.places:
                    what = "NaN/Inf gradient began at"
                parts.append(f"{what} <a href='{kind}'>{escape(name or '(model)')}, call {call + 1}</a>")
        if self.input_bad:
            parts.insert(0, "the input batch holds NaN/Inf")
        self.setText("  <span style='color:#8e0000'>⚠</span> " + " · ".join(parts) + "  " if parts else "")
        self.setToolTip("Click a link to select that layer and call in the views, the tree and the graph."
                        if self.places else "")
        self.setVisible(bool(parts))

    def jump(self, kind: str) -> None:
        """Ask to go to the onset ``kind`` ("forward" or "backward"), when there is one."""
        if kind in self.places:
            self.jump_requested.emit(*self.places[kind])


def jump_to_layer(name: str, call: int, session: Any, view_state: Any, tree_view: Any, graph_panel: Any,
                  status: Any = None) -> None:
    """Select ``name``'s call ``call`` everywhere: the views (when it was captured), the
    module tree and the graph. ``status(text, ms)`` says when the views cannot show it."""
    cap = session.capture
    captured = cap is not None and name in cap.layers
    if captured:
        view_state.select(name, min(call, max(len(cap[name].calls) - 1, 0)))
    if tree_view.current_name() != name:
        tree_view.select_layer(name)
    graph_panel.select_layer(name, call)
    if not captured and status is not None:
        status(f"{name or 'The model'} was not captured: the tree and the graph show it; "
               "tick it and run again to see its tensors.", 8000)


def wire_onset_link(label: OnsetLinkLabel, window: Any) -> None:
    """Show each new capture's onset in ``label`` and make its links jump (``window`` is the
    main window: its controller, session, view state, tree and graph panel)."""
    label.set_capture(window.session.capture)
    window.controller.capture_shown.connect(lambda capture, _batch=None: label.set_capture(capture))
    label.jump_requested.connect(lambda name, call: jump_to_layer(
        name, call, window.session, window.view_state, window.tree_view, window.graph_panel,
        status=lambda text, ms: window.statusBar().showMessage(text, ms)))
