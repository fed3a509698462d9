"""The input batch: open or drop images, a tensor file or a random batch; thumbnails with
the top-5 predicted classes after a run; the preprocessing applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from PIL import Image
from PySide6.QtCore import QSignalBlocker, QSize, Qt, Signal
from PySide6.QtGui import QColor, QDragEnterEvent, QDragMoveEvent, QDropEvent, QFont, QIcon, QImage, QPainter, QPixmap
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.analysis.class_names import class_name, top_classes
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.inputs import Batch
from gradexplorer.capturing.targets import class_dim_of
from gradexplorer.files.meta import capture_meta
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.session import Session
from gradexplorer_app import dialogs
from gradexplorer_app.listeners import listen
from gradexplorer_app.window.settings import AppSettings

THUMB = 64


def pil_to_pixmap(image: Image.Image, size: int = THUMB) -> QPixmap:
    """A square thumbnail of a PIL image, letterboxed on white."""
    im = image.convert("RGB")
    im.thumbnail((size, size))
    data = im.tobytes()
    qimage = QImage(data, im.width, im.height, 3 * im.width, QImage.Format.Format_RGB888).copy()
    return _boxed(QPixmap.fromImage(qimage), size)


#: A thumbnail's channel mean is taken over at most this many channels (every k-th).
SAMPLED_CHANNELS = 64


def _sampled(sample: torch.Tensor, size: int) -> torch.Tensor:
    """A strided view of ``sample`` with at most ``4 * size`` rows and columns (and at most
    :data:`SAMPLED_CHANNELS` channels of a 3-D sample): what a thumbnail needs, taken
    without copying. A sample may be a view declaring gigabytes (``expand``), which any
    arithmetic on the whole would make dense."""
    t = sample.detach()
    if t.dim() == 3 and t.shape[0] not in (1, 3):
        t = t[:: max(1, -(-t.shape[0] // SAMPLED_CHANNELS))]
    if t.dim() >= 2:
        side = max(size * 4, 1)
        t = t[..., :: max(1, -(-t.shape[-2] // side)), :: max(1, -(-t.shape[-1] // side))]
    return t


def tensor_to_pixmap(sample: torch.Tensor, size: int = THUMB) -> QPixmap:
    """A picture of one input sample: RGB when it has 3 channels, else the channel mean
    in grey; anything that is not an image becomes a labelled tile. Drawn from a strided
    view of the sample (:func:`_sampled`), never from a dense copy of all of it."""
    if not (sample.dim() == 3 or (sample.dim() == 2 and min(sample.shape) > 1)):
        return placeholder_pixmap("×".join(str(d) for d in sample.shape) or "scalar", size)
    t = _sampled(sample, size).float()
    if t.dim() == 3 and t.shape[0] in (1, 3):
        img = t if t.shape[0] == 3 else t.expand(3, -1, -1)
    elif t.dim() == 3:
        img = t.mean(0, keepdim=True).expand(3, -1, -1)
    elif t.dim() == 2 and min(t.shape) > 1:
        img = t.unsqueeze(0).expand(3, -1, -1)
    else:
        return placeholder_pixmap("×".join(str(d) for d in t.shape) or "scalar", size)
    lo, hi = float(img.min()), float(img.max())
    img = (img - lo) / (hi - lo) if hi > lo else torch.zeros_like(img)
    arr = (img.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    h, w = arr.shape[:2]
    qimage = QImage(arr.data, w, h, 3 * w, QImage.Format.Format_RGB888).copy()
    pix = QPixmap.fromImage(qimage).scaled(size, size, Qt.AspectRatioMode.KeepAspectRatio,
                                           Qt.TransformationMode.SmoothTransformation)
    return _boxed(pix, size)


def placeholder_pixmap(text: str, size: int = THUMB) -> QPixmap:
    pix = QPixmap(size, size)
    pix.fill(QColor("#eef1f5"))
    p = QPainter(pix)
    p.setPen(QColor("#6b7280"))
    f = QFont()
    f.setPointSize(8)
    p.setFont(f)
    p.drawRect(0, 0, size - 1, size - 1)
    p.drawText(pix.rect(), Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, text)
    p.end()
    return pix


def _boxed(pix: QPixmap, size: int) -> QPixmap:
    out = QPixmap(size, size)
    out.fill(QColor("white"))
    p = QPainter(out)
    p.drawPixmap((size - pix.width()) // 2, (size - pix.height()) // 2, pix)
    p.setPen(QColor("#d0d5dd"))
    p.drawRect(0, 0, size - 1, size - 1)
    p.end()
    return out


class BatchPanel(QWidget):
    """Shows the session's batch; ``load_requested(sources)`` when the user picks inputs,
    ``sample_selected(i)`` when a thumbnail is clicked."""

    load_requested = Signal(list)
    sample_selected = Signal(int)

    def __init__(self, session: Session, settings: AppSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.settings = settings
        self.setAcceptDrops(True)

        self.images_button = QPushButton("Images…", self)
        self.images_button.setToolTip("Open image files (or drop files or a folder here)")
        self.images_button.clicked.connect(self.open_images)
        self.more_button = QToolButton(self)
        self.more_button.setText("More")
        self.more_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.more_button)
        menu.addAction("Folder of images…", self._on_open_folder)
        menu.addAction("Tensor file (.pt)…", self._on_open_tensor)
        menu.addAction("Demo samples", lambda: self.load_requested.emit(["demo"]))
        self.recent_menu = menu.addMenu("Recent inputs")
        menu.aboutToShow.connect(self._fill_recent)
        self.more_button.setMenu(menu)
        self.shape_edit = QLineEdit(self)
        self.shape_edit.setPlaceholderText("2x3x224x224")
        self.shape_edit.setToolTip("Shape of a random batch (standard normal values)")
        self.shape_edit.setMaximumWidth(120)
        self.random_button = QPushButton("Random", self)
        self.random_button.setToolTip("A random batch of the shape on the left")
        self.random_button.clicked.connect(self._on_random)
        self.shape_edit.returnPressed.connect(self._on_random)

        # Text models (a tokenizer came with the model): one sample a line.
        self.text_edit = QPlainTextEdit(self)
        self.text_edit.setPlaceholderText("Text, one sample a line (tokenised with the model's tokenizer)")
        self.text_edit.setMaximumHeight(72)
        self.text_button = QPushButton("Use text", self)
        self.text_button.setToolTip("Tokenise the lines above and use them as the batch")
        self.text_button.clicked.connect(self._on_text)
        self.text_box = QWidget(self)
        text_row = QHBoxLayout(self.text_box)
        text_row.setContentsMargins(0, 0, 0, 0)
        text_row.addWidget(self.text_edit, 1)
        text_row.addWidget(self.text_button, 0, Qt.AlignmentFlag.AlignTop)
        self.text_box.hide()

        self.list = QListWidget(self)
        self.list.setIconSize(QSize(THUMB, THUMB))
        self.list.setViewMode(QListWidget.ViewMode.ListMode)
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.list.setUniformItemSizes(False)
        self.list.setSpacing(2)
        self.list.setWordWrap(True)
        self.list.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.list.currentRowChanged.connect(self._on_row_changed)
        self.source_label = QLabel(self)
        self.source_label.setWordWrap(True)
        self.source_label.setObjectName("batchSource")
        self.preprocess_label = QLabel(self)
        self.preprocess_label.setWordWrap(True)
        self.preprocess_label.setObjectName("hint")
        self.preprocess_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        row = QHBoxLayout()
        row.setSpacing(4)
        row.addWidget(self.images_button)
        row.addWidget(self.more_button)
        row.addStretch(1)
        row.addWidget(self.shape_edit)
        row.addWidget(self.random_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addLayout(row)
        layout.addWidget(self.text_box)
        layout.addWidget(self.source_label)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.preprocess_label)

        self._pixmaps: list[QPixmap] = []
        listen(session.batch_changed, self._on_model_batch_changed)
        listen(session.capture_changed, self._on_model_capture_changed)
        listen(session.model_changed, self._on_model_model_changed)
        self._on_model_model_changed(session.model)
        self._on_model_batch_changed(session.batch)

    # -- user actions -----------------------------------------------------------------
    def open_images(self) -> None:
        """Ask for image files and request them as the batch."""
        files = dialogs.ask_open_files(self, "Open images", dialogs.IMAGE_FILTER)
        if files:
            self.load_requested.emit(files)

    def _on_open_folder(self) -> None:
        folder = dialogs.ask_folder(self, "Open a folder of images")
        if folder:
            self.load_requested.emit([folder])

    def _on_open_tensor(self) -> None:
        path = dialogs.ask_open_file(self, "Open a tensor file", dialogs.TENSOR_FILTER)
        if path:
            self.load_requested.emit([path])

    def _on_random(self) -> None:
        shape = self.shape_edit.text().strip() or self.shape_edit.placeholderText()
        self.load_requested.emit([f"random:{shape}"])

    def _on_text(self) -> None:
        lines = [line for line in self.text_edit.toPlainText().splitlines() if line.strip()]
        if lines:
            self.load_requested.emit([f"text:{line}" for line in lines])

    def _load_recent(self, item: str) -> Callable[[], None]:
        return lambda: self.load_requested.emit(item.split("\n"))

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        items = self.settings.recent_inputs()
        for item in items:
            self.recent_menu.addAction(item, self._load_recent(item))
        self.recent_menu.setEnabled(bool(items))

    def show_sample(self, index: int) -> None:
        """Make ``index`` the current thumbnail without announcing it (the model's echo)."""
        if 0 <= index < self.list.count() and self.list.currentRow() != index:
            with QSignalBlocker(self.list):
                self.list.setCurrentRow(index)

    def _on_row_changed(self, row: int) -> None:
        if row >= 0:
            self.sample_selected.emit(row)

    # -- drag and drop -------------------------------------------------------------------
    def dragEnterEvent(self, event: QDragEnterEvent | QDragMoveEvent) -> None:
        if event.mimeData().hasUrls() and any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:
        self.dragEnterEvent(event)

    def dropEvent(self, event: QDropEvent) -> None:
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if paths:
            event.acceptProposedAction()
            self.load_requested.emit(paths)

    # -- session -> widgets ---------------------------------------------------------------
    def _on_model_model_changed(self, model: LoadedModel | None) -> None:
        self.text_box.setVisible(model is not None and model.tokenizer is not None)
        if model is None:
            return
        # Imported on first use: reading inputs is not needed to start the window.
        from gradexplorer.batches.random_batches import random_shape_for

        # The shape a bare "Random" makes: the model's input shape, else what its first layer
        # takes (2x16 token ids for an embedding), never a picture's shape for a sequence model.
        shape = random_shape_for(model.module, model.input_shape)
        self.shape_edit.setPlaceholderText("x".join(map(str, shape)) if shape else "2x3x224x224")

    def _on_model_batch_changed(self, batch: Batch | None) -> None:
        self.list.clear()
        self._pixmaps = []
        if batch is None:
            self.source_label.setText("<i>No input batch.</i> Drop images here, or use the buttons above.")
            self.preprocess_label.setText("")
            return
        # Imported on first use: reading inputs is not needed to start the window.
        from gradexplorer.batches import describe

        sample = "×".join(str(d) for d in batch.tensor.shape[1:])
        labels = " · with labels" if batch.labels is not None else ""
        self.source_label.setText(f"<b>{len(batch)} sample{'s' if len(batch) != 1 else ''}</b> "
                                  f"({sample}) · {batch.source}{labels}")
        self.source_label.setToolTip(describe(batch))
        self.preprocess_label.setText(f"Preprocessing: {batch.preprocessing}")
        n = len(batch)
        for i in range(n):
            if batch.images is not None and i < len(batch.images):
                pix = pil_to_pixmap(batch.images[i])
            else:
                pix = tensor_to_pixmap(batch.tensor[i])
            self._pixmaps.append(pix)
            item = QListWidgetItem(QIcon(pix), self._item_text(i, None))
            self.list.addItem(item)

    def _label_name(self, i: int) -> str | None:
        batch = self.session.batch
        if batch is None or batch.labels is None or i >= len(batch.labels):
            return None
        return class_name(int(batch.labels[i]), self.session.categories)

    def _item_text(self, i: int, predictions: list[tuple[str, float]] | None) -> str:
        batch = self.session.batch
        name = batch.names[i] if batch is not None and i < len(batch.names) else f"sample {i}"
        lines = [name]
        label = self._label_name(i)
        if predictions:
            for rank, (cls, p) in enumerate(predictions):
                mark = "  ✓" if label is not None and cls == label and rank == 0 else ""
                lines.append(f"{rank + 1}. {cls}  {p * 100:.1f}%{mark}")
            if label is not None and predictions[0][0] != label:
                lines.append(f"label: {label}")
        elif label is not None:
            lines.append(f"label: {label}")
        return "\n".join(lines)

    def _on_model_capture_changed(self, capture: Capture | None) -> None:
        batch = self.session.batch
        if batch is None:
            if capture is not None and capture.input is not None:
                self._show_capture_inputs(capture)
            return
        preds = (top_classes(capture.output, self.session.categories,
                             class_dim=class_dim_of(capture.meta.get("target")))
                 if capture is not None else [])
        tokenizer = self.session.model.tokenizer if self.session.model is not None else None
        if capture is not None and capture.meta.get("predicted_tokens") and tokenizer is not None:
            preds = _next_tokens(capture, tokenizer)
        for i in range(self.list.count()):
            self.list.item(i).setText(self._item_text(i, preds[i] if i < len(preds) else None))

    def _show_capture_inputs(self, capture: Capture) -> None:
        """A capture opened from a file, without its batch: show its input tensor."""
        self.list.clear()
        meta = capture_meta(capture)
        preds = top_classes(capture.output, meta.categories, class_dim=class_dim_of(capture.meta.get("target")))
        x = capture.input
        assert x is not None  # shown only for a capture that carries its input
        source = f" from {meta.batch_source}" if meta.batch_source else ""
        self.source_label.setText(f"<b>{len(x)} samples</b> ({'×'.join(str(d) for d in x.shape[1:])}) "
                                  f"· from the capture file{source}")
        self.preprocess_label.setText(f"Preprocessing: {meta.preprocessing}")
        for i in range(len(x)):
            lines = [meta.sample_name(i)]
            if meta.labels is not None and i < len(meta.labels):
                lines.append(f"label: {class_name(meta.labels[i], meta.categories)}")
            if i < len(preds):
                lines += [f"{r + 1}. {c}  {p * 100:.1f}%" for r, (c, p) in enumerate(preds[i])]
            self.list.addItem(QListWidgetItem(QIcon(tensor_to_pixmap(x[i])), "\n".join(lines)))


@runtime_checkable
class _Decodes(Protocol):
    """What a tokenizer needs here: ids back to text."""

    def decode(self, ids: list[int]) -> str: ...


def _next_tokens(capture: Capture, tokenizer: object, k: int = 5) -> list[list[tuple[str, float]]]:
    """A language model's top next tokens at the target's position, per sample, with their
    probabilities (the thumbnails' "top classes" of a text batch)."""
    from gradexplorer.capturing.targets import parse_target

    y = capture.output
    position = parse_target(capture.meta.get("target") or "top1").position
    if y is None or y.dim() != 3 or position is None or not isinstance(tokenizer, _Decodes):
        return []
    probs = torch.softmax(y[:, position, :].double(), dim=-1)
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)
    decode = tokenizer.decode
    return [[(repr(decode([int(t)])), float(p)) for p, t in zip(ps, ts)]
            for ps, ts in zip(top.values.tolist(), top.indices.tolist())]
