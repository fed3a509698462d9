"""The QApplication with gradexplorer's look: one style sheet, one palette, pyqtgraph's
options. Every window starts through it: the main window (``launch``), the timeline
(``timeline_window``) and ``gradexplorer.explore``.

The look follows a theme (View ▸ Theme, kept in the settings): ``system`` takes the
desktop's colour scheme (a dark desktop gets the dark palette; the light palette
otherwise), ``light`` and ``dark`` choose one. The style sheet names palette roles, not
colours, so that one sheet serves both palettes. Plots keep a white background in every
theme, as the figures they export do.
"""

from __future__ import annotations

import sys

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from gradexplorer_app.window.settings import AppSettings

#: The themes View ▸ Theme offers.
THEMES = ("system", "light", "dark")
THEME_KEY = "view/theme"

STYLE_SHEET = """
QGroupBox { font-weight: 600; border: 1px solid palette(mid); border-radius: 6px; margin-top: 10px;
            padding: 6px 6px 4px 6px; background: palette(base); }
QGroupBox::title { subcontrol-origin: margin; left: 10px; padding: 0 4px; color: palette(window-text); }
QTabWidget::pane { border: 1px solid palette(mid); border-radius: 6px; background: palette(base); top: -1px; }
QTabBar::tab { padding: 6px 14px; border: 1px solid palette(mid); border-bottom: none; background: palette(window);
               border-top-left-radius: 5px; border-top-right-radius: 5px; margin-right: 2px;
               color: palette(window-text); }
QTabBar::tab:selected { background: palette(base); color: palette(text); font-weight: 600; }
QPushButton#runButton, QPushButton#primaryButton { background: #2563eb; color: white; border: 1px solid #1d4ed8;
               border-radius: 5px; font-weight: 600; padding: 5px 14px; }
QPushButton#runButton:hover, QPushButton#primaryButton:hover { background: #1d4ed8; }
QPushButton#runButton:disabled, QPushButton#primaryButton:disabled { background: #93b4ee; border-color: #93b4ee; }
QLabel#hint { color: palette(placeholder-text); font-size: 9pt; }
QLabel#treeSummary { color: palette(placeholder-text); font-size: 9pt; padding: 2px; }
QLabel#currentModel { padding: 4px 2px; }
QStatusBar { background: palette(window); border-top: 1px solid palette(mid); }
QStatusBar QLabel { color: palette(window-text); border-left: 1px solid palette(mid); }
QTreeView, QListWidget, QTreeWidget { border: 1px solid palette(mid); border-radius: 4px; background: palette(base);
               alternate-background-color: palette(alternate-base); }
QHeaderView::section { background: palette(button); border: none; border-right: 1px solid palette(midlight);
               border-bottom: 1px solid palette(mid); padding: 4px 6px; color: palette(button-text);
               font-weight: 600; }
QSplitter::handle { background: transparent; }
QProgressBar { border: 1px solid palette(mid); border-radius: 4px; background: palette(button); text-align: center;
               height: 16px; }
QProgressBar::chunk { background: #60a5fa; border-radius: 3px; }
"""

#: Fusion draws the rims of radio buttons and check boxes a shade darker than the window,
#: which on a dark window leaves only the checked dot: the dark theme draws them itself.
DARK_INDICATORS = """
QRadioButton::indicator, QCheckBox::indicator { width: 12px; height: 12px; border: 1px solid #7b8494;
               background: palette(base); }
QRadioButton::indicator { border-radius: 7px; }
QCheckBox::indicator { border-radius: 2px; }
QRadioButton::indicator:checked { background: qradialgradient(cx:0.5, cy:0.5, radius:0.5, fx:0.5, fy:0.5,
               stop:0 #7aa7ff, stop:0.5 #7aa7ff, stop:0.6 #15181d, stop:1 #15181d); }
QCheckBox::indicator:checked { background: #7aa7ff; border-color: #7aa7ff; }
QCheckBox::indicator:indeterminate { background: #4a6fa8; }
QRadioButton::indicator:disabled, QCheckBox::indicator:disabled { border-color: #4a515c; }
QRadioButton { padding-right: 8px; }
"""

