"""The file pickers and questions gradexplorer asks, in one replaceable place.

Every modal question goes through a function here, looked up on the module at call
time (``dialogs.ask_open_files(...)``), so tests replace them with ``monkeypatch`` and
never block on a real dialog. A question with a dialog of its own (Run over folder…)
builds it where it lives and shows it with :func:`run_modal`. The window and the views
both ask through this module, which imports no other part of the app.
"""

from __future__ import annotations

import ast
from pathlib import Path

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.bmp *.webp *.tif *.tiff *.gif);;All files (*)"
TENSOR_FILTER = "Tensor files (*.pt *.pth);;All files (*)"
CAPTURE_FILTER = "gradexplorer captures (*.pt);;All files (*)"
CHECKPOINT_FILTER = "Checkpoints (*.pt *.pth *.pt2 *.ckpt *.bin);;All files (*)"
WEIGHTS_FILTER = "State dicts (*.pth *.pt *.bin);;All files (*)"
PYTHON_FILTER = "Python files (*.py);;All files (*)"


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


#: The widest a question's text runs before it wraps, in average characters.
QUESTION_CHARS = 64


def wrap_question(dialog: QDialog) -> QDialog:
    """Wrap the labels of a question (a long message had made an input dialog 1,459 px
    wide, its OK button off a 1280 px screen) and keep it inside its screen."""
    width = QUESTION_CHARS * dialog.fontMetrics().averageCharWidth()
    screen = (dialog.parentWidget() or dialog).screen() or QGuiApplication.primaryScreen()
    if screen is not None:
        width = min(width, screen.availableGeometry().width() - 80)
    for label in dialog.findChildren(QLabel):
        label.setWordWrap(True)
        label.setMinimumWidth(min(width, max(label.minimumSizeHint().width(), 1)))
        label.setMaximumWidth(width)
    return dialog


def input_dialog(parent: QWidget | None, title: str, label: str) -> QInputDialog:
    """A ``QInputDialog`` whose label wraps (``wrap_question``)."""
    dialog = QInputDialog(parent)
    dialog.setWindowTitle(title)
    dialog.setLabelText(label)
    return dialog


def ask_text(parent: QWidget | None, title: str, label: str, text: str = "") -> str | None:
    dialog = input_dialog(parent, title, label)
    dialog.setTextValue(text)
    wrap_question(dialog)
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return None
    value = dialog.textValue().strip()
    return value or None


def ask_item(parent: QWidget | None, title: str, label: str, items: list[str],
             editable: bool = True) -> str | None:
    dialog = input_dialog(parent, title, label)
    dialog.setComboBoxItems(items)
    dialog.setComboBoxEditable(editable)
    if items:
        dialog.setTextValue(items[0])
    wrap_question(dialog)
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return None
    return dialog.textValue().strip()


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


def factory_functions(path: str) -> list[str]:
    """The top-level functions of a Python file, read without running it (for Browse…)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")]


class FactoryDialog(QDialog):
    """Python factory: ``package.module:function`` typed, or a file picked with Browse…
    (its first public function filled in after the colon, for the user to check)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Python factory")
        self.edit = QLineEdit(self)
        self.edit.setPlaceholderText("package.module:function or path/to/file.py:function")
        self.edit.setMinimumWidth(420)
        self.browse_button = QPushButton("Browse…", self)
        self.browse_button.clicked.connect(self.browse)
        row = QHBoxLayout()
        row.addWidget(self.edit, 1)
        row.addWidget(self.browse_button)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("The function that builds the model (it is called with no arguments):", self))
        layout.addLayout(row)
        layout.addWidget(buttons)

    def browse(self) -> None:
        path = ask_open_file(self, "Choose the Python file of the factory", PYTHON_FILTER)
        if not path:
            return
        functions = factory_functions(path)
        self.edit.setText(f"{path}:{functions[0] if functions else ''}")
        if functions:  # the function part selected: typing replaces it
            self.edit.setSelection(len(path) + 1, len(functions[0]))
        self.edit.setFocus()

    def text(self) -> str:
        return self.edit.text().strip()


def ask_factory(parent: QWidget | None) -> str | None:
    """Ask for a factory (``module:function`` or ``file.py:function``), with Browse…."""
    dialog = FactoryDialog(parent)
    if not run_modal(dialog):
        return None
    return dialog.text() or None


def confirm_skip_unreadable(parent: QWidget | None, names: list[str], readable: int, why: str) -> bool:
    """Some pictures cannot be read: go on with the others? Defaults to Yes."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Question)
    box.setWindowTitle("gradexplorer: pictures that cannot be read")
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    box.setText(f"<b>{shown} cannot be read. Go on without {'it' if len(names) == 1 else 'them'}?</b>")
    box.setInformativeText(f"The batch would hold the other {readable} picture{'s' if readable != 1 else ''}.")
    box.setDetailedText(why)
    box.setStandardButtons(QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(QMessageBox.StandardButton.Yes)
    box.button(QMessageBox.StandardButton.Yes).setText("Go on without it" if len(names) == 1 else "Go on without them")
    return box.exec() == QMessageBox.StandardButton.Yes
