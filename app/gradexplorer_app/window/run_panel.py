"""Run settings and the Run button: device, target, mode, capture kind, progress, Cancel."""

from __future__ import annotations

import threading

import torch
from PySide6.QtCore import QSignalBlocker, QStringListModel, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QCompleter,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.base.devices import DeviceInfo
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.memory_estimate import (
    Budget,
    MemoryEstimate,
    budget_message,
    budget_shortfall,
    estimate_capture_memory,
    read_budget,
    stats_only_fits,
)
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer.capturing.targets import CLASS_KINDS, Target, parse_target
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.session import Session
from gradexplorer_app.listeners import listen
from gradexplorer_app.run_worker import Progress, TaskRunner
from gradexplorer_app.views.label_fit import ElidedLabel, wrap_label
from gradexplorer_app.window.error_dialog import one_line

TARGETS = (
    ("top1", "Top-1 logit (predicted class)"),
    ("class", "Logit of a class…"),
    ("sum", "Sum of outputs"),
    ("mean", "Mean of outputs"),
    ("cross_entropy", "Cross-entropy with labels"),
)

#: The class axes offered in the window (the CLI's ``,dim=D`` takes any).
CLASS_DIMS = (
    ("dim 1: (batch, classes, …)", 1),
    ("last dim: (batch, length, vocab)", -1),
)


#: The positions a class target on per-token logits reads: the last one (a causal
#: language model's prediction of the next token) or every position, summed.
POSITIONS = (
    ("every position, summed", "all"),
    ("the last: the next token", -1),
)

WARNING_COLOUR = "#c0392b"


