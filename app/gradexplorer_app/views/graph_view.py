"""The model graph in the window: a pannable, zoomable drawing of the data flow, coloured
by gradients, collapsible by container.

``GraphPanel`` is a toolbar (search, colour-by, fit, export) over a ``GraphCanvas``
(a ``QGraphicsView``). Graph extraction (a forward) and layout run off the UI thread in
``TaskRunner``s; a newer request drops an older one's result. The panel owns only what it
draws; the selection of layers and the current layer live in the session and the window,
which the panel talks to through signals:

* ``layer_selected(name, call)`` when the user clicks a module node;
* ``layer_check_requested(name, checked)`` from a node's context menu (tick/untick);
* ``select_layer(name, call)`` and ``set_checked_layers(names)`` are the other way round.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from PySide6.QtCore import QPoint, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import (
    QAction,
    QBrush,
    QColor,
    QFont,
    QFontMetricsF,
    QPainter,
    QPainterPath,
    QPen,
    QPolygonF,
    QShowEvent,
    QWheelEvent,
)
from PySide6.QtWidgets import (
    QComboBox,
    QGraphicsItem,
    QGraphicsPathItem,
    QGraphicsRectItem,
    QGraphicsScene,
    QGraphicsSceneContextMenuEvent,
    QGraphicsSceneHoverEvent,
    QGraphicsSceneMouseEvent,
    QGraphicsSimpleTextItem,
    QGraphicsView,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QStyleOptionGraphicsItem,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.nonfinite import NonfiniteOnset, onset_location
from gradexplorer.model_graph.graph import GraphView, ModelGraph
from gradexplorer.model_graph.layout import Layout, layout_view, node_label, preload_engines
from gradexplorer.model_graph.render import (
    FLAG_COLORS,
    clip_route,
    color_scale,
    edge_widths,
    node_colors,
    node_tooltip,
    node_value,
    text_color,
    to_svg,
)
from gradexplorer.model_graph.statistics import COLOR_BY, STATISTIC_LABELS
from gradexplorer.pipeline.job import probe_graph
from gradexplorer_app import dialogs
from gradexplorer_app.listeners import listen
from gradexplorer_app.run_worker import Progress, TaskRunner
from gradexplorer_app.views.color_bar import ColorBarWidget
from gradexplorer_app.views.export import write_export
from gradexplorer_app.views.label_fit import wrap_label

#: Colour of selection, search hits and ticked layers.
SELECT_COLOR = QColor("#e6550d")
HIT_COLOR = QColor("#fdd835")
CHECK_COLOR = QColor("#2ca02c")
ONSET_COLOR = QColor("#8e0000")


class GraphNodeItem(QGraphicsItem):
    """One visible node: a box (modules, inputs, outputs) or an ellipse (ops)."""

    def __init__(self, panel: GraphPanel, node_id: str, rect: QRectF, fill: str, label: str,
                 kind: str, container: bool):
        super().__init__()
        self.owner = panel
        self.node_id = node_id
        self.rect = rect
        self.fill = QColor(fill)
        self.text_pen = QPen(QColor(text_color(fill)))
        self.lines = label.split("\n")
        self.kind = kind
        self.container = container
        self.selected_ = False
        self.hit = False
        self.checked = False
        #: "forward" / "backward" when NaN/Inf began in this node (or a node inside it).
        self.onset: list[str] = []
        self.setAcceptHoverEvents(True)
        self.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.setZValue(2)

    def boundingRect(self) -> QRectF:
        # Room for the selection and search rings, and left for the NaN/Inf onset sign.
        return self.rect.adjusted(-26, -8, 8, 8)

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None) -> None:
        pen = QPen(QColor("#333333"), 2.4 if self.container else 1.0)
        if self.hit:
            painter.setPen(QPen(HIT_COLOR, 7))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(self.rect, 6, 6)
        if self.onset:  # where NaN/Inf began: a dark-red ring outside the border
            painter.setPen(QPen(ONSET_COLOR, 2.2))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(self.rect.adjusted(-5, -5, 5, 5), 8, 8)
        if self.selected_:
            pen = QPen(SELECT_COLOR, 3.2)
        painter.setPen(pen)
        painter.setBrush(QBrush(self.fill))
        if self.kind == "op":
            painter.drawEllipse(self.rect)
        else:
            painter.drawRoundedRect(self.rect, 5, 5)
            if self.container:  # a second border says "double-click to open"
                painter.setBrush(Qt.BrushStyle.NoBrush)
                painter.setPen(QPen(QColor("#333333"), 0.8))
                painter.drawRoundedRect(self.rect.adjusted(3, 3, -3, -3), 3, 3)
        if self.checked:
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(CHECK_COLOR)
            painter.drawEllipse(QPointF(self.rect.right() - 5, self.rect.top() + 5), 3.5, 3.5)
        if self.onset:  # a warning sign left of the box, clear of the label
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(ONSET_COLOR)
            tip = QPointF(self.rect.left() - 16, self.rect.center().y() - 7)
            painter.drawPolygon(QPolygonF([tip, tip + QPointF(-7, 13), tip + QPointF(7, 13)]))
            painter.setPen(QPen(QColor("white"), 1.6))
            painter.drawLine(tip + QPointF(0, 4), tip + QPointF(0, 8.5))
            painter.drawPoint(tip + QPointF(0, 11))
        painter.setPen(self.text_pen)
        n = len(self.lines)
        for i, line in enumerate(self.lines):
            painter.setFont(self.owner.font_main if i == 0 else self.owner.font_small)
            h = self.rect.height() / n
            r = QRectF(self.rect.left(), self.rect.top() + i * h, self.rect.width(), h)
            painter.drawText(r, Qt.AlignmentFlag.AlignCenter, line)

    def hoverEnterEvent(self, event: QGraphicsSceneHoverEvent) -> None:
        self.setToolTip(self.owner.tooltip(self.node_id))
        super().hoverEnterEvent(event)

    def mousePressEvent(self, event: QGraphicsSceneMouseEvent) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            self.owner.on_node_clicked(self.node_id)
            event.accept()
            return
        super().mousePressEvent(event)

    def mouseDoubleClickEvent(self, event: QGraphicsSceneMouseEvent) -> None:
        self.owner.toggle(self.node_id)
        event.accept()

    def contextMenuEvent(self, event: QGraphicsSceneContextMenuEvent) -> None:
        self.owner.node_menu(self.node_id, event.screenPos())
        event.accept()


class GraphFrameItem(QGraphicsRectItem):
    """The outline of an expanded container; double-click it to collapse the container."""

    def __init__(self, panel: GraphPanel, node_id: str, rect: QRectF, title: str):
        super().__init__(rect)
        self.owner = panel
        self.node_id = node_id
        self.setPen(QPen(QColor("#9e9e9e"), 1.0, Qt.PenStyle.DashLine))
        self.setBrush(QBrush(QColor(0, 0, 0, 10)))
        self.setZValue(0)
        text = QGraphicsSimpleTextItem(title, self)
        text.setBrush(QColor("#616161"))
        text.setFont(panel.font_small)
        text.setPos(rect.left() + 4, rect.top() + 2)

    def mouseDoubleClickEvent(self, event: QGraphicsSceneMouseEvent) -> None:
        self.owner.toggle(self.node_id)
        event.accept()


class GraphEdgeItem(QGraphicsPathItem):
    """A visible edge: its route, a width by gradient norm, an arrowhead."""

    def __init__(self, points: list[tuple[float, float]], bezier: bool, width: float, tip: str):
        path = QPainterPath(QPointF(*points[0]))
        if bezier and (len(points) - 1) % 3 == 0 and len(points) > 1:
            for i in range(1, len(points), 3):
                path.cubicTo(QPointF(*points[i]), QPointF(*points[i + 1]), QPointF(*points[i + 2]))
        else:
            for p in points[1:]:
                path.lineTo(QPointF(*p))
        end, before = QPointF(*points[-1]), QPointF(*points[-2])
        angle = math.atan2(end.y() - before.y(), end.x() - before.x())
        size = 5 + width
        head = QPolygonF([end, end - QPointF(math.cos(angle - 0.4) * size, math.sin(angle - 0.4) * size),
                          end - QPointF(math.cos(angle + 0.4) * size, math.sin(angle + 0.4) * size)])
        path.addPolygon(head)
        path.closeSubpath()
        super().__init__(path)
        self.setPen(QPen(QColor("#555555"), width, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap,
                         Qt.PenJoinStyle.RoundJoin))
        self.setToolTip(tip)
        self.setZValue(1)


class GraphCanvas(QGraphicsView):
    """Pan by dragging, zoom with the wheel around the cursor."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.TextAntialiasing)
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setViewportUpdateMode(QGraphicsView.ViewportUpdateMode.MinimalViewportUpdate)
        self.setOptimizationFlag(QGraphicsView.OptimizationFlag.DontSavePainterState, True)
        self.setBackgroundBrush(QColor("white"))

    def wheelEvent(self, event: QWheelEvent) -> None:
        factor = 1.0015 ** event.angleDelta().y()
        self.zoom(factor)

    def zoom(self, factor: float) -> None:
        scale = self.transform().m11() * factor
        if 0.02 < scale < 8:
            self.scale(factor, factor)

    #: Scales "Fit" keeps to: below READABLE_SCALE the node names drop under ~10 px
    #: (they are drawn at 8.5 pt); above MAX_FIT_SCALE a small graph looks bloated. A graph
    #: too tall to show whole is drawn at most at its own size (TALL_FIT_SCALE): larger, a
    #: narrow panel showed four of a deep model's boxes.
    READABLE_SCALE = 0.9
    MAX_FIT_SCALE = 1.4
    TALL_FIT_SCALE = 1.0

    def fit(self) -> None:
        """Show the graph whole when that keeps its names readable; otherwise as wide as the
        view allows at a readable scale, from its top (scroll or zoom for the rest), as
        Netron does, rather than a thin column of unreadable boxes."""
        rect = self.scene().itemsBoundingRect()
        if rect.isEmpty():
            return
        rect = rect.adjusted(-20, -20, 20, 20)
        view = self.viewport().rect()
        whole = min(view.width() / rect.width(), view.height() / rect.height())
        across = view.width() / rect.width()
        scale = min(whole, self.MAX_FIT_SCALE)
        if scale < self.READABLE_SCALE:
            scale = max(self.READABLE_SCALE, min(across, self.TALL_FIT_SCALE))
        self.resetTransform()
        self.scale(scale, scale)
        if scale * rect.height() <= view.height():
            self.centerOn(rect.center())
        else:
            self.centerOn(rect.center().x(), rect.top() + view.height() / (2 * scale))


