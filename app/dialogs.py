"""The file pickers and questions gradexplorer asks, in one replaceable place.

Every modal question goes through a function here, looked up on the module at call
time (``dialogs.ask_open_files(...)``), so tests replace them with ``monkeypatch`` and
never block on a real dialog. A question with a dialog of its own (Run over folder…)
builds it where it lives and shows it with :func:`run_modal`. The window and the views
both ask through this module, which imports no other part of the app.
"""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QFileDialog, QInputDialog, QMessageBox, QWidget

IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.bmp *.webp *.tif *.tiff *.gif);;All files (*)"
TENSOR_FILTER = "Tensor files (*.pt *.pth);;All files (*)"
CAPTURE_FILTER = "gradexplorer captures (*.pt);;All files (*)"
CHECKPOINT_FILTER = "Checkpoints (*.pt *.pth *.pt2 *.ckpt *.bin);;All files (*)"
WEIGHTS_FILTER = "State dicts (*.pth *.pt *.bin);;All files (*)"


def ask_open_files(parent: QWidget | None, caption: str, filter_: str) -> list[str]:
    files, _ = QFileDialog.getOpenFileNames(parent, caption, "", filter_)
    return list(files)


def ask_open_file(parent: QWidget | None, caption: str, filter_: str) -> str | None:
    path, _ = QFileDialog.getOpenFileName(parent, caption, "", filter_)
    return path or None


def ask_folder(parent: QWidget | None, caption: str) -> str | None:
    return QFileDialog.getExistingDirectory(parent, caption) or None


def ask_save_file(parent: QWidget | None, caption: str, suggested: str, filter_: str) -> str | None:
    path, _ = QFileDialog.getSaveFileName(parent, caption, suggested, filter_)
    return path or None


def ask_text(parent: QWidget | None, title: str, label: str, text: str = "") -> str | None:
    value, ok = QInputDialog.getText(parent, title, label, text=text)
    return value.strip() if ok and value.strip() else None


def ask_item(parent: QWidget | None, title: str, label: str, items: list[str],
             editable: bool = True) -> str | None:
    value, ok = QInputDialog.getItem(parent, title, label, items, 0, editable)
    return value.strip() if ok else None


def run_modal(dialog: QDialog) -> bool:
    """Show ``dialog`` modally; whether the user accepted it."""
    return dialog.exec() == QDialog.DialogCode.Accepted


def confirm_trust(parent: QWidget | None, what: str, why: str) -> bool:
    """Ask before running code from a file or factory. Defaults to No."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle("gradexplorer: run code?")
    box.setText(f"<b>Loading {what} runs Python code.</b>")
    box.setInformativeText(
        f"{why}\n\nOnly continue if you trust where it came from: the code can do anything "
        "your user account can.")
    box.setStandardButtons(QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No)
    box.setDefaultButton(QMessageBox.StandardButton.No)
    box.button(QMessageBox.StandardButton.Yes).setText("Trust and load")
    return box.exec() == QMessageBox.StandardButton.Yes


def confirm_close_during_run(parent: QWidget | None, what: str = "A run") -> bool:
    """Ask before closing a window while work is in flight. Defaults to No."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Question)
    box.setWindowTitle("gradexplorer: close?")
    box.setText(f"<b>{what} is in progress: cancel it and close?</b>")
    box.setInformativeText("What it has captured so far is not kept.")
    box.setStandardButtons(QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No)
    box.setDefaultButton(QMessageBox.StandardButton.No)
    box.button(QMessageBox.StandardButton.Yes).setText("Cancel the run and close")
    box.button(QMessageBox.StandardButton.No).setText("Keep running")
    return box.exec() == QMessageBox.StandardButton.Yes
