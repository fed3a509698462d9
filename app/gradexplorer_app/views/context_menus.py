"""Copying and the right-click menus of the views' tables and plots.

A table's Ctrl+C copies the selected cells at full precision (each number as Python writes
it back, ``repr``: a cell that shows ``0.0039308`` copies ``0.003930818196386099``), tab
separated for a spreadsheet; its menu copies the selection or the whole table. A plot's
menu copies its picture (at twice the screen's resolution, with the export's title line)
or exports it.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication, QImage, QKeySequence, QShortcut
from PySide6.QtWidgets import QMenu, QTableWidget, QWidget

from gradexplorer_app.views.export import plot_png

#: The item data role that holds a cell's value at full precision (text), when it shows it rounded.
FULL_VALUE_ROLE = Qt.ItemDataRole.UserRole + 40


def full_value(value: float | int) -> str:
    """A number as it copies: every digit (``repr``), whole numbers as integers."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 2**53):
        return str(int(value))
    return repr(float(value))


def _cell_text(table: QTableWidget, row: int, column: int) -> str:
    item = table.item(row, column)
    if item is None:
        return ""
    full = item.data(FULL_VALUE_ROLE)
    return str(full) if full is not None else item.text()


def table_text(table: QTableWidget, selected_only: bool = True) -> str:
    """The table's cells (the selected ones, or all with their headers) as tab-separated
    lines, at full precision."""
    if selected_only:
        cells = sorted((i.row(), i.column()) for i in table.selectedIndexes())
        if not cells:
            return ""
        rows = sorted({r for r, _ in cells})
        columns = sorted({c for _, c in cells})
        chosen = set(cells)
        return "\n".join("\t".join(_cell_text(table, r, c) if (r, c) in chosen else "" for c in columns)
                         for r in rows)
    header = [""] + [item.text() if (item := table.horizontalHeaderItem(c)) is not None else str(c)
                     for c in range(table.columnCount())]
    lines = ["\t".join(header)]
    for r in range(table.rowCount()):
        label = table.verticalHeaderItem(r)
        lines.append("\t".join([label.text() if label is not None else str(r)]
                               + [_cell_text(table, r, c) for c in range(table.columnCount())]))
    return "\n".join(lines)


def install_table_copy(table: QTableWidget) -> None:
    """Ctrl+C on ``table`` copies its selection at full precision; right-click offers it,
    and the whole table."""
    shortcut = QShortcut(QKeySequence(QKeySequence.StandardKey.Copy), table)
    shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
    shortcut.activated.connect(lambda: QGuiApplication.clipboard().setText(table_text(table)))
    table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)

    def menu(pos: QPoint) -> None:
        table_menu(table).exec(table.viewport().mapToGlobal(pos))

    table.customContextMenuRequested.connect(menu)


def table_menu(table: QTableWidget) -> QMenu:
    """The right-click menu of a table: copy the selection, copy everything."""
    menu = QMenu(table)
    copy = menu.addAction("Copy (full precision)", lambda: QGuiApplication.clipboard().setText(table_text(table)))
    copy.setShortcut(QKeySequence(QKeySequence.StandardKey.Copy))
    copy.setEnabled(bool(table.selectedIndexes()))
    menu.addAction("Copy the whole table", lambda: QGuiApplication.clipboard().setText(table_text(table, False)))
    return menu


def install_plot_menu(widget: QWidget, title: Callable[[], str], export: Callable[[], object]) -> None:
    """Right-click on a plot: copy its picture (twice the screen's resolution, under the
    ``title()`` line) or ``export()`` it (ask where, PNG or SVG)."""
    widget.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)

    def menu(pos: QPoint) -> None:
        plot_menu(widget, title, export).exec(widget.mapToGlobal(pos))

    widget.customContextMenuRequested.connect(menu)


def plot_menu(widget: QWidget, title: Callable[[], str], export: Callable[[], object]) -> QMenu:
    """The right-click menu of a plot (see :func:`install_plot_menu`)."""
    menu = QMenu(widget)
    menu.addAction("Copy image", lambda: QGuiApplication.clipboard().setImage(
        QImage.fromData(plot_png(widget, title()))))
    menu.addAction("Export plot (PNG, SVG)…", export)
    return menu
