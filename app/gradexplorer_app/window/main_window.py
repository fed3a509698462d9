"""The main window: module tree on the left, the capture views in the middle, model,
batch and run panels on the right; menus, shortcuts and the status bar.

The window is layout only. ``gradexplorer_app.window.controller.WindowController`` owns the session, the
view state and the workers and decides what happens; the window wires the panels to it
and to the shared ``gradexplorer.pipeline.view_state.ViewState``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QKeySequence, QResizeEvent, QShowEvent
from PySide6.QtWidgets import (
    QApplication,
    QGroupBox,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.base.devices import list_devices
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.inputs import Batch
from gradexplorer.pipeline.session import Session
from gradexplorer.pipeline.view_state import ViewState
from gradexplorer_app import dialogs
from gradexplorer_app.listeners import listen, report_errors
from gradexplorer_app.views.capture_views import CaptureViews
from gradexplorer_app.views.export import PLOT_FILTER
from gradexplorer_app.views.graph_view import GraphPanel, wire_graph_panel
from gradexplorer_app.window import error_dialog
from gradexplorer_app.window.application import THEME_KEY, apply_theme
from gradexplorer_app.window.batch_panel import BatchPanel
from gradexplorer_app.window.controller import WindowController
from gradexplorer_app.window.dataset_run import DatasetRun
from gradexplorer_app.window.model_panel import ModelPanel, ModelRequest
from gradexplorer_app.window.module_tree_view import ModuleTreePanel
from gradexplorer_app.window.onset_link import OnsetLinkLabel, wire_onset_link
from gradexplorer_app.window.run_panel import RunPanel
from gradexplorer_app.window.screen_fit import keep_on_screen
from gradexplorer_app.window.settings import AppSettings, RecentModel
from gradexplorer_app.window.status_bar import ElidingStatusBar

if TYPE_CHECKING:  # annotations only (both are imported on first use)
    from gradexplorer_app.window.compare_window import CompareWindow
    from gradexplorer_app.window.timeline_window import TimelineWindow

DEFAULT_SIZE = QSize(1500, 950)


def _move_tabs(panels: tuple[QWidget, ...], source: QTabWidget, target: QTabWidget) -> None:
    """Move ``panels`` from one tab widget to another, with their tab labels."""
    for panel in panels:
        index = source.indexOf(panel)
        label = source.tabText(index)
        source.removeTab(index)
        target.addTab(panel, label)


class _FoldingCentral(QWidget):
    """The main window's central area. Its minimum width is what it needs with the side
    panel folded into the Modules panel (``MainWindow.fit_panels``), so that the window can
    be made that narrow (half a 1920 screen) even while the three panels stand side by side:
    they fold as soon as it is narrower than they need."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self._window = window

    def minimumSizeHint(self) -> QSize:  # Qt's name
        hint = super().minimumSizeHint()
        window = self._window
        if window.folded or not window.can_fold():
            return hint
        return QSize(min(hint.width(), window.folded_width()), hint.height())


def about_text() -> str:
    """Help ▸ About: what gradexplorer is, its version and those of torch and Qt."""
    # The version from the distribution's metadata, as gradexplorer.__version__ reads it:
    # importing the front door here would make the window import it (an import cycle
    # through gradexplorer.explore, which opens this window).
    from importlib import metadata

    import PySide6
    import torch

    return (f"<b>gradexplorer {metadata.version('gradexplorer')}</b><br>See the gradients inside a "
            "PyTorch model: per-layer capture, heatmaps, histograms, gradient flow and Grad-CAM.<br><br>"
            f"torch {torch.__version__} · PySide6 {PySide6.__version__}<br>"
            "Keyboard shortcuts: Help ▸ Keyboard shortcuts (F1).")