_LIGHT = {
    "Window": "#f4f6f9", "WindowText": "#111827", "Base": "#ffffff", "AlternateBase": "#f7f9fb",
    "Text": "#111827", "Button": "#ffffff", "ButtonText": "#111827", "Highlight": "#cfe0fb",
    "HighlightedText": "#0b1f44", "ToolTipBase": "#ffffff", "ToolTipText": "#111827",
    "PlaceholderText": "#6b7280", "Mid": "#d6dae1", "Midlight": "#e3e6eb", "Dark": "#9ca3af",
    "Light": "#ffffff", "Link": "#1d4ed8",
}
_DARK = {
    "Window": "#1f2329", "WindowText": "#e5e7eb", "Base": "#15181d", "AlternateBase": "#1c2026",
    "Text": "#e5e7eb", "Button": "#2a2f36", "ButtonText": "#e5e7eb", "Highlight": "#2f5fa8",
    "HighlightedText": "#ffffff", "ToolTipBase": "#2a2f36", "ToolTipText": "#e5e7eb",
    "PlaceholderText": "#9ca3af", "Mid": "#4a515c", "Midlight": "#3a404a", "Dark": "#7b8494",
    "Light": "#3f4650", "Link": "#7aa7ff",
}
_DISABLED = {"light": "#9ca3af", "dark": "#6b7280"}


def palette(theme: str) -> QPalette:
    """The palette of ``theme`` ("light" or "dark")."""
    colours = _DARK if theme == "dark" else _LIGHT
    p = QPalette()
    for name, colour in colours.items():
        p.setColor(getattr(QPalette.ColorRole, name), QColor(colour))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText, QPalette.ColorRole.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(_DISABLED["dark" if theme == "dark" else "light"]))
    return p


def system_is_dark() -> bool:
    """Whether the desktop asks for a dark colour scheme (Qt's style hints; else whether its
    window colour is dark)."""
    hints = QGuiApplication.styleHints()
    scheme = hints.colorScheme() if hasattr(hints, "colorScheme") else Qt.ColorScheme.Unknown
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    return QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128


def resolved_theme(theme: str) -> str:
    """``"light"`` or ``"dark"`` for a theme setting (``system`` follows the desktop)."""
    if theme == "system":
        return "dark" if system_is_dark() else "light"
    return "dark" if theme == "dark" else "light"


def apply_theme(app: QApplication, theme: str) -> str:
    """Give ``app`` the palette and style sheet of ``theme`` (one of ``THEMES``); returns
    the one applied ("light" or "dark")."""
    chosen = resolved_theme(theme)
    app.setPalette(palette(chosen))
    app.setStyleSheet(STYLE_SHEET + (DARK_INDICATORS if chosen == "dark" else ""))
    app.setProperty("gradexplorer_theme", chosen)
    return chosen


def setup_application(argv: list[str] | None = None) -> QApplication:
    """The QApplication with gradexplorer's look (created once; reused when it exists), in
    the theme the settings name (``system`` by default)."""
    pg.setConfigOptions(imageAxisOrder="row-major", antialias=True, background="w", foreground="k")
    existing = QApplication.instance()  # a QCoreApplication to the type checker
    app = existing if isinstance(existing, QApplication) else QApplication(
        argv if argv is not None else [sys.argv[0]])
    app.setApplicationName("gradexplorer")
    app.setOrganizationName("gradexplorer")
    app.setStyle("Fusion")
    font = QFont(app.font())
    if font.pointSizeF() < 9.5:
        font.setPointSizeF(9.5)
    app.setFont(font)
    theme = AppSettings().value(THEME_KEY, str, "system")
    apply_theme(app, theme if theme in THEMES else "system")
    return app
