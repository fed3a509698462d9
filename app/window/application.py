"""The QApplication with gradexplorer's look: one style sheet, one palette, pyqtgraph's
options. Both windows start through it: the main window (``launch``) and the timeline
(``timeline_window``).
"""

from __future__ import annotations

import sys

import pyqtgraph as pg
from PySide6.QtGui import QColor, QFont, QPalette
from PySide6.QtWidgets import QApplication

STYLE_SHEET = """
QGroupBox { font-weight: 600; border: 1px solid #d6dae1; border-radius: 6px; margin-top: 10px;
            padding: 6px 6px 4px 6px; background: #ffffff; }
QGroupBox::title { subcontrol-origin: margin; left: 10px; padding: 0 4px; color: #374151; }
QTabWidget::pane { border: 1px solid #d6dae1; border-radius: 6px; background: #ffffff; top: -1px; }
QTabBar::tab { padding: 6px 14px; border: 1px solid #d6dae1; border-bottom: none; background: #eef1f5;
               border-top-left-radius: 5px; border-top-right-radius: 5px; margin-right: 2px; color: #374151; }
QTabBar::tab:selected { background: #ffffff; color: #111827; font-weight: 600; }
QPushButton#runButton, QPushButton#primaryButton { background: #2563eb; color: white; border: 1px solid #1d4ed8;
               border-radius: 5px; font-weight: 600; padding: 5px 14px; }
QPushButton#runButton:hover, QPushButton#primaryButton:hover { background: #1d4ed8; }
QPushButton#runButton:disabled, QPushButton#primaryButton:disabled { background: #93b4ee; border-color: #93b4ee; }
QLabel#hint { color: #6b7280; font-size: 9pt; }
QLabel#treeSummary { color: #4b5563; font-size: 9pt; padding: 2px; }
QLabel#currentModel { padding: 4px 2px; }
QStatusBar { background: #eef1f5; border-top: 1px solid #d6dae1; }
QStatusBar QLabel { color: #374151; border-left: 1px solid #d6dae1; }
QTreeView, QListWidget, QTreeWidget { border: 1px solid #d6dae1; border-radius: 4px; background: #ffffff;
               alternate-background-color: #f7f9fb; }
QHeaderView::section { background: #f3f5f8; border: none; border-right: 1px solid #e3e6eb;
               border-bottom: 1px solid #d6dae1; padding: 4px 6px; color: #374151; font-weight: 600; }
QSplitter::handle { background: transparent; }
QProgressBar { border: 1px solid #d6dae1; border-radius: 4px; background: #f3f5f8; text-align: center; height: 16px; }
QProgressBar::chunk { background: #60a5fa; border-radius: 3px; }
"""


def _palette() -> QPalette:
    p = QPalette()
    window = QColor("#f4f6f9")
    p.setColor(QPalette.ColorRole.Window, window)
    p.setColor(QPalette.ColorRole.WindowText, QColor("#111827"))
    p.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.AlternateBase, QColor("#f7f9fb"))
    p.setColor(QPalette.ColorRole.Text, QColor("#111827"))
    p.setColor(QPalette.ColorRole.Button, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.ButtonText, QColor("#111827"))
    p.setColor(QPalette.ColorRole.Highlight, QColor("#cfe0fb"))
    p.setColor(QPalette.ColorRole.HighlightedText, QColor("#0b1f44"))
    p.setColor(QPalette.ColorRole.ToolTipBase, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.ToolTipText, QColor("#111827"))
    p.setColor(QPalette.ColorRole.PlaceholderText, QColor("#9ca3af"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#9ca3af"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#9ca3af"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText, QColor("#9ca3af"))
    return p


def setup_application(argv: list[str] | None = None) -> QApplication:
    """The QApplication with gradexplorer's look (created once; reused when it exists)."""
    pg.setConfigOptions(imageAxisOrder="row-major", antialias=True, background="w", foreground="k")
    existing = QApplication.instance()  # a QCoreApplication to the type checker
    app = existing if isinstance(existing, QApplication) else QApplication(
        argv if argv is not None else [sys.argv[0]])
    app.setApplicationName("gradexplorer")
    app.setOrganizationName("gradexplorer")
    app.setStyle("Fusion")
    app.setPalette(_palette())
    font = QFont(app.font())
    if font.pointSizeF() < 9.5:
        font.setPointSizeF(9.5)
    app.setFont(font)
    app.setStyleSheet(STYLE_SHEET)
    return app
