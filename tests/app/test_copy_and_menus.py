"""Ctrl+C copies values at full precision, and the tree, the tables and the plots have a
right-click menu."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from gradexplorer_app import dialogs


@pytest.mark.slow
def test_ctrl_c_in_the_statistics_copies_every_digit(qtbot, demo):
    demo.show()
    views = demo.views
    views.set_layer("features.5.conv1")
    views.show_view("Statistics")
    table = views.stats_view.table
    qtbot.wait(20)
    stats = demo.session.capture["features.5.conv1"].calls[0].stats["grad_output"]
    column = 1  # the output gradient
    row = [table.verticalHeaderItem(r).text() for r in range(table.rowCount())].index("mean")
    assert table.item(row, column).text() == f"{float(stats['mean']):.5g}"  # shown rounded
    table.setCurrentCell(row, column)
    table.setFocus()
    QGuiApplication.clipboard().clear()
    qtbot.keyClick(table, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert float(QGuiApplication.clipboard().text()) == float(stats["mean"])  # every digit
    assert QGuiApplication.clipboard().text() == repr(float(stats["mean"]))
    from gradexplorer_app.views.context_menus import table_menu

    texts = [a.text() for a in table_menu(table).actions()]
    assert texts == ["Copy (full precision)", "Copy the whole table"]
    table_menu(table).actions()[1].trigger()
    whole = QGuiApplication.clipboard().text().splitlines()
    assert whole[0].split("\t")[1:] == [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    assert len(whole) == table.rowCount() + 1


def test_the_tree_copies_the_qualified_name_and_the_norm(qtbot, demo):
    demo.show()
    tree = demo.tree_view
    tree.select_layer("features.5.conv1")
    tree.setFocus()
    QGuiApplication.clipboard().clear()
    qtbot.keyClick(tree, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert QGuiApplication.clipboard().text() == "features.5.conv1"  # the row shows "conv1"
    menu = tree.build_menu("features.5.conv1")
    copy_norm = next(a for a in menu.actions() if a.text().startswith("Copy gradient norm"))
    copy_norm.trigger()
    norm = tree.tree_model.norm_of("features.5.conv1")
    assert QGuiApplication.clipboard().text() == repr(norm)


@pytest.mark.slow
def test_a_plot_has_a_menu_to_copy_its_picture_or_export_it(qtbot, demo, tmp_path, monkeypatch):
    from gradexplorer_app.views.context_menus import plot_menu

    demo.show()
    views = demo.views
    views.show_view("Heatmap")
    widget = views.heatmap_view.export_widget()
    assert widget.contextMenuPolicy() == Qt.ContextMenuPolicy.CustomContextMenu
    menu = plot_menu(widget, views.export_title, lambda: views.ask_export())
    copy, export = menu.actions()
    QGuiApplication.clipboard().clear()
    copy.trigger()
    image = QGuiApplication.clipboard().image()
    assert image.width() == 2 * widget.width()  # the export's picture, title line and all
    monkeypatch.setattr(dialogs, "ask_save_file", lambda parent, caption, suggested, filter_:
                        str(tmp_path / suggested))
    export.trigger()
    assert (tmp_path / views.export_file_name()).stat().st_size > 0
    flow = views.flow_view.export_widget()
    assert flow.contextMenuPolicy() == Qt.ContextMenuPolicy.CustomContextMenu
    QApplication.processEvents()
