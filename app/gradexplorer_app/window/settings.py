"""The one place gradexplorer reads and writes ``QSettings``.

Values are always read with a type and a default, so a damaged or foreign settings
file never breaks start-up. ``GRADEXPLORER_SETTINGS=/path/file.ini`` (or the ``path``
argument) points everything at an INI file: tests and screenshots use a throwaway one.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from PySide6.QtCore import QByteArray, QSettings

RECENT_LIMIT = 10
ENV_VAR = "GRADEXPLORER_SETTINGS"


class RecentModel(NamedTuple):
    """A model loaded before: what ``ModelRequest`` needs to load it the same way again."""

    spec: str
    weights: str | None
    arch: str | None


class AppSettings:
    """Recent models and inputs, window geometry and splitter sizes."""

    def __init__(self, path: str | None = None) -> None:
        path = path or os.environ.get(ENV_VAR) or None
        if path:
            self._qs = QSettings(str(path), QSettings.Format.IniFormat)
        else:
            self._qs = QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope,
                                 "gradexplorer", "gradexplorer")

    @property
    def path(self) -> str:
        return self._qs.fileName()

    # -- typed access ----------------------------------------------------------------
    def value(self, key: str, type_: type, default: Any) -> Any:
        """The value of ``key`` as ``type_``, or ``default`` when missing or unreadable."""
        if not self._qs.contains(key):
            return default
        raw = self._qs.value(key)
        try:
            if type_ is bool:
                if isinstance(raw, str):
                    return raw.strip().lower() in ("1", "true", "yes", "on")
                return bool(raw)
            if type_ is list:
                if raw is None:
                    return []
                if isinstance(raw, str):
                    return [raw] if raw else []
                return [str(v) for v in raw]
            if type_ is QByteArray:
                return raw if isinstance(raw, QByteArray) else default
            return type_(raw)
        except (TypeError, ValueError):
            return default

    def set_value(self, key: str, value: Any) -> None:
        self._qs.setValue(key, value)

    def sync(self) -> None:
        self._qs.sync()

    # -- recent items ----------------------------------------------------------------
    def _recent(self, key: str) -> list[str]:
        return [v for v in self.value(key, list, []) if v][:RECENT_LIMIT]

    def _push_recent(self, key: str, item: str) -> None:
        items = [item] + [v for v in self._recent(key) if v != item]
        self.set_value(key, items[:RECENT_LIMIT])

    def recent_models(self) -> list[str]:
        """Model specs, most recent first."""
        return [entry.spec for entry in self.recent_model_entries()]

    def recent_model_entries(self) -> list[RecentModel]:
        """Models with the weights and architecture they were loaded with, most recent first."""
        entries = []
        for item in self._recent("recent/models"):
            spec, weights, arch = (item.split("\t") + ["", ""])[:3]
            entries.append(RecentModel(spec, weights or None, arch or None))
        return entries

    def add_recent_model(self, spec: str, weights: str | None = None, arch: str | None = None) -> None:
        """Remember ``spec`` with its weights (``None``: random init) and architecture."""
        item = "\t".join([spec, weights or "", arch or ""]).rstrip("\t")
        items = [item] + [v for v in self._recent("recent/models") if v.split("\t")[0] != spec]
        self.set_value("recent/models", items[:RECENT_LIMIT])

    def recent_captures(self) -> list[str]:
        """Capture files opened or saved, most recent first."""
        return self._recent("recent/captures")

    def add_recent_capture(self, path: str) -> None:
        self._push_recent("recent/captures", path)

    def recent_inputs(self) -> list[str]:
        """Input sources (files, folders, ``random:...``), most recent first."""
        return self._recent("recent/inputs")

    def add_recent_input(self, source: str) -> None:
        self._push_recent("recent/inputs", source)

    # -- window --------------------------------------------------------------------------
    def geometry(self) -> QByteArray | None:
        value = self.value("window/geometry", QByteArray, None)
        return value if value is not None and not value.isEmpty() else None

    def set_geometry(self, data: QByteArray) -> None:
        self.set_value("window/geometry", data)
