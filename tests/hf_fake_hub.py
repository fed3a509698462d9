"""A Hugging Face Hub on the loopback address, serving one model folder, so that the real
download path (huggingface_hub's ``snapshot_download`` with its progress bars) runs
offline: :meth:`FakeHub.point_hub_here` points huggingface_hub at :attr:`FakeHub.endpoint`.

It answers what ``snapshot_download`` asks, in the Hub's own forms: the repository's
revision (``/api/models/ORG/NAME/revision/main``), its file tree
(``/api/models/ORG/NAME/tree/SHA``) and each file (``HEAD`` and ``GET``
``/ORG/NAME/resolve/SHA/FILE``, with ``X-Repo-Commit`` and ``ETag``). Anything else is
a 404. Each request is recorded.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from pathlib import Path

SHA = "a" * 40


class FakeHub:
    """Serves ``folder`` as the model ``repo`` until :meth:`close` (or the ``with`` block ends)."""

    def __init__(self, folder: Path, repo: str = "tiny-org/tiny-gpt2") -> None:
        self.folder, self.repo = Path(folder), repo
        self.requests: list[str] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                hub._answer(self, head=False)

            def do_HEAD(self) -> None:
                hub._answer(self, head=True)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def point_hub_here(self, monkeypatch: object, home: Path) -> None:
        """Make huggingface_hub download from this Hub into the cache under ``home``
        (``HF_HOME``), online, for the rest of the test (``monkeypatch``: pytest's)."""
        import huggingface_hub.constants as constants

        monkeypatch.setenv("HF_HOME", str(home))  # type: ignore[attr-defined]
        monkeypatch.setenv("HF_ENDPOINT", self.endpoint)  # type: ignore[attr-defined]
        for name in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            monkeypatch.delenv(name, raising=False)  # type: ignore[attr-defined]
        # huggingface_hub reads these once at import.
        monkeypatch.setattr(constants, "ENDPOINT", self.endpoint)  # type: ignore[attr-defined]
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",  # type: ignore[attr-defined]
                            self.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # type: ignore[attr-defined]

    def files(self) -> list[str]:
        return sorted(p.name for p in self.folder.iterdir() if p.is_file())

    def _answer(self, handler: http.server.BaseHTTPRequestHandler, head: bool) -> None:
        self.requests.append(f"{handler.command} {handler.path}")
        path = handler.path.split("?")[0]
        api = f"/api/models/{self.repo}"
        if path in (api, f"{api}/revision/main"):
            body = {"id": self.repo, "modelId": self.repo, "sha": SHA,
                    "siblings": [{"rfilename": f} for f in self.files()]}
            return self._send(handler, 200, json.dumps(body).encode(), "application/json", head)
        if path.startswith(f"{api}/tree/"):
            entries = [{"type": "file", "path": f, "size": (self.folder / f).stat().st_size,
                        "oid": hashlib.sha1((self.folder / f).read_bytes()).hexdigest()} for f in self.files()]
            return self._send(handler, 200, json.dumps(entries).encode(), "application/json", head)
        resolve = f"/{self.repo}/resolve/"
        if path.startswith(resolve):
            name = path[len(resolve):].partition("/")[2]
            file = self.folder / name
            if name in self.files():
                data = file.read_bytes()
                extra = {"X-Repo-Commit": SHA, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
                return self._send(handler, 200, data, "application/octet-stream", head, extra)
            return self._send(handler, 404, b"", "text/plain", head, {"X-Error-Code": "EntryNotFound"})
        return self._send(handler, 404, b"{}", "application/json", head, {"X-Error-Code": "RepoNotFound"})

    @staticmethod
    def _send(handler: http.server.BaseHTTPRequestHandler, code: int, body: bytes, kind: str, head: bool,
              headers: dict[str, str] | None = None) -> None:
        handler.send_response(code)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if not head:
            handler.wfile.write(body)
