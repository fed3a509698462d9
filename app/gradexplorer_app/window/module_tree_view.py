"""The module tree: a checkable, filterable view of the model's modules.

``ModuleTreeModel`` is a ``QAbstractItemModel`` over the session's core
``ModuleTree``: rows come straight from the core nodes' children lists (no item copies),
so even a tree of thousands of modules appears at once. Its ``CheckStateRole`` reads and
writes ``Session.selection``; a parent's partially-checked state is derived from the
selection below it, never stored.

Columns: name (with badges for reused, in-place and flagged modules), type, parameters,
output shape, calls, and after a run the gradient norm with a small inline bar.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeAlias, overload

from PySide6.QtCore import (
    QAbstractItemModel,
    QEvent,
    QItemSelectionModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QPoint,
    QRect,
    QSize,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import (
    QAction,
    QBrush,
    QColor,
    QFont,
    QFontMetrics,
    QGuiApplication,
    QKeyEvent,
    QKeySequence,
    QPainter,
    QPalette,
    QResizeEvent,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.analysis.capture_summary import summarize
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.module_tree import ModuleNode, ModuleTree
from gradexplorer.capturing.nonfinite import onset_location
from gradexplorer.pipeline.session import Session
from gradexplorer_app.listeners import listen
from gradexplorer_app.views.context_menus import full_value

#: What Qt hands an item model's overrides: an index, or a persistent one.
AnyIndex: TypeAlias = QModelIndex | QPersistentModelIndex

COLUMNS = ("Module", "Type", "Output", "Grad norm", "Params", "Calls")
COL_NAME, COL_TYPE, COL_SHAPE, COL_GRAD, COL_PARAMS, COL_CALLS = range(len(COLUMNS))

NAME_ROLE = Qt.ItemDataRole.UserRole + 1      # qualified name (str)
TYPE_ROLE = Qt.ItemDataRole.UserRole + 2      # type name (str)
BADGES_ROLE = Qt.ItemDataRole.UserRole + 3    # [(text, QColor)]
BAR_ROLE = Qt.ItemDataRole.UserRole + 4       # float in [0, 1] or None
FLAG_ROLE = Qt.ItemDataRole.UserRole + 5      # str or None
ONSET_ROLE = Qt.ItemDataRole.UserRole + 6     # [str]: where NaN/Inf began ("forward", "backward")

BLUE = QColor("#2f6fb3")
ORANGE = QColor("#c46a12")
GREY = QColor("#6b7280")
RED = QColor("#c0392b")
PURPLE = QColor("#7b4bb3")
FLAG_BACKGROUND = QColor(192, 57, 43, 36)
ONSET = QColor("#8e0000")

_CHECKED = Qt.CheckState.Checked
_UNCHECKED = Qt.CheckState.Unchecked
_PARTIAL = Qt.CheckState.PartiallyChecked


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def format_count(n: int) -> str:
    """``11689512`` -> ``"11.7M"``; small numbers as they are."""
    if n < 10_000:
        return str(n)
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def format_shape(shape: tuple) -> str:
    return "×".join(str(d) for d in shape) if shape else "scalar"


class ModuleTreeModel(QAbstractItemModel):
    """The session's module tree as a checkable item model.

    Row ids (``QModelIndex.internalId``) are positions in a pre-order list of the core
    nodes; the only tree-sized work is numbering them and, on each selection change,
    counting selected leaves bottom-up, both linear and a few milliseconds on the
    largest torchvision model.
    """

    def __init__(self, session: Session, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self._tree: ModuleTree | None = None
        self._names: list[str] = []
        self._ids: dict[str, int] = {}
        self._children: list[list[int]] = []
        self._parent: list[int] = []
        self._row: list[int] = []
        self._leaf_total: list[int] = []
        self._state: list[Qt.CheckState] = []
        self._norms: dict[str, float] = {}
        self._bar: dict[str, float] = {}
        self._flags: dict[str, str] = {}
        self._notes: dict[str, str] = {}
        #: Captured layers that never ran during forward (``CaptureSummary.not_called``).
        self._not_called: frozenset[str] = frozenset()
        self._onset: dict[str, list[str]] = {}
        self._last_selection: frozenset[str] = frozenset()
        listen(session.tree_changed, self._on_model_tree_changed)
        listen(session.selection_changed, self._on_model_selection_changed)
        listen(session.capture_changed, self._on_model_capture_changed)
        listen(session.tree_measured, self._on_model_tree_measured)
        self._on_model_tree_changed(session.tree)
        self._on_model_capture_changed(session.capture)

    # -- building -----------------------------------------------------------------
    def _on_model_tree_changed(self, tree: ModuleTree | None) -> None:
        self.beginResetModel()
        self._tree = tree
        self._names, self._ids, self._children, self._parent, self._row = [], {}, [], [], []
        if tree is not None and "" in tree.nodes:
            nodes = tree.nodes
            stack = [("", -1, 0)]
            while stack:
                name, parent, row = stack.pop()
                i = len(self._names)
                self._names.append(name)
                self._ids[name] = i
                self._children.append([])
                self._parent.append(parent)
                self._row.append(row)
                if parent >= 0:
                    self._children[parent].append(i)
                kids = [c for c in nodes[name].children if c in nodes]
                for r in range(len(kids) - 1, -1, -1):
                    stack.append((kids[r], i, r))
            # Children were appended in pre-order, which is row order.
        self._leaf_total = self._count_leaves()
        self._last_selection = self.session.selection
        self._state = self._compute_states(self._last_selection)
        self.endResetModel()

    def type_names(self) -> tuple[str, list[str]]:
        """The Type column's texts: the root's (drawn in bold) and those of the other rows."""
        if self._tree is None or not self._names:
            return "", []
        nodes = self._tree.nodes
        return nodes[self._names[0]].type, sorted({nodes[n].type for n in self._names[1:]})

    def _count_leaves(self) -> list[int]:
        total = [0] * len(self._names)
        for i in range(len(self._names) - 1, -1, -1):
            kids = self._children[i]
            total[i] = 1 if not kids else sum(total[k] for k in kids)
        return total

    def _compute_states(self, selection: frozenset[str]) -> list[Qt.CheckState]:
        n = len(self._names)
        leaf_sel = [0] * n
        any_sel = [0] * n
        states: list[Qt.CheckState] = [_UNCHECKED] * n
        for i in range(n - 1, -1, -1):
            kids = self._children[i]
            own = 1 if self._names[i] in selection else 0
            if not kids:
                leaf_sel[i] = own
                any_sel[i] = own
                states[i] = _CHECKED if own else _UNCHECKED
                continue
            leaf_sel[i] = sum(leaf_sel[k] for k in kids)
            any_sel[i] = own + sum(any_sel[k] for k in kids)
            if leaf_sel[i] == self._leaf_total[i]:
                states[i] = _CHECKED
            elif any_sel[i]:
                states[i] = _PARTIAL
        return states

    def _on_model_selection_changed(self, selection: frozenset[str]) -> None:
        if not self._names:
            return
        old = self._state
        old_sel = self._last_selection
        self._state = self._compute_states(selection)
        self._last_selection = selection
        # Containers whose own output was (de)selected change their badges too.
        toggled = {self._ids[n] for n in (old_sel ^ selection) if n in self._ids}
        changed = [i for i in range(len(self._names)) if old[i] != self._state[i] or i in toggled]
        self._emit_changed(changed, COL_NAME, COL_NAME)

    def _emit_changed(self, ids: list[int], first_col: int, last_col: int) -> None:
        by_parent: dict[int, list[int]] = {}
        for i in ids:
            by_parent.setdefault(self._parent[i], []).append(self._row[i])
        for parent, rows in by_parent.items():
            pid = parent if parent >= 0 else None
            top = self._index_for(pid, min(rows), first_col)
            bottom = self._index_for(pid, max(rows), last_col)
            self.dataChanged.emit(top, bottom)

    def _index_for(self, parent_id: int | None, row: int, col: int) -> QModelIndex:
        i = self._children[parent_id][row] if parent_id is not None else 0
        return self.createIndex(row, col, i)

    def _on_model_tree_measured(self, _tree: ModuleTree) -> None:
        # The same rows, new calls and shapes: no reset (the user's expansion stays).
        if self._names:
            self._emit_changed(list(range(len(self._names))), 0, len(COLUMNS) - 1)

    def _on_model_capture_changed(self, capture: Capture | None) -> None:
        summary = summarize(capture) if capture is not None else None
        self._norms = summary.grad_norms if summary is not None else {}
        self._flags = summary.flagged() if summary is not None else {}
        self._notes = dict(summary.notes) if summary is not None else {}
        self._not_called = frozenset(summary.not_called) if summary is not None else frozenset()
        self._onset = {}
        for kind in ("forward", "backward"):
            where = onset_location(capture.nonfinite_onset if capture is not None else None, kind)
            if where is not None:
                self._onset.setdefault(where[0], []).append(kind)
        finite = [v for v in self._norms.values() if v > 0 and math.isfinite(v)]
        self._bar = {}
        if finite:
            lo, hi = math.log10(min(finite)), math.log10(max(finite))
            span = hi - lo
            for name, v in self._norms.items():
                if v > 0 and math.isfinite(v):
                    self._bar[name] = 0.08 + 0.92 * ((math.log10(v) - lo) / span if span > 0 else 1.0)
                elif not math.isfinite(v):
                    self._bar[name] = 1.0
                else:
                    self._bar[name] = 0.0
        if self._names:
            self._emit_changed(list(range(len(self._names))), 0, len(COLUMNS) - 1)

    # -- lookups -------------------------------------------------------------------
    def index_of(self, name: str, column: int = 0) -> QModelIndex:
        i = self._ids.get(name)
        if i is None:
            return QModelIndex()
        return self.createIndex(self._row[i], column, i)

    @property
    def tree(self) -> ModuleTree | None:
        return self._tree

    def flag_of(self, name: str) -> str | None:
        return self._flags.get(name)

    def norm_of(self, name: str) -> float | None:
        """The gradient norm of a layer's output (last run), at full precision."""
        return self._norms.get(name)

    # -- QAbstractItemModel ------------------------------------------------------------
    def index(self, row: int, column: int, parent: AnyIndex = QModelIndex()) -> QModelIndex:
        if column < 0 or column >= len(COLUMNS) or row < 0:
            return QModelIndex()
        if not parent.isValid():
            if row == 0 and self._names:
                return self.createIndex(0, column, 0)
            return QModelIndex()
        if parent.column() != 0:
            return QModelIndex()
        kids = self._children[parent.internalId()]
        if row >= len(kids):
            return QModelIndex()
        return self.createIndex(row, column, kids[row])

    @overload
    def parent(self) -> QObject | None: ...
    @overload
    def parent(self, index: AnyIndex) -> QModelIndex: ...
    def parent(self, index: AnyIndex | None = None) -> QObject | QModelIndex | None:
        if index is None:
            return QObject.parent(self)
        if not index.isValid():
            return QModelIndex()
        p = self._parent[index.internalId()]
        if p < 0:
            return QModelIndex()
        return self.createIndex(self._row[p], 0, p)

    def rowCount(self, parent: AnyIndex = QModelIndex()) -> int:
        if not parent.isValid():
            return 1 if self._names else 0
        if parent.column() != 0:
            return 0
        return len(self._children[parent.internalId()])

    def hasChildren(self, parent: AnyIndex = QModelIndex()) -> bool:
        return self.rowCount(parent) > 0

    def columnCount(self, parent: AnyIndex = QModelIndex()) -> int:
        return len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and 0 <= section < len(COLUMNS):
            if role == Qt.ItemDataRole.DisplayRole:
                return COLUMNS[section]
            if role == Qt.ItemDataRole.ToolTipRole:
                return {
                    COL_NAME: "Tick the modules to capture",
                    COL_TYPE: "Module class",
                    COL_SHAPE: "Output shape of one sample (batch dimension left out)",
                    COL_GRAD: "L2 norm of the gradient at the module's output (last run), log-scaled bar",
                    COL_PARAMS: "Parameters, including submodules",
                    COL_CALLS: "Calls per forward; more than one means the module is reused",
                }[section]
        return None

    def flags(self, index: AnyIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        f = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        if index.column() == COL_NAME:
            f |= Qt.ItemFlag.ItemIsUserCheckable
        return f

    def data(self, index: AnyIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or self._tree is None:
            return None
        i = index.internalId()
        name = self._names[i]
        node = self._tree.nodes[name]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(node, col)
        if role == Qt.ItemDataRole.CheckStateRole and col == COL_NAME:
            return self._state[i]
        if role == NAME_ROLE:
            return name
        if role == TYPE_ROLE:
            return node.type
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(node)
        if role == Qt.ItemDataRole.ForegroundRole:
            if col == COL_TYPE or (col in (COL_PARAMS, COL_SHAPE) and not node.is_leaf):
                return QBrush(GREY)
            if col == COL_CALLS and node.reused:
                return QBrush(BLUE)
            if col == COL_NAME and name in self._flags:
                return QBrush(RED)
            return None
        if role == Qt.ItemDataRole.BackgroundRole and name in self._flags:
            return QBrush(FLAG_BACKGROUND)
        if role == Qt.ItemDataRole.FontRole and i == 0:
            f = QFont()
            f.setBold(True)
            return f
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (COL_PARAMS, COL_CALLS, COL_GRAD):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == BADGES_ROLE and col == COL_NAME:
            return self._badges(node)
        if role == BAR_ROLE and col == COL_GRAD:
            return self._bar.get(name)
        if role == FLAG_ROLE:
            return self._flags.get(name)
        if role == ONSET_ROLE:
            return list(self._onset.get(name, []))
        return None

    def _display(self, node: ModuleNode, col: int) -> str:
        if col == COL_NAME:
            if not node.name:
                m = self.session.model
                return m.name if m is not None else (node.type or "model")
            return node.short_name
        if col == COL_TYPE:
            return node.type
        if col == COL_PARAMS:
            return format_count(node.total_params) if node.total_params else ""
        if col == COL_SHAPE:
            shapes = node.output_shapes
            if not shapes:
                return ""
            text = format_shape(tuple(shapes[0])[1:])
            if len(set(shapes)) > 1:
                text += f" (+{len(set(shapes)) - 1})"
            return text
        if col == COL_CALLS:
            return "" if node.calls is None else str(node.calls)
        if col == COL_GRAD:
            v = self._norms.get(node.name)
            if v is None:
                return ""
            return "inf" if not math.isfinite(v) else f"{v:.2e}"
        return ""

    def _badges(self, node: ModuleNode) -> list[tuple[str, QColor]]:
        out: list[tuple[str, QColor]] = []
        if node.reused:
            out.append((f"×{node.calls}", BLUE))
        if node.inplace:
            out.append(("in-place", ORANGE))
        if node.name in self._not_called:
            out.append(("not called", GREY))
        if node.children and node.name in self.session.selection:
            out.append(("output", PURPLE))
        onset = self._onset.get(node.name)
        if onset:
            # Where NaN/Inf began comes first (it is the row to look at), and short: the name
            # column is narrow and a badge that does not fit is dropped. The tooltip says more.
            out.insert(0, ("⚠ onset" if "forward" in onset else "⚠ grad onset", ONSET))
        flag = self._flags.get(node.name)
        if flag:
            out.append((flag, RED))
        return out

    def _tooltip(self, node: ModuleNode) -> str:
        lines = [f"<b>{node.name or '(model)'}</b> &nbsp;<i>{node.type}</i>"]
        if node.total_params:
            lines.append(f"parameters: {node.total_params:,} ({node.own_params:,} own)"
                         + ("" if node.trainable is None else ", trainable" if node.trainable else ", frozen"))
        if node.calls is not None:
            lines.append(f"calls per forward: {node.calls}")
        cap = self.session.capture
        record = cap.layers.get(node.name) if cap is not None else None
        captured = [tuple(c.shape) for c in record.calls if c.shape] if record is not None else []
        if captured and record is not None:  # the batch that ran (the probe saw one sample)
            shapes = list(dict.fromkeys(captured))
            lines.append(f"output, the batch of the capture: {', '.join(format_shape(s) for s in shapes[:4])}"
                         + (" ..." if len(shapes) > 4 else "")
                         + (f" {record.calls[0].dtype}" if record.calls[0].dtype else ""))
        elif node.output_shapes:
            batch = self.session.batch
            many = f" (the batch holds {len(batch)})" if batch is not None and len(batch) > 1 else ""
            lines.append(f"output of one sample{many}: "
                         + ", ".join(format_shape(s) for s in node.output_shapes[:4])
                         + (" ..." if len(node.output_shapes) > 4 else "")
                         + (f" {node.output_dtype}" if node.output_dtype else ""))
        if node.inplace:
            lines.append("in place: modifies its input; gradexplorer records the value before later changes")
        if node.reused:
            lines.append(f"reused: each of its {node.calls} calls is recorded apart")
        if node.children and node.name in self.session.selection:
            lines.append("its own output is captured too")
        if node.name in self._norms:
            lines.append(f"gradient norm at output: {self._norms[node.name]:.4g}")
        if node.name in self._not_called:
            lines.append("<span style='color:#6b7280'>not called: it never ran during forward (its parent used its "
                         "weights directly), so it has no output nor output gradient; its parameters' gradients "
                         "are in the Statistics tab</span>")
        if node.name in self._flags:
            lines.append(f"<span style='color:#c0392b'>flag: {self._flags[node.name]}</span>")
        if node.name in self._notes:
            lines.append(f"<i>{_escape(self._notes[node.name])}</i>")
        for kind in self._onset.get(node.name, []):
            lines.append(f"<span style='color:#8e0000'><b>NaN/Inf began here</b> ({kind}: "
                         + ("its output went non-finite while its inputs were finite)" if kind == "forward"
                            else "the first gradient of backward that went non-finite)") + "</span>")
        return "<br>".join(lines)

    def setData(self, index: AnyIndex, value: Any, role: int = Qt.ItemDataRole.EditRole) -> bool:
        if not index.isValid() or role != Qt.ItemDataRole.CheckStateRole or index.column() != COL_NAME:
            return False
        state = value.value if hasattr(value, "value") else int(value)
        name = self._names[index.internalId()]
        checked = state == _CHECKED.value or (state == _PARTIAL.value)
        if name == "":
            if checked:
                self.session.select_all_leaves()
            else:
                self.session.select_none()
        else:
            self.session.set_checked(name, checked)
        return True


class ModuleFilterProxy(QSortFilterProxyModel):
    """Shows modules whose qualified name or type contains the filter text (any case),
    and the ancestors of every match."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.setRecursiveFilteringEnabled(True)
        self.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self._text = ""

    def set_text(self, text: str) -> None:
        if hasattr(self, "beginFilterChange"):  # Qt >= 6.9; invalidateFilter is deprecated
            self.beginFilterChange()
            self._text = text.strip().lower()
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)
        else:
            self._text = text.strip().lower()
            self.invalidateFilter()

    def filterAcceptsRow(self, source_row: int, source_parent: AnyIndex) -> bool:
        if not self._text:
            return True
        model = self.sourceModel()
        idx = model.index(source_row, 0, source_parent)
        name = (model.data(idx, NAME_ROLE) or "").lower()
        type_name = (model.data(idx, TYPE_ROLE) or "").lower()
        return self._text in name or self._text in type_name


class NameDelegate(QStyledItemDelegate):
    """Draws the module name with small coloured badges at the right (×3, in-place, flags)."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: AnyIndex) -> None:
        badges = index.data(BADGES_ROLE) or []
        if not badges:
            super().paint(painter, option, index)
            return
        font = QFont(option.font)
        font.setPointSizeF(max(font.pointSizeF() - 1.5, 7.0))
        fm = QFontMetrics(font)
        full = QRect(option.rect)
        # Keep room for the check box and a few characters of the name; drop the
        # badges that do not fit, from the last.
        room = full.width() - 80
        widths: list[int] = []
        for text, _ in badges:
            w = fm.horizontalAdvance(text) + 10
            if sum(widths) + 4 * len(widths) + w + 4 > room:
                break
            widths.append(w)
        badges = badges[: len(widths)]
        if not badges:
            super().paint(painter, option, index)
            return
        total = sum(widths) + 4 * len(widths) + 2
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.rect = QRect(full.left(), full.top(), full.width() - total, full.height())
        widget = option.widget
        style = widget.style() if widget is not None else QApplication.style()
        # Background across the whole cell first, then the item in the narrowed rect.
        bg = QStyleOptionViewItem(option)
        self.initStyleOption(bg, index)
        bg.text = ""
        bg.features &= ~QStyleOptionViewItem.ViewItemFeature.HasCheckIndicator
        bg.icon = type(bg.icon)()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, bg, painter, widget)
        opt.backgroundBrush = QBrush()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, widget)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setFont(font)
        x = opt.rect.right() + 4
        h = min(fm.height() + 2, full.height() - 4)
        y = full.top() + (full.height() - h) // 2
        for (text, color), w in zip(badges, widths):
            rect = QRect(x, y, w, h)
            fill = QColor(color)
            fill.setAlpha(34)
            painter.setPen(QColor(color))
            painter.setBrush(fill)
            painter.drawRoundedRect(rect, h / 2, h / 2)
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, text)
            x += w + 4
        painter.restore()