class MainWindow(QMainWindow):
    """gradexplorer's window: the panels, their layout, menus and status bar.

    The controller's signals and actions are reachable from here too (``run_done``,
    ``load_model()``, ``run()``...), for scripts and tests that drive the window.
    """

    #: The answers of the over-budget question.
    STATS_ONLY = WindowController.STATS_ONLY
    RUN_ANYWAY = WindowController.RUN_ANYWAY

    def __init__(self, session: Session | None = None, settings: AppSettings | None = None,
                 devices: list | None = None, restore_geometry: bool = True) -> None:
        super().__init__()
        self.session = session or Session()
        self.settings = settings or AppSettings()
        if devices is None:
            devices = list_devices()
        self.devices = devices
        self.view_state = ViewState()
        self.timeline_windows: list[TimelineWindow] = []
        self.compare_windows: list[CompareWindow] = []
        #: The width each closed side panel reopens at, by its index in the splitter.
        self._panel_widths: dict[int, int] = {}
        #: Failures of listeners already shown in a dialog (``_on_listener_failed``).
        self._listener_failures: set[str] = set()
        self.setWindowTitle("gradexplorer")
        self.resize(DEFAULT_SIZE)

        self._build_panels(devices)
        self._expose_controller()
        self._build_module_box()
        self._build_side_panel()
        self._build_central()
        self._build_status_bar()
        self._build_menus()
        self._connect()
        if restore_geometry:
            self._restore_geometry()
        self._update_status()
        # The model list (torchvision's catalog) is read when it is first shown.
        self.model_panel.first_shown.connect(self.controller.start)

    # -- construction ---------------------------------------------------------------------
    def _build_panels(self, devices: list) -> None:
        """The module tree, the views, the model, batch and run panels, and their controller."""
        s = self.session
        self.tree_panel = ModuleTreePanel(s, self)
        self.tree_view = self.tree_panel.view
        self.views = CaptureViews(self, state=self.view_state)
        # An explicit minimum: the views' own hint grows with long labels after a run,
        # which would squeeze the tree and panels of a 1500 px window.
        self.views.setMinimumWidth(520)
        self.views.files_read = self.session.files_read  # a plot's export never goes over them
        self.model_panel = ModelPanel(s, self.settings, self)
        self.batch_panel = BatchPanel(s, self.settings, self)
        self.run_panel = RunPanel(s, devices, self)
        self.controller = WindowController(s, self.settings, self.view_state, self, self.run_panel)
        self.dataset_run = DatasetRun(self, self)  # Run ▸ Run over folder… (app/gradexplorer_app/window/dataset_run.py)

    def _expose_controller(self) -> None:
        """The controller's signals and actions, under the window's names."""
        c = self.controller
        self.model_loaded, self.batch_loaded, self.run_done = c.model_loaded, c.batch_loaded, c.run_done
        self.error_shown, self.file_done = c.error_shown, c.file_done
        self.run_runner = c.run_runner
        self.load_model, self.load_inputs, self.run, self.cancel = c.load_model, c.load_inputs, c.run, c.cancel
        self.open_capture, self.export_capture, self.show_error = c.open_capture, c.export_capture, c.show_error

    def _build_module_box(self) -> None:
        """The Modules panel: the module tree and the model graph side by side in tabs."""
        tree_box = self.tree_box = QGroupBox("Modules", self)
        # An explicit minimum, as for the views: the hints of the tree's buttons, header and
        # graph status add up past what a 1280 px screen leaves beside the views and panels.
        tree_box.setMinimumWidth(320)
        # The module tree and the model graph (app/gradexplorer_app/views/graph_view.py) side by side in tabs.
        self.graph_panel = GraphPanel(self)
        self.module_tabs = QTabWidget(tree_box)
        self.module_tabs.addTab(self.tree_panel, "Tree")
        self.module_tabs.addTab(self.graph_panel, "Graph")
        self.tree_box_layout = QVBoxLayout(tree_box)
        self.tree_box_layout.addWidget(self.module_tabs, 1)

    def _build_side_panel(self) -> None:
        """The input batch and model tabs over the Run box."""
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.batch_panel, "Input batch")
        self.tabs.addTab(self.model_panel, "Model")
        run_box = self.run_box = QGroupBox("Run", self)
        QVBoxLayout(run_box).addWidget(self.run_panel)
        right = self.side_panel = QWidget(self)
        right_layout = self.side_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.setSpacing(8)
        right_layout.addWidget(self.tabs, 1)
        right_layout.addWidget(run_box, 0)
        #: The side panel folded into the Modules panel (a narrow window: half a 1920 screen).
        self.folded = False

    def _build_central(self) -> None:
        """Modules | views | side panel, in a splitter."""
        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.splitter.addWidget(self.tree_box)
        self.splitter.addWidget(self.views)
        self.splitter.addWidget(self.side_panel)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setStretchFactor(2, 0)
        self.splitter.setSizes([500, 640, 360])
        self.splitter.setChildrenCollapsible(False)
        container = _FoldingCentral(self)
        outer = self.central_layout = QVBoxLayout(container)
        outer.setContentsMargins(8, 8, 8, 4)
        outer.addWidget(self.splitter)
        self.setCentralWidget(container)
    def _build_status_bar(self) -> None:
        bar = ElidingStatusBar(self)
        self.setStatusBar(bar)
        self.status_model = QLabel(self)
        self.status_device = QLabel(self)
        self.status_run = QLabel(self)
        self.file_progress = QProgressBar(self)
        self.file_progress.setMaximumWidth(160)
        self.file_progress.setRange(0, 0)
        self.file_progress.setVisible(False)
        # Offered once a run over a folder has finished: its per-batch series.
        self.dataset_timeline_button = QPushButton("Timeline of the dataset run", self)
        self.dataset_timeline_button.setVisible(False)
        self.dataset_timeline_button.clicked.connect(lambda: self.dataset_run.open_timeline())
        # Where NaN/Inf began, as links that select that layer and call (app/gradexplorer_app/window/onset_link.py).
        self.onset_link = OnsetLinkLabel(self)
        for w in (self.onset_link, self.dataset_timeline_button, self.file_progress, self.status_model,
                  self.status_device, self.status_run):
            bar.addPermanentWidget(w)

    def _action(self, text: str, slot: Callable[[], object],
                shortcut: str | QKeySequence.StandardKey | None = None, tip: str = "") -> QAction:
        """An action of this window; its shortcut works in any of the app's windows unless narrowed."""
        a = QAction(text, self)
        if shortcut is not None:
            a.setShortcut(QKeySequence(shortcut))
            a.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        if tip:
            a.setStatusTip(tip)
        a.triggered.connect(slot)
        return a

    def _build_menus(self) -> None:
        self._build_file_actions()
        self._build_run_actions()
        self._build_view_actions()
        self._build_file_menu()
        self._build_run_menu()
        self._build_view_menu()
        menu = self.menuBar().addMenu("&Help")
        menu.addAction(self.shortcuts_action)
        menu.addAction("About gradexplorer", self._about)
        self._update_actions()

    def _build_file_actions(self) -> None:
        """Opening and exporting, closing and quitting."""
        action, c = self._action, self.controller
        self.open_images_action = action("Open &images…", self.batch_panel.open_images, "Ctrl+I")
        self.open_capture_action = action("&Open capture…", lambda: c.open_capture(), QKeySequence.StandardKey.Open,
                                          "Open a .pt capture and browse it without the model")
        self.export_capture_action = action(
            "&Export capture…", lambda: c.export_capture(), QKeySequence.StandardKey.Save,
            "Save the captured gradients as .pt (torch.load(weights_only=True) opens it)")
        self.open_timeline_action = action("Open &timeline…", lambda: self.open_timeline(), "Ctrl+T",
                                           "Open a watch log (.gxw) or a dataset capture: layers x steps")
        self.export_png_action = action("Export &plot (PNG, SVG)…", lambda: self.export_png(), "Ctrl+Shift+P",
                                        "The plot shown, under a title line: PNG at twice the screen's "
                                        "resolution, or SVG")
        self.export_csv_action = action("Export statistics as &CSV…", lambda: self.export_csv(), "Ctrl+Shift+C")
        self.quit_action = action("&Quit", self.close, "Ctrl+Q")

    def _build_run_actions(self) -> None:
        """Run and Cancel, the run over a folder, and Compare with…."""
        action, c = self._action, self.controller
        self.run_action = action("&Run", c.run, "Ctrl+R", "Run forward and backward, capture the checked layers")
        self.cancel_action = action("&Cancel", c.cancel, "Esc")
        self.cancel_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.run_folder_action = action("Run over &folder…", lambda: self.dataset_run.run_over_folder(),
                                        "Ctrl+Shift+R", "Capture statistics over every image of a folder, "
                                        "batch by batch, merged exactly (statistics only)")
        self.dataset_timeline_action = action("&Timeline of the dataset run", lambda: self.dataset_run.open_timeline(),
                                              "Ctrl+Shift+T", "Each batch's statistics of the last run over a folder")
        self.compare_action = action("Compare &with…", lambda: self.compare_with(), "Ctrl+D",
                                     "Compare this capture with another run (bf16, weights, input...) or a file")

    def _build_view_actions(self) -> None:
        """The filter, the model tab, Close window, the shortcuts, the side panels and the views' tabs."""
        action = self._action
        self.filter_action = action("&Filter modules", lambda: self.tree_panel.filter_edit.setFocus(),
                                    QKeySequence.StandardKey.Find)
        self.model_tab_action = action("Choose &model…", self._show_model_tab, "Ctrl+M")
        self.close_action = action("&Close window", self.close, "Ctrl+W")
        # This window's own: the compare and timeline windows have a Ctrl+W of their own.
        self.close_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.shortcuts_action = action("&Keyboard shortcuts", self._show_shortcuts, "F1")
        # The side panels close and reopen (as napari's docks do): the views take their room,
        # and the window can be narrower than the three side by side.
        self.tree_panel_action = self._panel_action("&Modules panel", self.tree_box, "Ctrl+Shift+M")
        self.side_panel_action = self._panel_action("&Input, model and run panel", self.side_panel, "Ctrl+Shift+I")
        # Ctrl+1..9: the views' tabs, in their order (Heatmap, Grad-CAM, ...).
        self.view_actions = []
        for i in range(min(9, self.views.tabs.count())):
            a = action(f"&{i + 1} {self.views.tabs.tabText(i)}", self._show_tab(i), f"Ctrl+{i + 1}")
            a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            self.view_actions.append(a)

    def _build_file_menu(self) -> None:
        menu = self.menuBar().addMenu("&File")
        menu.addAction(self.model_tab_action)
        menu.addAction(self.open_images_action)
        self.recent_menu = menu.addMenu("Recent models")
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        menu.addSeparator()
        menu.addAction(self.open_capture_action)
        self.recent_captures_menu = menu.addMenu("Recent captures")
        self.recent_captures_menu.aboutToShow.connect(self._fill_recent_captures_menu)
        menu.addAction(self.open_timeline_action)
        menu.addAction(self.export_capture_action)
        menu.addAction(self.export_png_action)
        menu.addAction(self.export_csv_action)
        menu.addSeparator()
        menu.addAction(self.close_action)
        menu.addAction(self.quit_action)

    def _build_run_menu(self) -> None:
        menu = self.menuBar().addMenu("&Run")
        menu.addAction(self.run_action)
        menu.addAction(self.cancel_action)
        menu.addSeparator()
        menu.addAction(self.run_folder_action)
        menu.addAction(self.dataset_timeline_action)
        menu.addSeparator()
        menu.addAction(self.compare_action)

    def _build_view_menu(self) -> None:
        menu = self.menuBar().addMenu("&View")
        menu.addAction(self.tree_panel_action)
        menu.addAction(self.side_panel_action)
        menu.addSeparator()
        menu.addAction(self.filter_action)
        menu.addAction("Expand all modules", self.tree_view.expandAll)
        menu.addAction("Collapse modules", self.tree_view.collapse_to_top)
        menu.addSeparator()
        for a in self.view_actions:
            menu.addAction(a)
        menu.addSeparator()
        self.theme_menu = menu.addMenu("&Theme")
        self.theme_actions: dict[str, QAction] = {}
        group = QActionGroup(self)
        current = self.settings.value(THEME_KEY, str, "system")
        for theme, text in (("system", "&System (follow the desktop)"), ("light", "&Light"), ("dark", "&Dark")):
            a = self.theme_menu.addAction(text)
            a.setCheckable(True)
            a.setChecked(theme == current)
            a.triggered.connect(lambda _checked=False, t=theme: self.set_theme(t))
            group.addAction(a)
            self.theme_actions[theme] = a

    def _connect(self) -> None:
        s, c, state = self.session, self.controller, self.view_state
        # widgets -> controller
        self.run_panel.run_requested.connect(c.run)
        self.run_panel.cancel_requested.connect(c.cancel)
        self.run_panel.cancel_requested.connect(self.dataset_run.cancel)
        self.cancel_action.triggered.connect(self.dataset_run.cancel)
        self.dataset_run.done.connect(lambda _outcome: self._update_status())
        self.model_panel.load_requested.connect(c.request_model)
        self.model_panel.cancel_requested.connect(c.cancel_model_load)
        self.batch_panel.load_requested.connect(c.load_inputs)
        self.batch_panel.sample_selected.connect(c.select_sample)
        self.tree_view.layer_activated.connect(c.select_layer)
        self.views.layer_clicked.connect(c.select_layer)
        # view state -> widgets that are not views
        listen(state.events.layer, self._on_model_layer_changed)
        listen(state.events.sample, self.batch_panel.show_sample)
        # controller -> widgets
        c.status.connect(lambda text, ms: self.statusBar().showMessage(text, ms))
        c.model_busy.connect(self.model_panel.set_busy)
        c.model_progress.connect(self.model_panel.set_progress)
        c.run_busy.connect(self.run_panel.set_running)
        c.run_progress.connect(self.run_panel.set_progress)
        c.file_busy.connect(self.file_progress.setVisible)
        c.catalog_ready.connect(self.model_panel.set_catalog)
        c.capture_shown.connect(self._on_capture_shown)
        c.view_requested.connect(self.views.show_view)
        c.block_shown.connect(self.views.set_block)
        c.batch_loaded.connect(lambda: self.show_panel(self.batch_panel))
        c.run_done.connect(lambda _outcome: self._update_status())
        c.file_done.connect(lambda _kind: self._update_status())
        # session -> status bar
        listen(s.batch_changed, lambda _b: self._update_status())
        listen(s.model_changed, lambda _m: self._update_status())
        listen(s.settings_changed, lambda _n: self._update_status())
        listen(s.selection_changed, lambda _n: self._update_actions())
        wire_graph_panel(self.graph_panel, s, state, c, self.tree_view)
        wire_onset_link(self.onset_link, self)
        # A listener of the session or the view state that raises: a message, and the change
        # that emitted completes (gradexplorer_app.listeners).
        report_errors(s, self._on_listener_failed)
        report_errors(state, self._on_listener_failed)

    def _on_listener_failed(self, exc: BaseException) -> None:
        # Said once in a dialog; the same failure again (it may recur at every change of
        # layer) goes to the status bar only.
        line = error_dialog.one_line(exc)
        if line in self._listener_failures:
            self.statusBar().showMessage(f"Part of the window was not updated: {line}", 15000)
            return
        self._listener_failures.add(line)
        self.controller.show_error("Part of the window was not updated", exc)

    def _restore_geometry(self) -> None:
        geometry = self.settings.geometry()
        if geometry is not None:
            self.restoreGeometry(geometry)
        sizes = self.settings.value("window/splitter", list, [])
        try:
            if len(sizes) == 3:
                self.splitter.setSizes([int(v) for v in sizes])
        except ValueError:
            pass
        hidden = self.settings.value("window/hidden_panels", list, [])
        for action, name in ((self.tree_panel_action, "modules"), (self.side_panel_action, "side")):
            if name in hidden:
                action.setChecked(False)
        keep_on_screen(self)  # the saved geometry, or the default size on a smaller screen

    # -- side panels ---------------------------------------------------------------------------
    def _panel_action(self, text: str, panel: QWidget, shortcut: str) -> QAction:
        a = QAction(text, self)
        a.setCheckable(True)
        a.setChecked(True)
        a.setShortcut(QKeySequence(shortcut))
        a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        a.toggled.connect(lambda shown: self.set_panel_shown(panel, shown))
        self.addAction(a)
        return a

    def set_panel_shown(self, panel: QWidget, shown: bool) -> None:
        """Close or reopen a side panel (``tree_box`` or ``side_panel``); the views give or
        take its room, and it reopens at the width it had."""
        action = self.tree_panel_action if panel is self.tree_box else self.side_panel_action
        if action.isChecked() != shown:
            action.setChecked(shown)  # comes back here through toggled
            return
        if self.folded:
            self.set_folded(False)  # the side panel's own place first; folded again below if need be
        if panel.isHidden() != shown:
            self.fit_panels()
            return
        index = self.splitter.indexOf(panel)
        sizes = self.splitter.sizes()
        if not shown:
            self._panel_widths[index] = sizes[index]
            panel.hide()
        else:
            want = max(self._panel_widths.get(index, 0), panel.minimumSizeHint().width(), panel.minimumWidth())
            panel.show()
            sizes[index] = want
            sizes[1] = max(sizes[1] - want, self.views.minimumWidth())
            self.splitter.setSizes(sizes)
        self._settle_layouts()
        self.fit_panels()

    def _settle_layouts(self) -> None:
        # The window's minimum follows now, not at the layouts' next turn: a resize right
        # after closing a panel would still be held to the wider minimum. The layouts keep
        # each widget's size hints until it says they changed.
        for widget in (self.tree_box, self.side_panel, self.splitter, self.centralWidget()):
            if widget is not None:
                widget.updateGeometry()
        for layout in (self.central_layout, self.layout()):
            if layout is not None:
                layout.invalidate()
                layout.activate()

    # -- folding the side panel into the Modules panel ------------------------------------------
    #: Once folded, the side panel unfolds at this many pixels more than the three panels
    #: need side by side (no flicker between the two at one width).
    UNFOLD_MARGIN = 24

    def can_fold(self) -> bool:
        """Whether the side panel may fold: both it and the Modules panel are open."""
        return self.tree_panel_action.isChecked() and self.side_panel_action.isChecked()

    def side_by_side_width(self) -> int:
        """The narrowest the central area can be with the three panels side by side."""
        views = max(self.views.minimumWidth(), self.views.minimumSizeHint().width())
        tree = max(self.tree_box.minimumWidth(), self.module_tabs.minimumSizeHint().width())
        side = max(w.minimumSizeHint().width() for w in (self.batch_panel, self.model_panel, self.run_box))
        margins = self.central_layout.contentsMargins()
        return tree + views + side + 16 + 2 * self.splitter.handleWidth() + margins.left() + margins.right()

    def folded_width(self) -> int:
        """The narrowest the central area can be with the side panel folded."""
        return self.side_by_side_width() - max(
            w.minimumSizeHint().width() for w in (self.batch_panel, self.model_panel, self.run_box)) \
            - 16 - self.splitter.handleWidth()

    def fit_panels(self) -> None:
        """Fold the side panel into the Modules panel when the window is too narrow for the
        three side by side (Input batch and Model become tabs beside Tree and Graph, Run
        sits under them), and unfold it when there is room again."""
        central = self.centralWidget()
        if central is None or not hasattr(self, "side_panel_action"):
            return
        width = central.width()
        need = self.side_by_side_width()
        fold = self.can_fold() and (width < need + (self.UNFOLD_MARGIN if self.folded else 0))
        if fold != self.folded:
            self.set_folded(fold)

    def set_folded(self, folded: bool) -> None:
        """Move Input batch, Model and Run into the Modules panel (True) or back beside the
        views (False); the tab the user was on stays in front."""
        if folded == self.folded:
            return
        self.folded = folded
        # The Modules panel's tab stays in front: the tree (or graph) the user was on.
        current = self.module_tabs.currentWidget()
        size = self.size()
        if folded:
            sizes = self.splitter.sizes()
            if self.side_panel.isVisible():
                self._panel_widths[2] = sizes[2]
            # Hidden first: while the panels move, the three side by side would otherwise
            # set the window's minimum (and widen the window back).
            self.side_panel.hide()
            _move_tabs((self.batch_panel, self.model_panel), self.tabs, self.module_tabs)
            self.tree_box_layout.addWidget(self.run_box, 0)
            self.run_panel.set_compact(True)  # its settings behind one line: the tree keeps its height
            self.tree_box.setTitle("")
        else:
            _move_tabs((self.batch_panel, self.model_panel), self.module_tabs, self.tabs)
            self.side_layout.addWidget(self.run_box, 0)
            self.run_panel.set_compact(False)
            self.tree_box.setTitle("Modules")
            if self.side_panel_action.isChecked():
                self.side_panel.show()
                sizes = self.splitter.sizes()
                sizes[2] = max(self._panel_widths.get(2, 0), self.side_panel.minimumSizeHint().width())
                self.splitter.setSizes(sizes)
            if current in (self.batch_panel, self.model_panel):
                self.tabs.setCurrentWidget(current)
                current = self.tree_panel
        if current is not None:
            self.module_tabs.setCurrentWidget(current)
        self._settle_layouts()
        if self.size() != size and not self.isMaximized() and not self.isFullScreen():
            self.resize(size.expandedTo(self.minimumSizeHint()))

    def show_panel(self, panel: QWidget) -> None:
        """Bring a panel's tab to the front, wherever it is (beside the views or folded)."""
        for tabs in (self.tabs, self.module_tabs):
            if tabs.indexOf(panel) >= 0:
                tabs.setCurrentWidget(panel)
                return

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.fit_panels()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.fit_panels()

    def _splitter_sizes(self) -> list[int]:
        """The splitter's sizes, a closed (or folded) panel at the width it reopens at."""
        sizes = self.splitter.sizes()
        for index, panel in ((0, self.tree_box), (2, self.side_panel)):
            if panel.isHidden():
                sizes[index] = self._panel_widths.get(index, sizes[index])
        return sizes

    # -- following the controller and the view state ------------------------------------------
    def _on_capture_shown(self, capture: Capture | None, batch: Batch | None) -> None:
        self.views.set_capture(capture, batch)
        self._update_status()

    def _on_model_layer_changed(self, name: str | None) -> None:
        # The tree's current row follows the views' layer. Selecting the row announces it
        # (layer_activated); the controller finds the state already there and stops. A
        # block shown through the last call inside it keeps its own row (the keys then
        # move on from the block, not from inside it).
        current = self.tree_view.current_name()
        shown = self.controller.shown_for
        if shown is not None and shown[0] == current and shown[1] == name:
            return
        if name and name != current:
            self.tree_view.select_layer(name)

    # -- status --------------------------------------------------------------------------
    def _update_status(self) -> None:
        s = self.session
        if s.capture is not None and s.capture_path:
            # A capture opened from a file is what the window shows, even with a model loaded.
            self.setWindowTitle(f"gradexplorer — {Path(s.capture_path).name}")
        elif s.model is not None:
            self.setWindowTitle(f"gradexplorer — {s.model.name}")
        if s.model is not None:
            self.status_model.setText(f"  {s.model.name}  ")
        elif s.capture is not None:
            name = s.capture.meta.get("model_name") or s.capture.meta.get("model") or "capture"
            self.status_model.setText(f"  {name} (from file, no model)  ")
            if not s.capture_path:
                self.setWindowTitle(f"gradexplorer — {name}")
        else:
            self.status_model.setText("  no model  ")
            self.setWindowTitle("gradexplorer")
        self.status_device.setText(f"  device: {s.device}  ")
        if s.capture is not None and s.last_run_seconds is not None and s.capture_path is None:
            self.status_run.setText(f"  last run: {s.last_run_seconds:.2f} s, {len(s.capture)} layers  ")
        elif s.capture is not None and s.capture_path:
            self.status_run.setText(f"  opened {Path(s.capture_path).name}  ")
        else:
            self.status_run.setText("  not run yet  ")
        self._update_actions()

    def _update_actions(self) -> None:
        has_capture = self.session.capture is not None
        for a in (self.export_capture_action, self.export_png_action, self.export_csv_action, self.compare_action):
            a.setEnabled(has_capture)
        self.run_action.setEnabled(self.session.can_run())
        self.run_folder_action.setEnabled(self.session.model is not None)
        self.dataset_timeline_action.setEnabled(self.dataset_run.result is not None)
        self.dataset_timeline_button.setVisible(self.dataset_run.result is not None)

    def set_theme(self, theme: str) -> None:
        """View ▸ Theme: the palette and style of every window now, and at the next start."""
        app = QApplication.instance()
        if isinstance(app, QApplication):
            apply_theme(app, theme)
        self.settings.set_value(THEME_KEY, theme)
        self.theme_actions[theme].setChecked(True)

    def compare_with(self) -> CompareWindow | None:
        """Compare with…: ask for B (another run or a file) and open a compare window."""
        # Imported on first use: the comparison's modules are not needed to start the window.
        from gradexplorer_app.window.compare_window import compare_with

        self.compare_window = compare_with(self, self.session, [d.name for d in self.devices])
        if self.compare_window is not None:
            self.compare_windows.append(self.compare_window)
        return self.compare_window

    # -- exports of what the views show -------------------------------------------------------------
    def export_png(self, path: str | None = None) -> None:
        """Export the plot shown (PNG or SVG, by the suffix), under a title line; the name
        offered says the model, layer and view."""
        path = path or dialogs.ask_save_file(self, "Export plot", self.views.export_file_name(), PLOT_FILTER)
        if path:
            try:
                self.views.export_png(path, inputs=self.session.files_read())
                self.statusBar().showMessage(f"Saved {path}.", 8000)
            except Exception as exc:  # noqa: BLE001 - shown to the user, window stays usable
                self.show_error("The plot cannot be exported", exc)

    def export_csv(self, path: str | None = None) -> None:
        path = path or dialogs.ask_save_file(self, "Export statistics as CSV", "statistics.csv", "CSV files (*.csv)")
        if path:
            try:
                self.views.export_csv(path, inputs=self.session.files_read())
                self.statusBar().showMessage(f"Saved {path}.", 8000)
            except Exception as exc:  # noqa: BLE001
                self.show_error("The statistics cannot be exported", exc)

    # -- misc ------------------------------------------------------------------------------------------
    def _show_model_tab(self) -> None:
        self.show_panel(self.model_panel)
        self.model_panel.focus_search()

    def _show_tab(self, index: int) -> Callable[[], object]:
        return lambda: self.views.tabs.setCurrentIndex(index)

    def _request_recent(self, entry: RecentModel) -> Callable[[], object]:
        return lambda: self.controller.request_model(ModelRequest(entry.spec, entry.weights, entry.arch))

    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        for entry in self.settings.recent_model_entries():
            weights = entry.weights or "random init"
            if entry.weights and ("/" in entry.weights or "\\" in entry.weights):  # a file, not an enum name
                weights = f"file {Path(entry.weights).name}"
            text = f"{entry.spec}  ({weights}{', ' + entry.arch if entry.arch else ''})"
            self.recent_menu.addAction(text, self._request_recent(entry))
        if self.recent_menu.isEmpty():
            self.recent_menu.addAction("(none yet)").setEnabled(False)

    def _open_recent_capture(self, path: str) -> Callable[[], object]:
        return lambda: self.controller.open_capture(path)

    def _fill_recent_captures_menu(self) -> None:
        self.recent_captures_menu.clear()
        for path in self.settings.recent_captures():
            self.recent_captures_menu.addAction(path, self._open_recent_capture(path))
        if self.recent_captures_menu.isEmpty():
            self.recent_captures_menu.addAction("(none yet)").setEnabled(False)

    def _about(self) -> None:
        QMessageBox.about(self, "About gradexplorer", about_text())

    def shortcut_list(self) -> list[tuple[str, str]]:
        """``(keys, what)`` of every menu action with a shortcut, as the menus show them."""
        rows = []
        for menu_action in self.menuBar().actions():
            menu = menu_action.menu()
            for a in menu.actions() if isinstance(menu, QMenu) else []:
                keys = a.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
                if keys:
                    rows.append((keys, a.text().replace("&", "").rstrip("…")))
        return rows

    def _show_shortcuts(self) -> None:
        rows = "".join(f"<tr><td><b>{keys}</b>&nbsp;&nbsp;</td><td>{what}</td></tr>"
                       for keys, what in self.shortcut_list())
        QMessageBox.information(self, "gradexplorer: keyboard shortcuts",
                                f"<table>{rows}</table><p>The compare and timeline windows close with "
                                "Ctrl+W; the timeline also with Esc.</p>")

    def open_timeline(self, path: str | None = None) -> TimelineWindow | None:
        """Open a watch log or dataset capture in a timeline window of its own."""
        # Imported on first use: the timeline's modules are not needed to start the window.
        from gradexplorer_app.window.timeline_window import TIMELINE_FILTER, TimelineWindow

        path = path or dialogs.ask_open_file(self, "Open timeline", TIMELINE_FILTER)
        if not path:
            return None
        window = TimelineWindow(path, self)
        self.timeline_windows.append(window)
        window.show()
        return window

    def shutdown(self) -> None:
        """Cancel every worker and wait for them (on close, and at the end of tests)."""
        # The capture first: the other panels' waits must not wait on a run still going.
        self.dataset_run.runner.cancel()
        self.controller.shutdown()
        self.dataset_run.shutdown()
        self.graph_panel.shutdown()
        for window in self.timeline_windows:
            window.view.shutdown()
        for compare in self.compare_windows:
            compare.shutdown()

    def closeEvent(self, event: QCloseEvent) -> None:
        running = ("A run" if self.controller.is_running()
                   else "A run over a folder" if self.dataset_run.runner.is_busy() else None)
        if running and not self.controller.unattended and not dialogs.confirm_close_during_run(self, running):
            event.ignore()
            return
        self.settings.set_geometry(self.saveGeometry())
        self.settings.set_value("window/splitter", [str(v) for v in self._splitter_sizes()])
        self.settings.set_value("window/hidden_panels", [name for name, action in
                                                         (("modules", self.tree_panel_action),
                                                          ("side", self.side_panel_action))
                                                         if not action.isChecked()])
        self.settings.sync()
        self.shutdown()
        super().closeEvent(event)
