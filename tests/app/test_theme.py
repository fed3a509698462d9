"""The window follows the desktop's colour scheme, or the theme chosen in View ▸ Theme."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

# Every test here takes a second or more (scripts/slow_tests.py): none is in make test-fast.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dark", [False, True])
def test_the_system_theme_follows_the_desktop(qtbot, app_look, monkeypatch, dark):
    from gradexplorer_app.window import application

    monkeypatch.setattr(application, "system_is_dark", lambda: dark)
    app = application.setup_application()
    window_colour = app.palette().color(QPalette.ColorRole.Window)
    assert (window_colour.lightness() < 128) == dark
    assert app.property("gradexplorer_theme") == ("dark" if dark else "light")
    # One style sheet for both: it names palette roles, never a light colour of its own.
    assert "#ffffff" not in application.STYLE_SHEET and "palette(base)" in application.STYLE_SHEET


def test_view_theme_applies_now_and_is_remembered(qtbot, window, app_look):
    from gradexplorer_app.window.application import THEME_KEY, setup_application
    from gradexplorer_app.window.settings import AppSettings

    setup_application()
    window.theme_actions["dark"].trigger()
    app = QApplication.instance()
    assert app.palette().color(QPalette.ColorRole.Base).lightness() < 64
    assert window.palette().color(QPalette.ColorRole.Window).lightness() < 128
    assert AppSettings().value(THEME_KEY, str, "") == "dark"
    window.theme_actions["light"].trigger()
    assert app.palette().color(QPalette.ColorRole.Base).lightness() > 200
    assert window.theme_actions["light"].isChecked() and not window.theme_actions["dark"].isChecked()