class GraphPanel(QWidget):
    """The graph view with its toolbar.

    Signals
    -------
    layer_selected(str, int)
        A module node was clicked: its qualified name and call index.
    layer_check_requested(str, bool)
        Tick (True) or untick a layer for capture.
    layout_done(float)
        A layout was drawn; seconds from request to drawn scene.
    graph_changed()
        A new graph was set.
    """

    layer_selected = Signal(str, int)
    layer_check_requested = Signal(str, bool)
    layout_done = Signal(float)
    graph_changed = Signal()
    failed = Signal(str)

    def __init__(self, parent: QWidget | None = None, engine: str = "auto", statistics: dict | None = None):
        """``statistics``: what the colour menu offers (key: label), by default a capture's
        (``COLOR_BY``); the compare window offers a comparison's (``DIVERGENCE_BY``)."""
        super().__init__(parent)
        self.engine = engine
        #: The files the window read (its owner sets it): an export never goes over one.
        self.files_read: Callable[[], Iterable[str | None]] = lambda: ()
        self.graph: ModelGraph | None = None
        self.expanded: set[str] = set()
        self.graph_layout: Layout | None = None
        self.items: dict[str, GraphNodeItem] = {}
        self.selected: str | None = None
        self.checked_layers: set[str] = set()
        self.capture: Any = None
        # Where NaN/Inf began: (layer, call) per kind, from the capture's nonfinite_onset.
        self.onset: dict[str, tuple[str, int]] = {}
        self.hits: list[str] = []
        self._hit_index = 0
        self._anchor: tuple[str, QPointF] | None = None
        self._requested_at = 0.0
        self._view: GraphView | None = None
        self._pending: tuple | None = None
        self._requested: tuple | None = None
        self.font_main = QFont()
        self.font_main.setPointSizeF(8.5)
        self.font_small = QFont()
        self.font_small.setPointSizeF(7.0)
        self._fm = QFontMetricsF(self.font_main)

        # A short placeholder: beside the module tree the box is narrow; the tooltip says more.
        self.search = QLineEdit(placeholderText="Find…")
        self.search.setToolTip("Find a layer or op by name; Enter goes to the next match")
        self.search.setClearButtonEnabled(True)
        self.color_by = QComboBox()
        for key, label in (statistics or COLOR_BY).items():
            self.color_by.addItem(label, key)
        self.fit_button = QPushButton("Fit")
        self.export_button = QPushButton("Export…")
        self.scale_label = wrap_label(QLabel())
        self.status = wrap_label(QLabel("No graph yet: load a model with an input."))
        # Two rows: beside the module tree the panel is narrow, and one row cut the search
        # box to "Fi…" and the colouring to "Colour: gradie".
        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        self.search.setMaximumWidth(360)
        bar.addWidget(self.search, 1)
        bar.addWidget(self.fit_button)
        bar.addWidget(self.export_button)
        bar.addStretch(0)
        colour_row = QHBoxLayout()
        colour_row.setContentsMargins(0, 0, 0, 0)
        colour_row.addWidget(QLabel("Colour by"))
        colour_row.addWidget(self.color_by)
        colour_row.addStretch(1)
        # The colour key on its own row: the log colour bar with its powers of ten, or the
        # flags' key, and what is coloured.
        self.color_bar = ColorBarWidget(self)
        key = QHBoxLayout()
        key.setContentsMargins(0, 0, 0, 0)
        key.addWidget(self.color_bar, 3)
        key.addWidget(self.scale_label, 2)
        self.canvas = GraphCanvas(self)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addLayout(bar)
        lay.addLayout(colour_row)
        lay.addLayout(key)
        lay.addWidget(self.canvas, 1)
        lay.addWidget(self.status)

        self.layouts = TaskRunner("graph layout", self)
        # igraph (the layout of big views) is slow to import, holding the GIL: it is
        # imported in a worker when the panel is made (the window's start-up), not in the
        # first layout (gradexplorer.model_graph.layout.preload_engines).
        self.preloads = TaskRunner("graph layout libraries", self)
        self.preloads.start(lambda progress, cancel: preload_engines())
        self.extractions = TaskRunner("graph extraction", self)
        self.layouts.finished.connect(self._on_layout)
        self.layouts.failed.connect(self._on_failed)
        self.extractions.finished.connect(self._on_extracted)
        self.extractions.failed.connect(self._on_failed)
        self.search.returnPressed.connect(self.next_hit)
        self.search.textChanged.connect(self.find)
        self.color_by.currentIndexChanged.connect(lambda _i: self.recolor())
        self.fit_button.clicked.connect(self.canvas.fit)
        self.export_button.clicked.connect(lambda: self.export())

    # -- input ----------------------------------------------------------------------
    def extract(self, model: Any, inputs: Any = None, lock: Any = None, input_shape: tuple | None = None,
                memory_budget: int | None = None) -> int:
        """Extract the graph of ``model`` in a worker (one forward), then draw it.

        The forward runs on one sample (``gradexplorer.pipeline.job.probe_graph``): the first
        of the batch ``inputs``, a view (an expanded batch is never copied), or without one a
        random sample of ``input_shape``; over the memory budget the status says so and
        nothing of the sample's size is made. ``lock`` (the session's run lock) is held while
        the probe's hooks are on the model, so that a capture running at the same time never
        sees them."""
        self.status.setText("Finding the graph (one forward)…")

        def task(progress: Progress, cancel: threading.Event) -> ModelGraph:
            return probe_graph(model, inputs, input_shape, lock, memory_budget)

        self._pending = None
        return self.extractions.start(task)

    def request_extract(self, model: Any, inputs: Any = None, lock: Any = None, input_shape: tuple | None = None,
                        memory_budget: int | None = None) -> None:
        """:meth:`extract` now when the panel is shown, else when it is first shown (a
        forward costs time that a user who never opens the graph should not pay). The same
        model and batch asked for again (a model announced with its batch) run once."""
        request = (model, inputs, lock, input_shape, memory_budget)
        last = self._requested
        if last is not None and last[0] is model and last[1] is inputs and last[2:] == request[2:]:
            return
        self._requested = request
        self._pending = request
        if self.isVisible():
            self.extract(*request)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self._pending is not None:
            self.extract(*self._pending)

    def set_graph(self, graph: ModelGraph | None, capture: Any = None) -> None:
        """Show ``graph`` collapsed to its default depth (about 60 nodes)."""
        self.graph = graph
        self.selected = None
        self.graph_layout = None
        self.canvas.scene().clear()
        self.items = {}
        if graph is None:
            self._pending = self._requested = None
            self.status.setText("No graph.")
            return
        if capture is not None:
            graph.attach_capture(capture)
        self.expanded = graph.expanded_to_depth(graph.default_depth())
        self.graph_changed.emit()
        self.relayout()

    def set_capture(self, capture: Any, carried: bool = False) -> None:
        """Colour by a new capture's statistics (``None``: the capture was dropped). With
        ``carried`` (a capture opened without its model), or when no graph is shown, draw
        the graph the capture file carries. A graph extracted later is coloured by it too."""
        self.capture = capture
        if capture is None:
            self.set_onset(None)
            return
        data = getattr(capture, "graph", None)
        if data and (carried or self.graph is None):
            try:
                graph = ModelGraph.from_dict(data, source="the capture's graph")
            except GradExplorerError as exc:
                self.status.setText(f"Graph: {exc.problem}")
                return
            self.set_graph(graph, capture)
            self.set_onset(getattr(capture, "nonfinite_onset", None))
            return
        if self.graph is not None and capture is not None:
            self.graph.attach_capture(capture)
            self.recolor()
        self.set_onset(getattr(capture, "nonfinite_onset", None))

    def set_onset(self, onset: NonfiniteOnset | None) -> None:
        """Mark the nodes where NaN/Inf began (``Capture.nonfinite_onset``), or none."""
        self.onset = {}
        for kind in ("forward", "backward"):
            where = onset_location(onset, kind)
            if where is not None:
                self.onset[kind] = (where[0], int(where[1] or 0))
        self._mark_onset()

    def onset_node(self, kind: str) -> str | None:
        """The visible node that holds the onset ``kind`` (itself or its collapsed container)."""
        if self.graph is None or kind not in self.onset:
            return None
        name, call = self.onset[kind]
        node = self.graph.module_node(name, call) or self.graph.module_node(name, 0)
        return None if node is None else self.graph.representative(node.id, self.expanded)

    def _mark_onset(self) -> None:
        marks: dict[str, list[str]] = {}
        for kind in self.onset:
            nid = self.onset_node(kind)
            if nid is not None:
                marks.setdefault(nid, []).append(kind)
        for nid, item in self.items.items():
            if item.onset != marks.get(nid, []):
                item.onset = marks.get(nid, [])
                item.update()

    def set_checked_layers(self, names: Iterable[str]) -> None:
        """Show which layers are ticked for capture (a green dot)."""
        self.checked_layers = set(names)
        for nid, item in self.items.items():
            assert self.graph is not None  # items are the drawn graph's nodes
            node = self.graph.nodes[nid]
            item.checked = node.kind == "module" and node.name in self.checked_layers
            item.update()

    def select_layer(self, name: str, call: int = 0) -> bool:
        """Select the node of ``name``'s call ``call`` (or the container that holds it)."""
        if self.graph is None:
            return False
        node = self.graph.module_node(name, call) or self.graph.module_node(name, 0)
        if node is None:
            return False
        self._select(self.graph.representative(node.id, self.expanded), center=True)
        return True

    # -- layout -----------------------------------------------------------------------
    def relayout(self, anchor: str | None = None, anchor_to: str | None = None) -> int:
        """Lay out the current collapse state in a worker; ``anchor``'s old position is where
        ``anchor_to`` (or ``anchor``) lands in the new one."""
        assert self.graph is not None
        if anchor is not None and anchor in self.items:
            self._anchor = (anchor_to or anchor, self.items[anchor].rect.center())
        else:
            self._anchor = None
        graph, expanded, engine = self.graph, set(self.expanded), self.engine
        self._requested_at = time.perf_counter()
        self.status.setText("Laying out…")

        def task(progress: Progress, cancel: threading.Event) -> tuple[ModelGraph, set[str], GraphView, Layout]:
            view = graph.view(expanded)
            return graph, expanded, view, layout_view(graph, view, engine)

        return self.layouts.start(task)

    def _on_extracted(self, _gen: int, graph: ModelGraph, _seconds: float) -> None:
        # The capture shown may have come before the graph (the tab opened after a run).
        self.set_graph(graph, self.capture)

    def _on_failed(self, _gen: int, exc: BaseException) -> None:
        # The problem and its fix (over the memory budget: by how much, and what to do).
        text = str(exc) if isinstance(exc, GradExplorerError) else (getattr(exc, "problem", None) or str(exc))
        self.status.setText(f"Graph: {text}")
        self.failed.emit(str(text))

    def _on_layout(self, _gen: int, result: tuple[ModelGraph, set[str], GraphView, Layout], _seconds: float) -> None:
        graph, expanded, view, layout = result
        if graph is not self.graph:
            return  # a graph replaced since
        if self._anchor is not None and self._anchor[0] in layout.pos:
            nid, old = self._anchor
            x, y = layout.pos[nid]
            layout = layout.shifted(old.x() - x, old.y() - y)
        self.graph_layout = layout
        self._view = view
        self._draw(graph, view, layout)
        self.layout_done.emit(time.perf_counter() - self._requested_at)

    def _draw(self, graph: ModelGraph, view: GraphView, layout: Layout) -> None:
        scene = self.canvas.scene()
        keep_transform = self._anchor is not None
        center = self.canvas.mapToScene(self.canvas.viewport().rect().center())
        scene.clear()
        self.items = {}
        colors = node_colors(graph, view.nodes, self.statistic)
        widths = edge_widths(view)
        for nid in view.nodes:
            (cx, cy), (w, h) = layout.pos[nid], layout.size[nid]
            node = graph.nodes[nid]
            item = GraphNodeItem(self, nid, QRectF(cx - w / 2, cy - h / 2, w, h), colors[nid],
                                 node_label(graph, nid), node.kind, graph.is_container(nid))
            item.checked = node.kind == "module" and node.name in self.checked_layers
            scene.addItem(item)
            self.items[nid] = item
        bezier = layout.engine == "dot"
        for e in view.edges:
            tip = f"{'×'.join(map(str, e.shape))}" + (f"   |grad| {e.grad_l2:.4g}" if e.grad_l2 is not None else "")
            if len(e.members) > 1:
                tip += f"   ({len(e.members)} tensors)"
            pts = clip_route(layout, e.src, e.dst)
            scene.addItem(GraphEdgeItem(pts, bezier, widths[(e.src, e.dst)], tip))
        # Frames from the innermost out: each encloses its boxes and the frames inside it, with
        # a band of its own for its name (nested frames' names had been drawn over each other).
        band = QFontMetricsF(self.font_small).height() + 4
        frames: dict[str, QRectF] = {}
        for cid in sorted(self.expanded, key=graph.depth, reverse=True):
            if cid == "m::0":
                continue  # the model itself: its frame would only repeat the window's edge
            below = set(graph.descendants(cid))
            rect = QRectF()
            for n in below:
                if n in self.items:
                    rect = rect.united(self.items[n].rect)
                if n in frames:
                    rect = rect.united(frames[n])
            if rect.isNull():
                continue
            pad = 6
            frames[cid] = rect.adjusted(-pad, -pad - band, pad, pad)
        for cid in sorted(frames, key=graph.depth):
            scene.addItem(GraphFrameItem(self, cid, frames[cid], graph.nodes[cid].name + "  ▾"))
        scene.setSceneRect(scene.itemsBoundingRect().adjusted(-200, -200, 200, 200))
        self._mark_onset()
        if self.selected in self.items:
            self.items[self.selected].selected_ = True
        elif self.selected is not None:
            self.selected = None
        self._update_scale_label(graph, view)
        if keep_transform:
            self.canvas.centerOn(center)
        else:
            self.canvas.fit()
        self.status.setText(f"{len(view.nodes)} of {len(graph.nodes)} nodes shown, {len(view.edges)} edges. "
                            "Double-click a box with a double border to open it, a frame to close it; "
                            "scroll to zoom.")
        # How long the layout took is for whoever tunes it, not a figure to read every time.
        self.status.setToolTip(f"laid out by {layout.engine} in {layout.seconds * 1000:.0f} ms")
        if self.search.text():
            self.find_nodes(self.search.text())

    # -- colour ---------------------------------------------------------------------
    @property
    def statistic(self) -> str:
        return self.color_by.currentData() or "grad_l2"

    def recolor(self) -> None:
        if self.graph is None or self._view is None:
            return
        colors = node_colors(self.graph, self._view.nodes, self.statistic)
        for nid, item in self.items.items():
            item.fill = QColor(colors[nid])
            item.text_pen = QPen(QColor(text_color(colors[nid])))
            item.update()
        self._update_scale_label(self.graph, self._view)

    def _update_scale_label(self, graph: ModelGraph, view: GraphView) -> None:
        stat = self.statistic
        if stat == "flags":
            self.color_bar.set_scale(None)
            self.color_bar.hide()
            self.scale_label.setText("flags: " + " ".join(
                f"<span style='color:{color}'>■</span>&nbsp;{flag}" for flag, color in FLAG_COLORS.items()))
            return
        scale = color_scale(graph, view.nodes, stat)
        self.color_bar.set_scale(scale)
        self.color_bar.setVisible(scale.lo is not None)
        if scale.lo is None:
            zeros = scale.zero_low and any(node_value(graph, n, stat) == 0 for n in view.nodes)
            self.scale_label.setText(f"{STATISTIC_LABELS[stat]}: 0 at every node (identical)" if zeros
                                     else "no statistics: run a capture")
            return
        self.scale_label.setText(f"{STATISTIC_LABELS[stat]} (log{', 1 in the middle' if scale.diverging else ''})")

    # -- interaction ------------------------------------------------------------------
    def tooltip(self, node_id: str) -> str:
        if self.graph is None:
            return ""
        text = node_tooltip(self.graph, node_id)
        item = self.items.get(node_id)
        for kind in item.onset if item is not None else []:
            name, call = self.onset[kind]
            node = self.graph.module_node(name, call) or self.graph.module_node(name, 0)
            where = "here" if node is not None and node.id == node_id else f"inside, at {name} call {call + 1}"
            text += f"\nNaN/Inf began {where} ({kind})"
        return text

    def _select(self, node_id: str | None, center: bool = False) -> None:
        if self.selected in self.items:
            self.items[self.selected].selected_ = False
            self.items[self.selected].update()
        self.selected = node_id
        if node_id in self.items:
            self.items[node_id].selected_ = True
            self.items[node_id].update()
            if center:
                self.canvas.centerOn(self.items[node_id])

    def on_node_clicked(self, node_id: str) -> None:
        self._select(node_id)
        assert self.graph is not None  # a node was clicked: a graph is drawn
        node = self.graph.nodes[node_id]
        if node.kind == "module" and node.name:
            self.layer_selected.emit(node.name, int(node.call or 0))

    def toggle(self, node_id: str) -> None:
        """Expand a collapsed container or collapse an expanded one, keeping it in place."""
        if self.graph is None or not self.graph.is_container(node_id):
            return
        if node_id in self.expanded:
            # Collapse: the container appears where its first visible descendant was.
            first = next((n for n in self.graph.descendants(node_id)[::-1] if n in self.items), None)
            first = self._first_visible_inside(node_id) or first
            self.expanded -= {node_id, *self.graph.descendants(node_id)}
            self.relayout(anchor=first, anchor_to=node_id)
        else:
            self.expanded.add(node_id)
            child = self.graph.children[node_id][0]
            self.relayout(anchor=node_id, anchor_to=child)

    def _first_visible_inside(self, node_id: str) -> str | None:
        assert self.graph is not None
        inside = set(self.graph.descendants(node_id))
        return next((n for n in self.graph.nodes if n in inside and n in self.items), None)

    def node_menu(self, node_id: str, screen_pos: QPoint) -> None:
        self.build_node_menu(node_id).exec(screen_pos)

    def build_node_menu(self, node_id: str) -> QMenu:
        """The context menu of a node: tick/untick the layer, expand or collapse."""
        assert self.graph is not None  # a node was right-clicked: a graph is drawn
        graph = self.graph
        node = graph.nodes[node_id]
        menu = QMenu(self)
        if node.kind == "module" and node.name:
            ticked = node.name in self.checked_layers
            act = QAction("Capture this layer", menu, checkable=True, checked=ticked)
            act.toggled.connect(lambda on, n=node.name: self.layer_check_requested.emit(n, on))
            menu.addAction(act)
        if graph.is_container(node_id):
            menu.addAction("Collapse" if node_id in self.expanded else "Expand", lambda: self.toggle(node_id))
        parent = node.parent
        if parent is not None and parent in self.expanded and parent != "m::0":
            menu.addAction(f"Collapse {graph.nodes[parent].name}", lambda: self.toggle(parent))
        return menu

    def find_nodes(self, text: str) -> list[str]:
        """Highlight the visible nodes whose name contains ``text`` (or hold a match)."""
        for item in self.items.values():
            if item.hit:
                item.hit = False
                item.update()
        self.hits = []
        self._hit_index = 0
        text = text.strip().lower()
        if not text or self.graph is None:
            return []
        found: list[str] = []
        for n in self.graph:
            if text in (n.name or "").lower() or text in n.type.lower():
                rep = self.graph.representative(n.id, self.expanded)
                if rep in self.items and rep not in found:
                    found.append(rep)
        for nid in found:
            self.items[nid].hit = True
            self.items[nid].update()
        self.hits = found
        if found:
            self.canvas.centerOn(self.items[found[0]])
        return found

    def next_hit(self) -> None:
        if self.hits:
            self._hit_index = (self._hit_index + 1) % len(self.hits)
            self.canvas.centerOn(self.items[self.hits[self._hit_index]])

    # -- export ---------------------------------------------------------------------
    def export(self, path: str | None = None) -> str | None:
        """Write the current view as SVG or PNG (by the file's suffix); asks for a path if none."""
        if self.graph is None or self.graph_layout is None or self._view is None:
            return None
        if path is None:
            path = dialogs.ask_save_file(self, "Export graph", "graph.svg", "SVG (*.svg);;PNG (*.png)")
            if not path:
                return None

        svg = to_svg(self.graph, self._view, self.graph_layout, self.statistic,
                     title=str(self.graph.meta.get("model", "")))
        if path.lower().endswith(".png"):
            # Imported on first use: Qt's SVG renderer is needed only for a PNG export.
            from gradexplorer_app.views.graph_picture import svg_to_png

            data = svg_to_png(svg)
        else:
            data = svg.encode()
        try:
            write_export(data, path, self.files_read())
        except GradExplorerError as exc:
            self.status.setText(f"Not exported: {exc.problem} {exc.fix}")
            self.failed.emit(str(exc.problem))
            return None
        self.status.setText(f"Exported {path}")
        return path

    def shutdown(self) -> None:
        self.preloads.shutdown()
        self.layouts.shutdown()
        self.extractions.shutdown()


