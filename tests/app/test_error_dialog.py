"""The error dialog: Enter and Esc close it, and its details never repeat torch's advice to
load a refused pickle with weights_only=False."""

from __future__ import annotations

import torch
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from gradexplorer.base.errors import GradExplorerError


def _refused_pickle(tmp_path) -> BaseException:
    """The error torch raises on a whole pickled module read with weights_only=True."""
    path = tmp_path / "whole.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    try:
        torch.load(path)
    except Exception as exc:  # noqa: BLE001 - the very error torch raises
        return exc
    raise AssertionError("torch.load accepted a pickled module")


def test_enter_closes_an_error_dialog_with_details(qtbot):
    from gradexplorer_app.window import error_dialog

    try:
        raise ValueError("boom")
    except ValueError as exc:
        box = error_dialog.show_error(None, "Test", exc)  # a bug: details under "Show Details..."
    qtbot.addWidget(box)
    assert box.detailedText()
    assert box.defaultButton() is box.button(QMessageBox.StandardButton.Close)
    with qtbot.waitSignal(box.finished, timeout=5000):
        qtbot.keyClick(box, Qt.Key.Key_Return)
    assert not box.isVisible()


def test_enter_closes_a_box_that_offers_next_steps_without_taking_one(qtbot):
    from gradexplorer_app.window import error_dialog

    taken = []
    box = error_dialog.show_error(None, "Weights", GradExplorerError("Not here.", "Choose."),
                                  actions=[("Use random weights", lambda: taken.append(1))])
    qtbot.addWidget(box)
    with qtbot.waitSignal(box.finished, timeout=5000):
        qtbot.keyClick(box, Qt.Key.Key_Return)
    assert taken == []


def test_the_details_of_a_refused_pickle_hold_what_torch_refused_not_its_advice(tmp_path):
    from gradexplorer_app.window import error_dialog

    cause = _refused_pickle(tmp_path)
    assert "will likely succeed" in str(cause)  # torch's own text says it
    try:
        raise GradExplorerError("The file holds a whole pickled model.", "Tick trust.") from cause
    except GradExplorerError as exc:
        _, _, details = error_dialog.describe(exc)
    assert "torch.nn.modules.linear.Linear" in details  # what was refused
    assert "weights_only=False" not in details and "set to `False`" not in details
    assert "will likely succeed" not in details and "\x1b[" not in details
