"""Choosing a model: torchvision models by task and timm models (when timm is installed),
with their weights and cache state, the demos, recent models, a checkpoint file or a Python factory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QShowEvent
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gradexplorer import models  # lazy: models.loading (torchvision) on first use
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import format_bytes
from gradexplorer.models.files import checkpoint_kind
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.models.tokenizer import takes_a_tokenizer
from gradexplorer.pipeline.session import Session
from gradexplorer_app import dialogs
from gradexplorer_app.listeners import listen
from gradexplorer_app.window import error_dialog
from gradexplorer_app.window.module_tree_view import format_count
from gradexplorer_app.window.settings import AppSettings

if TYPE_CHECKING:  # annotations only: torchvision, which weights.py imports, is not needed to start
    from gradexplorer.models.weights import ModelInfo

TASK_TITLES = {
    "classification": "Classification",
    "segmentation": "Segmentation",
    "video": "Video",
    "detection": "Detection (not supported yet)",
    "optical_flow": "Optical flow",
    "quantized": "Quantized",
    "hugging_face": "Hugging Face (transformers)",
    "timm": "timm models (weights from the Hugging Face cache)",
}
SPEC_ROLE = Qt.ItemDataRole.UserRole + 1
TITLE_ROLE = Qt.ItemDataRole.UserRole + 2  # a group's title, without its count
COUNTED_ROLE = Qt.ItemDataRole.UserRole + 3  # whether a group shows how many models it holds
NO_WEIGHTS = "__none__"
LOCAL_FILE = "__file__"


@dataclass
class ModelRequest:
    """What to load: the arguments of ``gradexplorer.models.load_model``."""

    spec: str
    weights: str | None = None
    arch: str | None = None
    trust: bool = False
    hf_class: str | None = None
    #: A tokenizer for a model that came without one (``--tokenizer``: a folder, ``hf:ORG/NAME``).
    tokenizer: str | None = None


class ModelPanel(QWidget):
    """Emits ``load_requested(ModelRequest)``; the main window loads it in a worker and
    reports back through :meth:`set_busy` and :meth:`set_progress`."""

    load_requested = Signal(object)
    cancel_requested = Signal()
    #: The panel was shown for the first time: its model list is wanted now.
    first_shown = Signal()

    def __init__(self, session: Session, settings: AppSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.settings = settings
        self._catalog: dict[str, ModelInfo] = {}
        self._shown = False
        self._local_weights: str | None = None

        self.current_label = QLabel(self)
        self.current_label.setWordWrap(True)
        self.current_label.setObjectName("currentModel")
        self.search = QLineEdit(self)
        self.search.setPlaceholderText("Search models…")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._apply_search)
        self.list = QTreeWidget(self)
        self.list.setHeaderLabels(["Model", "Weights"])
        self.list.setRootIsDecorated(True)
        self.list.setUniformRowHeights(True)
        self.list.setColumnWidth(0, 165)
        self.list.currentItemChanged.connect(self._on_current_changed)
        self.list.itemDoubleClicked.connect(lambda *_: self._on_load_clicked())
        self.weights_combo = QComboBox(self)
        self.weights_combo.setToolTip("Pretrained weights; 'cached' ones load offline")
        self.weights_combo.activated.connect(self._on_weights_activated)
        self.load_button = QPushButton("Load", self)
        self.load_button.setObjectName("primaryButton")
        self.load_button.clicked.connect(self._on_load_clicked)
        self.checkpoint_button = QPushButton("Checkpoint…", self)
        self.checkpoint_button.setToolTip("A state dict (with its architecture), a pickled module or a .pt2 export")
        self.checkpoint_button.clicked.connect(self._on_checkpoint)
        self.factory_button = QPushButton("Factory…", self)
        self.factory_button.setToolTip("A Python function that returns the model: package.module:fn or file.py:fn")
        self.factory_button.clicked.connect(self._on_factory)
        self.progress = QProgressBar(self)
        self.progress.setVisible(False)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setVisible(False)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.hint = QLabel(self)
        self.hint.setObjectName("hint")
        self.hint.setWordWrap(True)
        # A factory or checkpoint comes without a tokenizer: the loaded model's row for one
        # (``--tokenizer`` on the command line), so that it can be given text.
        self.tokenizer_label = QLabel(self)
        self.tokenizer_label.setWordWrap(True)
        self.tokenizer_button = QPushButton("Tokenizer…", self)
        self.tokenizer_button.setToolTip("A Hugging Face tokenizer for this model's text: the folder that "
                                         "tokenizer.save_pretrained wrote. The model is loaded again with it.")
        self.tokenizer_button.clicked.connect(self._on_tokenizer)
        self.tokenizer_row = QWidget(self)
        tokenizer_row = QHBoxLayout(self.tokenizer_row)
        tokenizer_row.setContentsMargins(0, 0, 0, 0)
        tokenizer_row.addWidget(self.tokenizer_label, 1)
        tokenizer_row.addWidget(self.tokenizer_button)
        self.tokenizer_row.setVisible(False)

        weights_row = QHBoxLayout()
        weights_row.addWidget(QLabel("Weights", self))
        weights_row.addWidget(self.weights_combo, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.load_button, 2)
        buttons.addWidget(self.checkpoint_button, 1)
        buttons.addWidget(self.factory_button, 1)
        busy = QHBoxLayout()
        busy.addWidget(self.progress, 1)
        busy.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addWidget(self.current_label)
        layout.addWidget(self.tokenizer_row)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        # The hint comes and goes as models are selected: between the list and the Weights
        # row, so that the list gives it room and the Weights row and Load stay where they
        # are, under the mouse.
        layout.addWidget(self.hint)
        layout.addLayout(weights_row)
        layout.addLayout(buttons)
        layout.addLayout(busy)

        self._fill([])
        listen(session.model_changed, self._on_model_model_changed)
        self._on_model_model_changed(session.model)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._shown:
            self._shown = True
            self.first_shown.emit()

    # -- catalog ---------------------------------------------------------------------------
    def set_catalog(self, catalog: list[ModelInfo]) -> None:
        """Show the models of ``gradexplorer.models.weights.model_catalog()`` (torchvision)
        and ``gradexplorer.models.timm_models.timm_catalog()``."""
        # Hugging Face entries load as saved: no torchvision weights to choose.
        self._catalog = {info.name: info for info in catalog if info.task != "hugging_face"}
        self._fill(catalog)

    def _fill(self, catalog: list) -> None:
        # Imported on first use: the demos are not needed to start the window.
        from gradexplorer.models.demos import list_demos

        current = self.selected_spec()
        self.list.clear()
        bold = QFont()
        bold.setBold(True)

        def group(title: str) -> QTreeWidgetItem:
            item = QTreeWidgetItem(self.list, [title])
            item.setData(0, TITLE_ROLE, title)
            item.setFont(0, bold)
            item.setFlags(Qt.ItemFlag.ItemIsEnabled)
            item.setFirstColumnSpanned(True)
            return item

        demos = group("Demos (offline)")
        for spec, text in list_demos():
            item = QTreeWidgetItem(demos, [spec, "built in"])
            item.setData(0, SPEC_ROLE, spec)
            item.setToolTip(0, text)
        recent = [r for r in self.settings.recent_models() if not r.startswith("demo:")]
        if recent:
            g = group("Recent")
            for spec in recent:
                item = QTreeWidgetItem(g, [spec, ""])
                item.setData(0, SPEC_ROLE, spec)
                item.setToolTip(0, spec)
        by_task: dict[str, list] = {}
        for info in catalog:
            by_task.setdefault(info.task, []).append(info)
        for task in TASK_TITLES:
            infos = by_task.get(task)
            if not infos:
                continue
            g = group(TASK_TITLES[task])
            g.setData(0, COUNTED_ROLE, True)
            for info in infos:
                if info.cached:
                    state = "cached"
                elif task == "hugging_face":
                    state = "downloads"
                elif info.weights:
                    state = f"{len(info.weights)} to download"
                elif info.default_weights:
                    state = "to download"
                else:
                    state = "no weights"
                item = QTreeWidgetItem(g, [info.name, state])
                item.setData(0, SPEC_ROLE, info.name)
                if info.cached:
                    item.setForeground(1, QBrush(QColor("#1e7b34")))
                else:
                    item.setForeground(1, QBrush(QColor("#6b7280")))
                item.setToolTip(0, f"{info.name} ({task})\nweights: " + (", ".join(info.weights) or "none")
                                + ("\ncached: " + ", ".join(info.cached) if info.cached else ""))
        if not catalog:
            g = group("torchvision models")
            QTreeWidgetItem(g, ["loading…", ""]).setFlags(Qt.ItemFlag.NoItemFlags)
        self.list.expandToDepth(0)
        for top in self._groups():
            if top.childCount() > 20:
                top.setExpanded(top.text(0).startswith("Classification"))
        if current:
            self.select_spec(current)
        self._apply_search(self.search.text())

    def _apply_search(self, text: str) -> None:
        text = text.strip().lower()
        for top in self._groups():
            visible = 0
            children = _children(top)
            for child in children:
                show = not text or text in child.text(0).lower()
                child.setHidden(not show)
                visible += show
            top.setHidden(visible == 0)
            if top.data(0, COUNTED_ROLE):
                # The count follows the search: "Classification (1 of 80)", not "(80)".
                title = top.data(0, TITLE_ROLE)
                top.setText(0, f"{title}  ({visible} of {len(children)})" if text else f"{title}  ({len(children)})")
            if text and visible:
                top.setExpanded(True)

    def _groups(self) -> list[QTreeWidgetItem]:
        """The list's top-level items: the groups of models."""
        items = (self.list.topLevelItem(i) for i in range(self.list.topLevelItemCount()))
        return [item for item in items if item is not None]

    def select_spec(self, spec: str) -> bool:
        for top in self._groups():
            for child in _children(top):
                if child.data(0, SPEC_ROLE) == spec:
                    top.setExpanded(True)
                    self.list.setCurrentItem(child)
                    self.list.scrollToItem(child)
                    return True
        return False

    def selected_spec(self) -> str | None:
        item = self.list.currentItem()
        return item.data(0, SPEC_ROLE) if item is not None else None

    # -- weights ----------------------------------------------------------------------------
    def _on_current_changed(self, current: QTreeWidgetItem | None, _previous: QTreeWidgetItem | None) -> None:
        spec = current.data(0, SPEC_ROLE) if current is not None else None
        self._local_weights = None
        with QSignalBlocker(self.weights_combo):
            self.weights_combo.clear()
            info = self._catalog.get(spec) if spec else None
            if info is not None:
                if info.default_weights:
                    cached = " (cached)" if info.default_weights in info.cached else ""
                    self.weights_combo.addItem(f"DEFAULT: {info.default_weights.split('.')[-1]}{cached}", "DEFAULT")
                for w in info.weights:
                    cached = " (cached)" if w in info.cached else ""
                    self.weights_combo.addItem(f"{w.split('.')[-1]}{cached}", w)
                self.weights_combo.addItem("none (random init)", NO_WEIGHTS)
                self.weights_combo.addItem("local weights file…", LOCAL_FILE)
                if info.default_weights and info.default_weights not in info.cached:
                    # Offline is the case to serve: never open on weights that Load would
                    # have to download without saying so. Cached ones first, else random.
                    first = info.cached[0] if info.cached else NO_WEIGHTS
                    self.weights_combo.setCurrentIndex(self.weights_combo.findData(first))
                self.weights_combo.setEnabled(True)
            else:
                self.weights_combo.addItem("built in" if spec and spec.startswith("demo:") else "as saved", None)
                self.weights_combo.setEnabled(False)
        self.load_button.setEnabled(spec is not None)
        self._update_hint()

    def _on_weights_activated(self, _index: int) -> None:
        if self.weights_combo.currentData() == LOCAL_FILE:
            path = dialogs.ask_open_file(self, "Choose a weights file (state dict)", dialogs.WEIGHTS_FILTER)
            if path:
                self._local_weights = path
                self.weights_combo.setItemText(self.weights_combo.currentIndex(), f"file: {path.rsplit('/', 1)[-1]}")
            else:
                self.weights_combo.setCurrentIndex(0)
        self._update_hint()

    def selected_weights(self) -> str | None:
        data = self.weights_combo.currentData()
        if data == NO_WEIGHTS or data is None:
            return None
        if data == LOCAL_FILE:
            return self._local_weights
        return data

    def _update_hint(self) -> None:
        spec = self.selected_spec()
        info = self._catalog.get(spec) if spec else None
        weights = self.selected_weights()
        if info is not None and weights is None and self.weights_combo.currentData() == NO_WEIGHTS:
            if info.default_weights and info.default_weights not in info.cached:
                self.hint.setText("Pretrained weights are not cached here: pick them under Weights to download "
                                  "them, or a local weights file.")
            else:
                self.hint.setText("")
            return
        if info is None or weights is None:
            self.hint.setText("")
            return
        full = info.default_weights if weights == "DEFAULT" else weights
        if full in info.cached:
            self.hint.setText("These weights are in the local cache: loads offline.")
        elif full in info.weights:
            self.hint.setText("Not cached: Load downloads them first (progress below, can be cancelled).")
        elif full == info.default_weights and full is not None:
            self.hint.setText("Not in the Hugging Face cache: Load downloads them through timm.")
        else:
            self.hint.setText("")

    # -- requests ------------------------------------------------------------------------------
    def current_request(self) -> ModelRequest | None:
        spec = self.selected_spec()
        if spec is None:
            return None
        return ModelRequest(spec, self.selected_weights() if spec in self._catalog else None)

    def _on_load_clicked(self) -> None:
        request = self.current_request()
        if request is not None:
            self.load_requested.emit(request)

    def _on_checkpoint(self) -> None:
        """Checkpoint…: the file first, checked before anything else is asked (a picture or
        a TorchScript archive is refused at once); the architecture is asked only of a file
        of weights alone (a state dict)."""
        path = dialogs.ask_open_file(self, "Open a checkpoint", dialogs.CHECKPOINT_FILTER)
        if not path:
            return
        try:
            kind = checkpoint_kind(Path(path))  # its first bytes and its pickle's globals: nothing loaded
        except GradExplorerError as exc:
            error_dialog.show_error(self.window(), "The checkpoint cannot be used", exc)
            return
        arch = None
        if kind == "weights":
            names = sorted(self._catalog)
            arch = dialogs.ask_item(
                self, "Architecture",
                f"{Path(path).name} holds weights only (a state dict). Which torchvision architecture "
                "are they for?", names, True)
            if not arch:
                return
        self.load_requested.emit(ModelRequest(path, None, arch, False))

    def _on_factory(self) -> None:
        text = dialogs.ask_factory(self)
        if not text:
            return

        if not dialogs.confirm_trust(self, models.trust_subject(text),
                                     "gradexplorer will import this module and call the function."):
            return
        self.load_requested.emit(ModelRequest(text, None, None, True))

    def focus_search(self) -> None:
        """Put the cursor in the model search box."""
        self.search.setFocus()

    # -- busy state ------------------------------------------------------------------------------
    def set_busy(self, busy: bool, message: str = "") -> None:
        self.progress.setVisible(busy)
        self.cancel_button.setVisible(busy)
        self.load_button.setEnabled(not busy and self.selected_spec() is not None)
        if busy:
            self.progress.setRange(0, 0)
            self.progress.setFormat(message or "loading…")
            self.progress.setTextVisible(True)
        elif message:
            self.hint.setText(message)

    def set_progress(self, stage: str, done: int, total: int) -> None:
        if total > 0:
            self.progress.setRange(0, total)
            self.progress.setValue(done)
            self.progress.setFormat(f"{stage} {format_bytes(done)} / {format_bytes(total)}")
        else:
            self.progress.setRange(0, 0)
            self.progress.setFormat(stage)

    def _on_model_model_changed(self, model: LoadedModel | None) -> None:
        self._show_tokenizer(model)
        if model is None:
            self.current_label.setText("<i>No model loaded</i>")
            return
        tree = self.session.tree
        params = tree.root.total_params if tree is not None and "" in tree.nodes else 0
        weights = model.weights_label
        shape = "×".join(str(d) for d in model.input_shape) if model.input_shape else "unknown"
        self.current_label.setText(
            f"<b>{model.name}</b> · {format_count(params)} parameters<br>"
            f"<span style='color:#6b7280'>weights: {weights} · input {shape} · {model.task}</span>")
        self.current_label.setToolTip("\n".join(model.notes) if model.notes else model.spec)
        if self.select_spec(model.spec):
            self.show_weights(model.weights)

    def _show_tokenizer(self, model: LoadedModel | None) -> None:
        """The tokenizer row, for a model that came without one (a factory, a checkpoint)."""
        if model is None or not takes_a_tokenizer(model.spec):
            self.tokenizer_row.setVisible(False)
            return
        options = self.session.model_options
        chosen = options.tokenizer if options is not None and options.model == model.spec else None
        if chosen and model.tokenizer is not None:
            self.tokenizer_label.setText(f"Tokenizer: {Path(chosen).name or chosen}")
            self.tokenizer_label.setToolTip(chosen)
        else:
            self.tokenizer_label.setText("No tokenizer: choose one to give this model text.")
            self.tokenizer_label.setToolTip("")
        self.tokenizer_row.setVisible(True)

    def _on_tokenizer(self) -> None:
        """Tokenizer…: a folder, then the loaded model again with it (its weights, trust and
        class as it was loaded), as ``--tokenizer FOLDER`` would load it."""
        model = self.session.model
        if model is None:
            return
        folder = dialogs.ask_folder(self, "Choose the tokenizer's folder (written by tokenizer.save_pretrained)")
        if not folder:
            return
        self.load_requested.emit(self.request_with_tokenizer(folder))

    def request_with_tokenizer(self, tokenizer: str) -> ModelRequest:
        """The loaded model, to be loaded again with ``tokenizer``."""
        model = self.session.model
        assert model is not None
        o = self.session.model_options
        if o is not None and o.model == model.spec:
            return ModelRequest(model.spec, o.weights, o.arch, o.trust, o.hf_class, tokenizer)
        return ModelRequest(model.spec, tokenizer=tokenizer)

    def show_weights(self, weights: str | None) -> None:
        """Set the Weights box to what is loaded (``LoadedModel.weights``), not to a default."""
        combo = self.weights_combo
        if not combo.isEnabled():
            return
        with QSignalBlocker(combo):
            if weights is None:
                combo.setCurrentIndex(combo.findData(NO_WEIGHTS))
            elif weights.startswith("file:"):
                index = combo.findData(LOCAL_FILE)
                self._local_weights = weights[5:]
                combo.setItemText(index, f"file: {Path(weights[5:]).name}")
                combo.setCurrentIndex(index)
            elif combo.findData(weights) >= 0:
                combo.setCurrentIndex(combo.findData(weights))
        self._update_hint()


def _children(item: QTreeWidgetItem) -> list[QTreeWidgetItem]:
    children = (item.child(j) for j in range(item.childCount()))
    return [child for child in children if child is not None]