def wire_graph_panel(panel: GraphPanel, session: Any, view_state: Any, controller: Any, tree_view: Any) -> None:
    """Connect the graph panel to the window's session, view state, controller and tree.

    * a click on a module node selects that layer and call (the views and the tree follow
      the view state); a layer chosen elsewhere selects its node (or the collapsed
      container that holds it);
    * ticks from the graph's context menu go to the session's selection, and the graph
      shows the session's ticks;
    * a new model or batch extracts the graph in a worker (holding the session's run lock);
      a capture colours it; a capture opened without its model draws the graph it carries.
    """

    panel.files_read = session.files_read

    def on_layer_selected(name: str, call: int) -> None:
        cap = session.capture
        if cap is not None and name in cap.layers:
            view_state.select(name, min(call, max(len(cap[name].calls) - 1, 0)))
        else:
            # The tree's row first: the controller then shows a block through the last
            # call inside it while the tree stays on the block's row.
            tree_view.select_layer(name)
            controller.select_layer(name)  # that call, or "not captured"

    def follow_state(*_args: object) -> None:
        if view_state.layer:
            panel.select_layer(view_state.layer, view_state.call)

    def extract(*_args: object) -> None:
        # Nothing of the input's size is made here, on the UI thread: the worker takes one
        # sample of the batch (a view) or makes a random one, within the memory budget.
        model, batch = session.model, session.batch
        if model is None:
            panel.set_graph(None)
            return
        panel.request_extract(model.module, batch.model_input if batch is not None and len(batch) else None,
                              lock=getattr(session, "_run_lock", None), input_shape=model.input_shape,
                              memory_budget=getattr(session, "memory_budget", None))

    def on_capture(capture: Any, _batch: Any = None) -> None:
        panel.set_capture(capture, carried=capture is not None and session.model is None)

    panel.layer_selected.connect(on_layer_selected)
    listen(view_state.events.layer, follow_state)
    listen(view_state.events.call, follow_state)
    panel.layer_check_requested.connect(session.set_checked)
    listen(session.selection_changed, lambda names: panel.set_checked_layers(names))
    listen(session.model_changed, extract)
    listen(session.batch_changed, extract)
    controller.capture_shown.connect(on_capture)
    panel.graph_changed.connect(lambda: panel.set_checked_layers(session.selection))
    panel.graph_changed.connect(follow_state)  # a graph drawn after a run shows the layer in view