class RunPanel(QWidget):
    """Edits the session's run settings; ``run_requested`` / ``cancel_requested`` when the
    buttons are pressed. The main window runs the capture and calls :meth:`set_running`
    and :meth:`set_progress`.

    Beside Run it shows what the capture will hold in memory (``gradexplorer.capturing.memory_estimate``),
    recomputed when the model, batch, selection or settings change, and a warning when
    that is over the budget. The estimate needs a tree probed with the batch's sample
    shape: the session's (probed when the model was loaded) when it fits, else one
    probed in a worker (a forward pass never runs on the GUI thread).

    Signals
    -------
    estimate_changed(object)
        The new :class:`MemoryEstimate`, or None when it cannot be told.
    """

    run_requested = Signal()
    cancel_requested = Signal()
    estimate_changed = Signal(object)

    def __init__(self, session: Session, devices: list[DeviceInfo], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self._running = False
        self._idle_message: str | None = None
        # Built in this order: Qt's tab order follows the order widgets are made.
        self._build_target_widgets(devices)
        self._build_mode_widgets()
        self._build_run_widgets()
        self._init_estimate()
        self._build_layout(self._build_form())
        self._connect_widgets()
        self._connect_session()

        if session.device == "auto" and devices:
            session.set_device(devices[0].name)
        self._on_model_settings_changed("")
        self._on_model_model_changed(session.model)
        self.update_estimate()

    def _build_target_widgets(self, devices: list[DeviceInfo]) -> None:
        """The device and the target's widgets: kind, class, labels, output key, class axis, positions."""
        self.device_combo = QComboBox(self)
        for d in devices:
            self.device_combo.addItem(d.label, d.name)
        self.device_combo.setToolTip("Where forward and backward run")

        self.target_combo = QComboBox(self)
        for key, text in TARGETS:
            self.target_combo.addItem(text, key)
        self.target_combo.setToolTip("The scalar that backward starts from (logits, before softmax)")
        self.class_edit = QLineEdit(self)
        self.class_edit.setPlaceholderText("class name or index")
        self._class_names = QStringListModel(self)
        completer = QCompleter(self._class_names, self)
        completer.setCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        completer.setFilterMode(Qt.MatchFlag.MatchContains)
        self.class_edit.setCompleter(completer)
        self.labels_edit = QLineEdit(self)
        self.labels_edit.setPlaceholderText("labels: indices or names, comma separated")
        self.key_combo = QComboBox(self)
        self.key_combo.setToolTip("Which element of the model's dict/tuple output the target uses")
        # Shown for class targets when the output has positions ((B, C, L) or more) or the
        # session's target names an axis: a sequence model's per-token logits (B, length,
        # vocab) hold their classes last, where dim 1 would pick among positions.
        self.class_dim_combo = QComboBox(self)
        for text, dim in CLASS_DIMS:
            self.class_dim_combo.addItem(text, dim)
        self.class_dim_combo.setToolTip(
            "Which dim of the output holds the classes: dim 1 for classifiers, segmentation and "
            "Conv1d outputs (B, classes, …); the last for a sequence model's per-token logits "
            "(B, length, vocab)")
        self.position_combo = QComboBox(self)
        for text, position in POSITIONS:
            self.position_combo.addItem(text, position)
        self.position_combo.setToolTip(
            "Which positions of per-token logits (B, length, vocab) the target reads: a causal language "
            "model predicts the next token at the last position")
        self.key_label = QLabel("Output", self)

    def _build_mode_widgets(self) -> None:
        """Eval or train, full tensors or statistics only, and the input gradient."""
        self.eval_radio = QRadioButton("eval", self)
        self.train_radio = QRadioButton("train", self)
        self.eval_radio.setToolTip("Inference behaviour (BatchNorm running statistics, no dropout)")
        self.train_radio.setToolTip("Training behaviour; BatchNorm statistics are restored afterwards")
        self._mode_group = QButtonGroup(self)
        self._mode_group.addButton(self.eval_radio)
        self._mode_group.addButton(self.train_radio)
        self.full_radio = QRadioButton("full tensors", self)
        self.stats_radio = QRadioButton("statistics only", self)
        self.full_radio.setToolTip("Keep every activation and gradient (on the CPU)")
        self.stats_radio.setToolTip("Keep only statistics and histograms, computed on the device: "
                                    "for big models and batches")
        self._capture_group = QButtonGroup(self)
        self._capture_group.addButton(self.full_radio)
        self._capture_group.addButton(self.stats_radio)
        self.input_grad_check = QCheckBox("input gradient (saliency)", self)

    def _build_run_widgets(self) -> None:
        """Run and Cancel, the progress bar, the status line, the memory estimate and its warning."""
        self.run_button = QPushButton("Run", self)
        self.run_button.setObjectName("runButton")
        self.run_button.setToolTip("Run forward and backward and capture the checked layers (Ctrl+R)")
        self.run_button.setMinimumHeight(32)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setEnabled(False)
        self.cancel_button.setMinimumHeight(32)
        self.progress = QProgressBar(self)
        self.progress.setTextVisible(True)
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("idle")
        self.status_label = QLabel(self)
        self.status_label.setObjectName("hint")
        self.status_label.setWordWrap(True)
        self.memory_label = wrap_label(QLabel(self))
        # On its own row, under the buttons: beside the Run button its width changed with
        # the estimate ("statistics only" shortens it), and the Run button moved.
        self.memory_label.setObjectName("memoryEstimate")
        self.memory_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.budget_label = QLabel(self)
        self.budget_label.setObjectName("budgetWarning")
        self.budget_label.setWordWrap(True)
        self.budget_label.setVisible(False)

    def _init_estimate(self) -> None:
        """The memory estimate's state and the timer that folds a burst of changes into one estimate."""
        #: The estimate for the current settings (None: not known) and the budget warning.
        self.estimate: MemoryEstimate | None = None
        self.budget_message: str | None = None
        #: Over the budget, keeping statistics only would fit (the dialog offers the switch).
        self.stats_only_fits = False
        #: The budget read with the last estimate, and the (device, budget option) it is for.
        self._budget: tuple[tuple[str, int | None], Budget] | None = None
        # (model module, per-sample bytes, tree) probed in a worker
        self._probed_tree: tuple[torch.nn.Module, int, ModuleTree] | None = None
        self._probe_runner: TaskRunner | None = None
        self._estimate_timer = QTimer(self)
        self._estimate_timer.setSingleShot(True)
        self._estimate_timer.setInterval(30)  # set_model emits several signals: one estimate
        self._estimate_timer.timeout.connect(self.update_estimate)

    def _build_form(self) -> QFormLayout:
        """The settings' form: one labelled row per setting."""
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.setHorizontalSpacing(8)
        form.setVerticalSpacing(6)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.addRow("Device", self.device_combo)
        form.addRow("Target", self.target_combo)
        form.addRow("", self.class_edit)
        form.addRow("", self.labels_edit)
        form.addRow(self.key_label, self.key_combo)
        form.addRow("Classes on", self.class_dim_combo)
        form.addRow("Position", self.position_combo)
        modes = QHBoxLayout()
        modes.addWidget(self.eval_radio)
        modes.addWidget(self.train_radio)
        modes.addStretch(1)
        form.addRow("Mode", modes)
        kinds = QHBoxLayout()
        kinds.addWidget(self.full_radio)
        kinds.addWidget(self.stats_radio)
        kinds.addStretch(1)
        form.addRow("Keep", kinds)
        form.addRow("", self.input_grad_check)
        self._form = form
        return form

    def _build_layout(self, form: QFormLayout) -> None:
        """The folding settings above the buttons, the estimate, the progress and the status."""
        self._build_settings_fold(form)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button, 2)
        buttons.addWidget(self.cancel_button, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addWidget(self.summary_box)
        layout.addWidget(self.settings_widget)
        layout.addLayout(buttons)
        layout.addWidget(self.memory_label)
        layout.addWidget(self.budget_label)
        layout.addWidget(self.progress)
        layout.addWidget(self.status_label)

    def _build_settings_fold(self, form: QFormLayout) -> None:
        """The settings in a widget of their own: in a narrow window (the panel folded under
        the module tree) they fold behind a "Settings" button and a line that sums them up,
        so that the tree keeps its height."""
        self.settings_widget = QWidget(self)
        form.setParent(None)
        self.settings_widget.setLayout(form)
        self.settings_button = QToolButton(self)
        self.settings_button.setText("Settings")
        self.settings_button.setCheckable(True)
        self.settings_button.setArrowType(Qt.ArrowType.RightArrow)
        self.settings_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.settings_button.setAutoRaise(True)
        self.settings_button.setToolTip("Device, target, mode, what to keep, input gradient")
        self.settings_button.toggled.connect(self._on_settings_toggled)
        self.settings_summary = ElidedLabel("", self)
        self.settings_summary.setObjectName("hint")
        summary_row = QHBoxLayout()
        summary_row.setContentsMargins(0, 0, 0, 0)
        summary_row.addWidget(self.settings_button)
        summary_row.addWidget(self.settings_summary, 1)
        self.summary_box = QWidget(self)
        self.summary_box.setLayout(summary_row)
        self.summary_box.hide()
        self.compact = False

    def _connect_widgets(self) -> None:
        """Widget -> session: each edit is written to the session."""
        self.device_combo.currentIndexChanged.connect(self._on_device_changed)
        self.target_combo.currentIndexChanged.connect(self._on_target_changed)
        self.class_edit.editingFinished.connect(self._on_target_changed)
        self.key_combo.currentIndexChanged.connect(self._on_target_changed)
        self.class_dim_combo.currentIndexChanged.connect(self._on_target_changed)
        self.position_combo.currentIndexChanged.connect(self._on_target_changed)
        self.labels_edit.editingFinished.connect(self._on_labels_changed)
        self.train_radio.toggled.connect(self._on_train_changed)
        self.stats_radio.toggled.connect(self._on_capture_kind_changed)
        self.input_grad_check.toggled.connect(self._on_input_grad_changed)
        self.run_button.clicked.connect(self._on_run_clicked)
        self.cancel_button.clicked.connect(self.cancel_requested)

    def _connect_session(self) -> None:
        """Session -> widgets, and a new estimate after any change it depends on."""
        session = self.session
        listen(session.settings_changed, self._on_model_settings_changed)
        listen(session.settings_changed, lambda _n: self._update_summary())
        listen(session.model_changed, self._on_model_model_changed)
        listen(session.selection_changed, lambda _s: self._update_run_enabled())
        listen(session.tree_changed, lambda _t: self._show_class_dim_row())
        listen(session.batch_changed, lambda _b: self._reset_idle())
        for signal in (session.model_changed, session.tree_changed, session.tree_measured, session.batch_changed,
                       session.selection_changed, session.settings_changed, session.capture_changed):
            # A new capture too: the free memory the budget is read from changed with it.
            signal.connect(lambda *_a: self._estimate_timer.start())

    # -- widget -> session ------------------------------------------------------------
    def _on_device_changed(self, _index: int) -> None:
        name = self.device_combo.currentData()
        if name:
            self.session.set_device(name)

    def target_text(self) -> str:
        """The target as ``parse_target`` reads it, from the widgets. The model's own
        default target (a causal language model's next token at the last position) is
        written as ``top1``, which stands for it."""
        kind = self.target_combo.currentData()
        dim = (self.class_dim_combo.currentData() or 1) if kind in CLASS_KINDS else 1
        position = self.position_combo.currentData() if self._position_shown(kind, dim) else None
        position = position if isinstance(position, int) else None
        if kind != "class":
            text = str(Target(kind, class_dim=dim, position=position))
            return "top1" if text == self._default_target() else text
        text = self.class_edit.text().strip()
        if not text:
            index = 0
        elif text.lstrip("-").isdigit():
            index = int(text)
        else:
            # Imported on first use: reading inputs is not needed to start the window.
            from gradexplorer.batches import parse_labels

            index = int(parse_labels(text, 1, self.session.categories)[0])
        # the session's parse_target checks it
        return str(Target("class", index, class_dim=dim, position=position))

    def _default_target(self) -> str | None:
        """The target that the plain ``top1`` stands for with this model, if it has one."""
        model = self.session.model
        return getattr(model, "default_target", None) if model is not None else None

    def effective_target(self) -> Target:
        """The target a run will use: the session's, with ``top1`` read as the model's default."""
        default = self._default_target()
        return parse_target(default if self.session.target == "top1" and default else self.session.target)

    @staticmethod
    def _position_shown(kind: str, dim: int) -> bool:
        return kind in ("top1", "class") and dim == -1

    def _show_class_dim_row(self) -> None:
        kind = self.target_combo.currentData()
        shown = self._class_dim_shown(kind)
        self._form.setRowVisible(self.class_dim_combo, shown)
        self._form.setRowVisible(self.position_combo,
                                 shown and self._position_shown(kind, self.class_dim_combo.currentData() or 1))
        self.target_combo.setToolTip("The scalar that backward starts from (logits, before softmax): "
                                     + self.effective_target().describe())

    def _class_dim_shown(self, kind: str) -> bool:
        """Whether the class axis is a choice: a class target on an output with positions,
        or a target that already names an axis."""
        if kind not in CLASS_KINDS:
            return False
        if self.class_dim_combo.currentData() not in (None, 1):
            return True
        tree = self.session.tree
        shapes = tree.root.output_shapes if tree is not None else []
        return bool(shapes) and len(shapes[0]) >= 3

    def apply_target(self) -> None:
        """Write the target widgets to the session (raises GradExplorerError when invalid)."""
        key = self.key_combo.currentData() if self.key_combo.isVisible() or self.key_combo.count() else None
        self.session.set_target(self.target_text(), key or None)
        self.session.set_labels(self.labels_edit.text())

    def _on_target_changed(self, *_args: object) -> None:
        kind = self.target_combo.currentData()
        self.class_edit.setVisible(kind == "class")
        self.labels_edit.setVisible(kind == "cross_entropy")
        self._form.setRowVisible(self.class_edit, kind == "class")
        self._form.setRowVisible(self.labels_edit, kind == "cross_entropy")
        self._show_class_dim_row()
        try:
            self.apply_target()
            self.status_label.setText("")
            # What will run, shown back (plain top1 stands for a causal LM's own target).
            self._on_model_settings_changed("")
        except GradExplorerError as exc:
            self.status_label.setText(f"<span style='color:#c0392b'>{exc.problem}</span> {exc.fix}")

    def _on_labels_changed(self) -> None:
        self.session.set_labels(self.labels_edit.text())

    def _on_train_changed(self, on: bool) -> None:
        self.session.set_train(on)

    def _on_capture_kind_changed(self, stats: bool) -> None:
        self.session.set_mode("stats" if stats else "full")

    def _on_input_grad_changed(self, on: bool) -> None:
        self.session.set_input_grad(on)

    def _on_run_clicked(self) -> None:
        self.run_requested.emit()

    # -- session -> widgets -----------------------------------------------------------
    def sync_from_session(self) -> None:
        """Show the session's run settings in the widgets (after they were set from outside)."""
        self._on_model_settings_changed("")

    def _on_model_settings_changed(self, _name: str) -> None:
        s = self.session
        blockers = [QSignalBlocker(w) for w in (self.device_combo, self.target_combo, self.train_radio,
                                                self.eval_radio, self.full_radio, self.stats_radio,
                                                self.input_grad_check, self.key_combo,
                                                self.class_dim_combo, self.position_combo)]
        i = self.device_combo.findData(s.device)
        if i >= 0:
            self.device_combo.setCurrentIndex(i)
        target = self.effective_target()
        kind = target.kind
        i = self.target_combo.findData(kind)
        if i >= 0:
            self.target_combo.setCurrentIndex(i)
        if kind == "class" and not self.class_edit.hasFocus():
            index = target.class_index or 0
            cats = s.categories or []
            self.class_edit.setText(cats[index] if index < len(cats) else str(index))
        if kind in CLASS_KINDS:  # sum and mean name no axis: the one chosen stays for later
            i = self.class_dim_combo.findData(target.class_dim)
            if i < 0:  # an axis set elsewhere (--target top1,dim=2): offered as it is
                self.class_dim_combo.addItem(f"dim {target.class_dim}", target.class_dim)
                i = self.class_dim_combo.count() - 1
            self.class_dim_combo.setCurrentIndex(i)
        if self._position_shown(kind, target.class_dim):
            position = target.position if target.position is not None else "all"
            i = self.position_combo.findData(position)
            if i < 0:  # a position set elsewhere (--target top1,dim=-1,pos=0): offered as it is
                self.position_combo.addItem(f"position {position}", position)
                i = self.position_combo.count() - 1
            self.position_combo.setCurrentIndex(i)
        if not self.labels_edit.hasFocus():
            self.labels_edit.setText(s.labels_text)
        self.train_radio.setChecked(s.train)
        self.eval_radio.setChecked(not s.train)
        self.stats_radio.setChecked(s.mode == "stats")
        self.full_radio.setChecked(s.mode == "full")
        self.input_grad_check.setChecked(s.input_grad)
        i = self.key_combo.findData(s.output_key or "")
        if i >= 0:
            self.key_combo.setCurrentIndex(i)
        del blockers
        self.class_edit.setVisible(kind == "class")
        self._form.setRowVisible(self.class_edit, kind == "class")
        self._form.setRowVisible(self.labels_edit, kind == "cross_entropy")
        self._show_class_dim_row()

    def _reset_idle(self) -> None:
        if not self._running:
            self._idle_message = None
            self.progress.setValue(0)
            self._update_run_enabled()

    def _on_model_model_changed(self, model: LoadedModel | None) -> None:
        self._reset_idle()
        self._class_names.setStringList(list(self.session.categories or []))
        with QSignalBlocker(self.key_combo):
            self.key_combo.clear()
            keys = self.session.output_keys
            if keys:
                self.key_combo.addItem("(default)", "")
                for k in keys:
                    self.key_combo.addItem(k, k)
        self._form.setRowVisible(self.key_combo, bool(self.session.output_keys))
        self._on_model_settings_changed("")
        self._update_run_enabled()

    def _update_run_enabled(self) -> None:
        s = self.session
        if self._running:
            return
        self.run_button.setEnabled(s.can_run())
        if s.model is None:
            tip = "Load a model to run"
        elif s.batch is None:
            tip = "Choose an input batch to run"
        elif not s.selection:
            tip = "Tick at least one layer to run"
        else:
            tip = f"ready: {len(s.selection)} modules on {s.device}"
        self.run_button.setToolTip(f"{tip} (Ctrl+R)")
        if self._idle_message is None:
            self.progress.setFormat(tip)

    # -- compact ------------------------------------------------------------------------
    def set_compact(self, compact: bool) -> None:
        """Fold the settings behind "Settings" and a one-line summary (True), or show them."""
        self.compact = compact
        self.summary_box.setVisible(compact)
        self._on_settings_toggled(self.settings_button.isChecked())
        self._update_summary()

    def _on_settings_toggled(self, shown: bool) -> None:
        self.settings_button.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)
        self.settings_widget.setVisible(not self.compact or shown)

    def _update_summary(self) -> None:
        s = self.session
        parts = [s.device, self.target_combo.currentText().split(" (")[0].lower(),
                 "train" if s.train else "eval", "statistics only" if s.mode == "stats" else "full tensors"]
        if s.input_grad:
            parts.append("input gradient")
        self.settings_summary.setText(" · ".join(p for p in parts if p))

    # -- running ------------------------------------------------------------------------
    def set_running(self, running: bool, message: str = "") -> None:
        """Switch between running (Cancel enabled, busy bar) and idle with ``message``."""
        self._running = running
        self._idle_message = message or None
        self.cancel_button.setEnabled(running)
        self.run_button.setEnabled(not running and self.session.can_run())
        self.run_button.setText("Running…" if running else "Run")
        if running:
            self.progress.setRange(0, 0)
            self.progress.setFormat("starting…")
        else:
            self.progress.setRange(0, 1)
            self.progress.setValue(1 if message.startswith("done") else 0)
            self.progress.setFormat(message)
            self._update_run_enabled()

    def set_progress(self, stage: str, done: int, total: int) -> None:
        if total <= 0:  # a stage of unknown length (loading, the kernels' first compile): say which
            self.progress.setRange(0, 0)
            self.progress.setFormat(f"{stage}…")
            return
        # forward is the first half of the bar, backward the second.
        half = 1000
        value = int(half * min(done, total) / total) + (half if stage == "backward" else 0)
        self.progress.setRange(0, 2 * half)
        self.progress.setValue(value)
        self.progress.setFormat(f"{stage} {done}/{total}")

    def show_progress(self, done: int, total: int, text: str) -> None:
        """A plain ``done / total`` bar with ``text`` (a run over a folder: batches and ETA)."""
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(min(done, max(total, 1)))
        self.progress.setFormat(text)

    # -- memory estimate ------------------------------------------------------------------
    def _probed_tree_for(self, sample_bytes: int) -> ModuleTree | None:
        """A tree probed with a sample of ``sample_bytes``, or None (a probe is started)."""
        s = self.session
        tree = s.tree
        if tree is not None and tree.probed and tree.call_io and tree.call_io[0].input_bytes == sample_bytes:
            return tree
        cached = self._probed_tree
        if cached is not None and s.model is not None and cached[0] is s.model.module and cached[1] == sample_bytes:
            return cached[2]
        self._start_probe(sample_bytes)
        return None

    def _start_probe(self, sample_bytes: int) -> None:
        # The session's tree was probed with another sample shape (or not at all): probe a
        # tree of our own with one sample of this batch, in a worker.
        runner = self._probe_runner
        if runner is None:
            runner = self._probe_runner = TaskRunner("estimate-probe", self)
            runner.finished.connect(self._on_probe_done)
            runner.failed.connect(self._on_probe_failed)
        s = self.session
        assert s.model is not None and s.batch is not None  # an estimate needs both
        module, x = s.model.module, s.batch.model_input[:1]
        lock = s.run_lock  # a probe's hooks must not meet a capture's

        def task(progress: Progress, cancel: threading.Event) -> tuple[torch.nn.Module, int, ModuleTree]:
            tree = ModuleTree.build(module)
            with lock:
                tree.probe(module, x)
            return module, sample_bytes, tree

        runner.start(task)
        self._show_estimate(None, "estimating…")

    def _on_probe_done(self, _gen: int, result: tuple[torch.nn.Module, int, ModuleTree], _seconds: float) -> None:
        self._probed_tree = result
        self.update_estimate()

    def _on_probe_failed(self, _gen: int, exc: BaseException) -> None:
        self._probed_tree = None
        self._show_estimate(None, "", f"The memory needed cannot be estimated: {one_line(exc)}")

    def compute_estimate(self) -> MemoryEstimate | None:
        """The estimate for the session's current settings, when a fitting probed tree is
        at hand (starts a probe in a worker otherwise and returns None)."""
        s = self.session
        if s.model is None or s.batch is None or not s.selection or s.tree is None:
            return None
        x = s.batch.tensor
        if x.dim() == 0 or len(x) == 0:
            return None
        sample_bytes = x[:1].numel() * x.element_size()
        tree = self._probed_tree_for(sample_bytes)
        if tree is None:
            return None
        selected = [n for n in s.selected_in_order() if n in tree.nodes]
        return estimate_capture_memory(tree, selected, s.mode, s.batch.model_input, s.input_grad, s.model.module)

    def budget_check(self) -> tuple[MemoryEstimate | None, str | None]:
        """The estimate for the current settings and, when it is over the memory budget,
        the warning to show (``None`` when it fits or cannot be told). The budget is the
        one the panel shows (read with its last estimate), so that the question and the
        panel name the same figure."""
        self.update_estimate(read_free_memory=False)
        return self.estimate, self.budget_message

    def update_estimate(self, read_free_memory: bool = True) -> MemoryEstimate | None:
        """Recompute the estimate and the budget warning now (also the debounced slot);
        the free memory is read again unless told not to (the check before a run keeps the
        budget the panel shows)."""
        self._estimate_timer.stop()
        try:
            estimate = self.compute_estimate()
        except (GradExplorerError, ValueError) as exc:
            self._show_estimate(None, "", f"The memory needed cannot be estimated: {exc}")
            return None
        if estimate is None:
            if self._probe_runner is None or not self._probe_runner.is_busy():
                self._show_estimate(None, "")
            else:  # a probe is under way: no warning from an estimate of other settings
                self.estimate, self.budget_message = None, None
            return None
        device = self.session.device if self.session.device != "auto" else "cpu"
        try:
            key = (device, self.session.memory_budget)
            if read_free_memory or self._budget is None or self._budget[0] != key:
                self._budget = (key, read_budget(device, self.session.memory_budget))
            short = budget_shortfall(estimate, device, budget=self._budget[1])
        except (RuntimeError, ValueError):  # a device torch cannot name: no budget to check
            short = None
        message = budget_message(estimate, short) if short is not None else None
        self.stats_only_fits = short is not None and stats_only_fits(estimate, short)
        self._show_estimate(estimate, estimate.describe().split(" (")[0], estimate.describe(), message)
        return estimate

    def _show_estimate(self, estimate: MemoryEstimate | None, text: str, tip: str = "",
                       message: str | None = None) -> None:
        self.estimate = estimate
        self.budget_message = message
        self.memory_label.setText(text)
        self.memory_label.setToolTip(tip or "What the capture will hold in memory, once a model, "
                                            "a batch and layers are chosen")
        if message:
            self.memory_label.setText(f"<span style='color:{WARNING_COLOUR}'>{text}</span>")
            self.budget_label.setText(f"<span style='color:{WARNING_COLOUR}'>{message}</span>")
        self.budget_label.setVisible(bool(message))
        self.estimate_changed.emit(estimate)