class BarDelegate(QStyledItemDelegate):
    """The gradient norm as a number over a small log-scaled bar."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: AnyIndex) -> None:
        fraction = index.data(BAR_ROLE)
        if fraction is None:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        text = opt.text
        opt.text = ""
        widget = option.widget
        style = widget.style() if widget is not None else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, widget)
        painter.save()
        # A spreadsheet-style data bar behind the number: length is the log-scaled norm.
        r = option.rect.adjusted(2, 2, -2, -2)
        flagged = index.data(FLAG_ROLE)
        color = QColor(RED if flagged else QColor("#3b82c4"))
        color.setAlpha(70)
        width = int(r.width() * float(fraction))
        if fraction > 0:
            width = max(width, 2)
        painter.fillRect(QRect(r.left(), r.top(), width, r.height()), color)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        role = QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        painter.setPen(option.palette.color(role))
        painter.drawText(r.adjusted(0, 0, -2, 0), Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, text)
        painter.restore()


class ModuleTreeView(QTreeView):
    """The tree itself: a filter proxy over :class:`ModuleTreeModel`, delegates, a context
    menu, and ``layer_activated(name)`` when the current row changes."""

    layer_activated = Signal(str)

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.tree_model = ModuleTreeModel(session, self)
        self.proxy = ModuleFilterProxy(self)
        self.proxy.setSourceModel(self.tree_model)
        self.setModel(self.proxy)
        self.setUniformRowHeights(True)
        self.setAlternatingRowColors(True)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        # A cut name keeps its distinguishing tail: two dozen "encoder_l…" rows had looked
        # alike where "enco…layer_11" tells them apart.
        self.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.customContextMenuRequested.connect(self._on_context_menu)
        self.setItemDelegateForColumn(COL_NAME, NameDelegate(self))
        self.setItemDelegateForColumn(COL_GRAD, BarDelegate(self))
        header = self.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(COL_NAME, QHeaderView.ResizeMode.Interactive)
        for col, width in ((COL_NAME, self.NAME_WIDTH), (COL_TYPE, 96), (COL_SHAPE, 84), (COL_GRAD, 88),
                           (COL_PARAMS, 52), (COL_CALLS, 40)):
            header.resizeSection(col, width)
        # Grad norm beside the names: in the panel's width on a 1280 px screen it would be
        # the column scrolled out of sight, and it is the one this tool is for.
        header.moveSection(header.visualIndex(COL_GRAD), 1)
        self._name_width_by_user: int | None = None
        header.sectionResized.connect(self._on_section_resized)
        self.selectionModel().currentRowChanged.connect(self._on_current_changed)
        self.tree_model.modelReset.connect(self._on_reset)


    # -- the Module column takes the room there is --------------------------------------
    #: The Module column's width when the tree is narrow (it scrolls sideways then).
    NAME_WIDTH = 184

    def _fit_name_column(self) -> None:
        """Give the Module column whatever the other columns leave of the viewport (deep
        names need it), never less than ``NAME_WIDTH`` nor less than the user dragged."""
        header = self.header()
        others = sum(header.sectionSize(c) for c in range(header.count()) if c != COL_NAME and
                     not header.isSectionHidden(c))
        width = max(self._name_width_by_user or self.NAME_WIDTH, self.viewport().width() - others)
        if width != header.sectionSize(COL_NAME):
            self._fitting_name = True
            try:
                header.resizeSection(COL_NAME, width)
            finally:
                self._fitting_name = False

    def _on_section_resized(self, index: int, _old: int, new: int) -> None:
        if index == COL_NAME and not getattr(self, "_fitting_name", False):
            self._name_width_by_user = new  # the user's drag wins over the fit
        elif index != COL_NAME:
            self._fit_name_column()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_name_column()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._fit_type_column()  # the class names' widths in the new font

    def _fit_type_column(self) -> None:
        """The Type column as wide as its widest class name (the root's in bold), so that no
        name is cut ("Sequent", "BatchNo"); the Module column takes what is left."""
        model: ModuleTreeModel | None = getattr(self, "tree_model", None)  # None while Qt builds the view
        if model is None:
            return
        root, others = model.type_names()
        bold = QFont(self.font())
        bold.setBold(True)
        texts = [QFontMetrics(bold).horizontalAdvance(root)] + [self.fontMetrics().horizontalAdvance(t)
                                                                 for t in others]
        # The margins a cell keeps either side of its text (QCommonStyle's item text rect).
        margin = self.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, self) + 1
        header = self.header()
        width = max(max(texts) + 2 * margin + 4, header.sectionSizeHint(COL_TYPE))
        if width != header.sectionSize(COL_TYPE):
            header.resizeSection(COL_TYPE, width)

    # -- tree changes ---------------------------------------------------------------
    def _on_reset(self) -> None:
        self._fit_type_column()
        root = self.proxy.index(0, 0)
        if root.isValid():
            self.expand(root)
            # Expand one more level when it is small, so the first look shows structure.
            if self.proxy.rowCount(root) <= 12:
                for r in range(self.proxy.rowCount(root)):
                    child = self.proxy.index(r, 0, root)
                    if self.proxy.rowCount(child) <= 12:
                        self.expand(child)

    def set_filter(self, text: str) -> None:
        current = self.current_name()
        # Filtering rows out of a widely expanded tree costs the view O(n) per removed row;
        # collapsed first, a 1400-module tree filters in milliseconds instead of seconds.
        self.collapseAll()
        self.proxy.set_text(text)
        if text.strip():
            self.expandAll()
        else:
            self._on_reset()
        if current:
            src = self.tree_model.index_of(current)
            idx = self.proxy.mapFromSource(src)
            if idx.isValid():
                parent = idx.parent()
                while parent.isValid():
                    self.expand(parent)
                    parent = parent.parent()
                self.scrollTo(idx, QAbstractItemView.ScrollHint.EnsureVisible)

    # -- current layer ----------------------------------------------------------------
    def current_name(self) -> str | None:
        idx = self.currentIndex()
        return idx.data(NAME_ROLE) if idx.isValid() else None

    def select_layer(self, name: str) -> bool:
        """Make ``name`` the current row (expanding and scrolling to it)."""
        src = self.tree_model.index_of(name)
        if not src.isValid():
            return False
        idx = self.proxy.mapFromSource(src)
        if not idx.isValid():  # hidden by the filter: clear it
            self.set_filter("")
            idx = self.proxy.mapFromSource(src)
        parent = idx.parent()
        while parent.isValid():
            self.expand(parent)
            parent = parent.parent()
        self.selectionModel().setCurrentIndex(
            idx, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)
        self.scrollTo(idx, QAbstractItemView.ScrollHint.EnsureVisible)
        return True

    def _on_current_changed(self, current: QModelIndex, previous: QModelIndex) -> None:
        name = current.data(NAME_ROLE) if current.isValid() else None
        if name is not None:  # the model's own row is "": it has a record too (its parameters)
            self.layer_activated.emit(name)

    # -- context menu -------------------------------------------------------------------
    def build_menu(self, name: str | None) -> QMenu:
        menu = QMenu(self)
        s = self.session
        tree = s.tree
        if name and tree is not None and name in tree:
            node = tree[name]
            menu.addAction(f"Check all {node.type}", lambda: s.select_type(node.type, True))
            menu.addAction(f"Uncheck all {node.type}", lambda: s.select_type(node.type, False))
            if node.children:
                menu.addSeparator()
                menu.addAction("Check children (their own outputs)", lambda: s.select_children(name))
                menu.addAction("Check everything below", lambda: s.set_checked(name, True))
                own = QAction("Capture this module's own output", menu)
                own.setCheckable(True)
                own.setChecked(name in s.selection)
                own.toggled.connect(lambda on: s.select([name], on))
                menu.addAction(own)
            menu.addSeparator()
            copy = menu.addAction("Copy name", lambda: QGuiApplication.clipboard().setText(name))
            copy.setShortcut(QKeySequence(QKeySequence.StandardKey.Copy))
            norm = self.tree_model.norm_of(name)
            if norm is not None:
                menu.addAction(f"Copy gradient norm ({norm:.6g})",
                               lambda: QGuiApplication.clipboard().setText(full_value(norm)))
            menu.addSeparator()
        menu.addAction("Check all leaves", s.select_all_leaves)
        menu.addAction("Check none", s.select_none)
        menu.addSeparator()
        menu.addAction("Expand all", self.expandAll)
        menu.addAction("Collapse all", self.collapse_to_top)
        return menu

    def keyPressEvent(self, event: QKeyEvent) -> None:
        # Ctrl+C: the current row's qualified name (Qt's own copies the cell's text, the
        # name's last part only).
        if event.matches(QKeySequence.StandardKey.Copy):
            name = self.current_name()
            if name is not None:
                QGuiApplication.clipboard().setText(name)
            event.accept()
            return
        super().keyPressEvent(event)

    def collapse_to_top(self) -> None:
        """Collapse every row but the model's own."""
        self.collapseAll()
        root = self.proxy.index(0, 0)
        if root.isValid():
            self.expand(root)

    def _on_context_menu(self, pos: QPoint) -> None:
        idx = self.indexAt(pos)
        name = idx.data(NAME_ROLE) if idx.isValid() else None
        self.build_menu(name).exec(self.viewport().mapToGlobal(pos))


class ModuleTreePanel(QWidget):
    """Filter box, quick selection buttons, the tree and a one-line summary."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.view = ModuleTreeView(session, self)
        self.filter_edit = QLineEdit(self)
        self.filter_edit.setPlaceholderText("Filter modules by name or type…")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(self.view.set_filter)

        def button(text: str, tip: str, slot: Callable[[], object]) -> QToolButton:
            b = QToolButton(self)
            b.setText(text)
            b.setToolTip(tip)
            b.setAutoRaise(False)
            b.clicked.connect(slot)
            return b

        self.leaves_button = button("All leaves", "Check every leaf module (the default)", session.select_all_leaves)
        self.none_button = button("None", "Uncheck everything", session.select_none)
        self.type_button = QToolButton(self)
        self.type_button.setText("By type")
        self.type_button.setToolTip("Check or uncheck every module of one type")
        self.type_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.type_menu = QMenu(self.type_button)
        self.type_menu.aboutToShow.connect(self._fill_type_menu)
        self.type_button.setMenu(self.type_menu)
        self.children_button = button("Children", "Check the children of the current row", self._check_children)

        self.summary = QLabel(self)
        self.summary.setObjectName("treeSummary")
        self.summary.setWordWrap(True)

        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.setSpacing(4)
        for b in (self.leaves_button, self.none_button, self.type_button, self.children_button):
            top.addWidget(b)
        top.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.filter_edit)
        layout.addLayout(top)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.summary)
        listen(session.selection_changed, self._update_summary)
        listen(session.tree_changed, lambda _t: self._update_summary())
        listen(session.capture_changed, lambda _c: self._update_summary())
        self._update_summary()

    def _update_summary(self, *_args: object) -> None:
        tree = self.session.tree
        if tree is None:
            self.summary.setText("No model")
            return
        n = len(self.session.selection)
        leaves = len(tree.leaves())
        params = tree.root.total_params if "" in tree.nodes else 0
        if self.session.model is None and self.session.capture is not None:
            # A capture without its model knows only the parameters it holds a gradient of.
            words = (f"{format_count(params)} parameters with a gradient in the capture" if params
                     else "parameters not known (a capture without its model)")
        else:
            words = f"{format_count(params)} parameters"
        self.summary.setText(f"{n} of {len(tree) - 1} modules checked ({leaves} leaves) · {words}")

    def _fill_type_menu(self) -> None:
        self.type_menu.clear()
        tree = self.session.tree
        if tree is None:
            return
        counts: dict[str, int] = {}
        for node in tree:
            if node.name:
                counts[node.type] = counts.get(node.type, 0) + 1
        for type_name in sorted(counts, key=lambda t: (-counts[t], t))[:40]:
            self._add_type_actions(self.type_menu.addMenu(f"{type_name}  ({counts[type_name]})"), type_name, tree)

    def _add_type_actions(self, menu: QMenu, type_name: str, tree: ModuleTree) -> None:
        menu.addAction("Check all", lambda: self.session.select_type(type_name, True))
        menu.addAction("Uncheck all", lambda: self.session.select_type(type_name, False))
        menu.addAction("Only these", lambda: self.session.set_selection(tree.of_type(type_name)))

    def _check_children(self) -> None:
        name = self.view.current_name()
        if name is not None:
            self.session.select_children(name)

    def sizeHint(self) -> QSize:
        return QSize(420, 600)
