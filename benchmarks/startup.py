"""Start-up: how long ``gradexplorer`` (no arguments: the demo) takes to show its window and
its first gradient, and how much memory the demo's window holds.

    python -m benchmarks.startup [--repeats 5] [--platform offscreen]

Each repeat is a fresh process, started the way the console script starts (the command
line's ``main([])``, which opens the window on ``demo:shapes`` and runs it once). Figures,
median over the repeats (the machine may be shared: the spread is printed too):

* imports: until the window's modules are imported (``gradexplorer_app.window.launch``);
* first window: from the process's start until the window has been shown and painted;
* first gradient: until the demo's first run is done and its views are drawn;
* resident memory: the process's RSS once the first gradient is on screen, and its peak.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_MARK = "STARTUP "


def _rss_mib() -> tuple[float, float]:
    """The current and peak resident memory (Linux /proc), MiB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def child(started: float) -> None:
    """One start-up, in this process: print the figures as one JSON line, then quit."""
    marks: dict[str, float] = {}
    import gradexplorer_app.window.launch as launch_module  # what the console script imports first

    marks["imports"] = time.time() - started
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    original = launch_module.MainWindow

    class TimedWindow(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.run_done.connect(self._first_run_done)

        def showEvent(self, event):
            super().showEvent(event)
            if "window" not in marks:
                # Painted: the first turn of the event loop after show.
                QTimer.singleShot(0, lambda: marks.setdefault("window", time.time() - started))

        def _first_run_done(self, outcome: str) -> None:
            if "gradient" in marks:
                return

            def drawn() -> None:
                QApplication.processEvents()
                marks["gradient"] = time.time() - started
                marks["outcome_ok"] = float(outcome == "ok")
                marks["rss_mib"], marks["peak_mib"] = _rss_mib()
                print(_MARK + json.dumps(marks), flush=True)
                self.close()
                QApplication.quit()

            QTimer.singleShot(0, drawn)

    launch_module.MainWindow = TimedWindow
    from gradexplorer_app.cli.main import main

    main([])


def measure(repeats: int = 5, platform: str = "offscreen") -> dict:
    """Start ``repeats`` fresh processes; the median and range of each figure."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, QT_QPA_PLATFORM=platform, GRADEXPLORER_SETTINGS=str(Path(tmp) / "settings.ini"))
        for _ in range(repeats):
            started = time.time()
            out = subprocess.run([sys.executable, "-m", "benchmarks.startup", "--child", repr(started)],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
            line = next((x for x in out.stdout.splitlines() if x.startswith(_MARK)), None)
            if line is None:
                raise RuntimeError(f"the window did not report its start-up:\n{out.stderr[-2000:]}")
            runs.append(json.loads(line[len(_MARK):]))
    keys = ("imports", "window", "gradient", "rss_mib", "peak_mib")
    return {key: (statistics.median(r[key] for r in runs), min(r[key] for r in runs), max(r[key] for r in runs))
            for key in keys} | {"repeats": repeats, "ok": all(r["outcome_ok"] for r in runs)}


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--platform", default="offscreen", help="Qt platform plugin (offscreen, xcb)")
    ap.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args.child)
        return None
    r = measure(args.repeats, args.platform)

    def row(what: str, key: str, unit: str, fmt: str) -> str:
        median, low, high = r[key]
        return f"  {what:<16} {median:{fmt}} {unit}  (range {low:{fmt}}-{high:{fmt}})"

    print(f"gradexplorer start-up on the demo, median of {r['repeats']} fresh processes "
          f"(Qt platform {args.platform}){'' if r['ok'] else ' - a run FAILED'}:")
    print(row("imports", "imports", "s", ".2f"))
    print(row("first window", "window", "s", ".2f"))
    print(row("first gradient", "gradient", "s", ".2f"))
    print(row("resident memory", "rss_mib", "MiB", ".0f"))
    print(row("peak memory", "peak_mib", "MiB", ".0f"))
    return r


if __name__ == "__main__":
    main()
