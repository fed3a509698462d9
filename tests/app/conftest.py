"""Fixtures for the GUI tests: a throwaway settings file, no real modal dialogs."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _throwaway_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADEXPLORER_SETTINGS", str(tmp_path / "settings.ini"))
    yield


@pytest.fixture
def shown_errors(monkeypatch):
    """Replace the error dialog: every error shown is appended here instead."""
    from app import error_dialog

    errors: list[tuple[str, BaseException]] = []
    monkeypatch.setattr(error_dialog, "show_error", lambda parent, title, exc: errors.append((title, exc)))
    return errors


@pytest.fixture(autouse=True)
def _no_modal_dialogs(monkeypatch):
    """A test that reaches a real modal dialog fails instead of hanging."""
    from app import dialogs

    def refuse(*args, **kwargs):
        raise AssertionError("a modal dialog was opened in a test; monkeypatch app.dialogs")

    for name in ("ask_open_files", "ask_open_file", "ask_folder", "ask_save_file", "ask_text",
                 "ask_item", "confirm_trust"):
        monkeypatch.setattr(dialogs, name, refuse)
    yield
