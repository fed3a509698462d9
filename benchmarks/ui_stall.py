"""The UI thread's longest stall while a capture runs, and the biggest module tree's show time.

    python -m benchmarks.ui_stall [--model resnet50] [--batch 8] [--switch-interval S]

Opens the real ``MainWindow`` offscreen, loads the model (random init) through its model
worker, gives it a random batch, ticks every leaf layer and starts a run through the real
run worker. A 10 ms ``QTimer`` ticks on the UI thread all along; the gaps between its
ticks while the run is in flight are the stalls a user would feel (the event loop could
not repaint or react for that long). Reported: the longest gap and the 99th percentile,
also during the model load (its probe runs in a worker too).

Then the largest torchvision net (``efficientnet_v2_l``): its ``ModuleTree.build`` time
(done in the loading worker) and the UI-thread time to show it in the window (the
session's ``set_model``, the tree model reset and the first paint), plus the longest
timer gap during its whole load.

The run worker's hooks are Python: while they run they hold the GIL, and the UI thread
waits for it for up to ``sys.getswitchinterval()`` (5 ms by default) per switch.
``--switch-interval`` sets another interval to see how much of the stall that explains.

Figures only: nothing here asserts a time (the targets: no stall over 100 ms,
tree under 300 ms).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

TICK_MS = 10
LARGEST = "efficientnet_v2_l"


class _Ticker:
    """A 10 ms timer on the UI thread that records when it actually fired."""

    def __init__(self):
        from PySide6.QtCore import QTimer

        self.times: list[float] = []
        self.timer = QTimer()
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(lambda: self.times.append(time.perf_counter()))

    def start(self) -> None:
        self.times = [time.perf_counter()]
        self.timer.start()

    def stop(self) -> dict:
        self.timer.stop()
        self.times.append(time.perf_counter())
        gaps = [(b - a) * 1000 for a, b in zip(self.times, self.times[1:])]
        gaps_sorted = sorted(gaps)
        p99 = gaps_sorted[min(len(gaps_sorted) - 1, int(0.99 * len(gaps_sorted)))] if gaps else 0.0
        return {
            "max_ms": max(gaps) if gaps else 0.0,
            "p99_ms": p99,
            "median_ms": statistics.median(gaps) if gaps else 0.0,
            "ticks": len(gaps),
            "over_100ms": sum(g > 100 for g in gaps),
        }


def _wait(signal, timeout_s: float = 600.0):
    from gradexplorer_app.window.signal_wait import wait_for_signal

    return wait_for_signal(signal, timeout_s=timeout_s)


def _settle(seconds: float) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()


def _app():
    from PySide6.QtWidgets import QApplication

    return QApplication.instance() or QApplication([])


def _window():
    from gradexplorer.base.devices import DeviceInfo
    from gradexplorer_app import dialogs
    from gradexplorer_app.window.main_window import MainWindow

    # The budget question would be a modal dialog: answer it (and say so in the figures).
    asked: list[str] = []

    def answer(parent, title, label, items, editable=True):
        asked.append(label)
        return MainWindow.RUN_ANYWAY

    dialogs.ask_item = answer
    w = MainWindow(devices=[DeviceInfo("cpu", "cpu", None, None)], restore_geometry=False)
    w.resize(1500, 950)
    w.show()
    return w, asked


def measure_ui_stall(model: str = "resnet50", batch: int = 8, switch_interval: float | None = None,
                     tree: bool = True) -> dict:
    """Open the window, load ``model`` and run a capture of all its leaves on a random batch.

    Parameters
    ----------
    model : str
        A torchvision name (random init).
    batch : int
    switch_interval : float, optional
        ``sys.setswitchinterval`` for the measurement (restored afterwards).
    tree : bool
        Also time showing the largest torchvision net's module tree.

    Returns
    -------
    dict
        ``run`` and ``load``: longest / 99th percentile / median timer gap (ms) and tick
        counts; ``run_s``; ``layers``; ``tree``: build and show times (s) for
        ``efficientnet_v2_l``.
    """
    from gradexplorer.batches import random_batch

    settings_dir = tempfile.TemporaryDirectory()
    os.environ["GRADEXPLORER_SETTINGS"] = os.path.join(settings_dir.name, "settings.ini")
    old_interval = sys.getswitchinterval()
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    app = _app()
    w, asked = _window()
    ticker = _Ticker()
    result: dict = {"model": model, "batch": batch, "switch_interval_s": sys.getswitchinterval()}
    try:
        # Let the window's first show and paint (pyqtgraph, style, fonts: a few hundred ms
        # once) finish before measuring: that is start-up, not a stall during work.
        _settle(1.5)
        ticker.start()
        t0 = time.perf_counter()
        w.load_model(model)
        _wait(w.model_loaded)
        result["load"] = ticker.stop()
        result["load_s"] = time.perf_counter() - t0

        s = w.session
        x = random_batch(f"{batch}x" + "x".join(str(d) for d in s.model.input_shape), seed=0)
        s.set_batch(x, ["random"])
        s.select_all_leaves()
        app.processEvents()
        result["layers"] = len(s.selection)
        result["estimate"] = w.run_panel.estimate.describe() if w.run_panel.estimate else None

        ticker.start()
        t0 = time.perf_counter()
        w.run()
        (outcome,) = _wait(w.run_done)
        result["run_s"] = time.perf_counter() - t0
        result["run"] = ticker.stop()
        result["outcome"] = outcome
        result["budget_asked"] = bool(asked)

        if tree:
            result["tree"] = _tree_show(w, app, ticker)
    finally:
        w.shutdown()
        w.close()
        w.deleteLater()
        app.processEvents()
        sys.setswitchinterval(old_interval)
        settings_dir.cleanup()
    return result


def _tree_show(w, app, ticker: _Ticker) -> dict:
    """The largest net in the window: build time (worker side), UI-thread show time, and
    the longest stall during its load through the real model worker."""
    from gradexplorer.capturing.module_tree import ModuleTree
    from gradexplorer.pipeline.session import PreparedModel

    out: dict = {"model": LARGEST}
    ticker.start()
    t0 = time.perf_counter()
    w.load_model(LARGEST)
    _wait(w.model_loaded)
    out["load_s"] = time.perf_counter() - t0
    out["load_stall"] = ticker.stop()
    out["modules"] = len(w.session.tree.nodes)

    loaded = w.session.model
    t0 = time.perf_counter()
    built = ModuleTree.build(loaded.module)
    out["build_s"] = time.perf_counter() - t0
    # Show it again from scratch: drop the model, then time set_model and the first paint.
    w.session.set_model(None)
    app.processEvents()
    prepared = PreparedModel(loaded, built)
    t0 = time.perf_counter()
    w.session.set_model(prepared)
    w.tree_view.viewport().repaint()
    app.processEvents()
    out["show_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    w.tree_view.expandAll()
    w.tree_view.viewport().repaint()
    app.processEvents()
    out["expand_all_s"] = time.perf_counter() - t0
    return out


def measure(quick: bool = False) -> dict:
    """The figures for ``python -m benchmarks`` (case -> ms or text)."""
    r = measure_ui_stall("resnet50", 2 if quick else 8)
    run, tree = r["run"], r["tree"]
    return {
        f"resnet50 batch {r['batch']}, {r['layers']} leaves, run {r['run_s']:.1f} s: longest gap": run["max_ms"],
        "p99 gap": run["p99_ms"],
        f"{LARGEST} ({tree['modules']} modules): build {tree['build_s'] * 1000:.0f} ms, show":
            tree["show_s"] * 1000,
        f"{LARGEST} load through the window: longest gap": tree["load_stall"]["max_ms"],
    }


def _print(r: dict) -> None:
    def gaps(g: dict) -> str:
        return (f"longest {g['max_ms']:.0f} ms, p99 {g['p99_ms']:.0f} ms, median {g['median_ms']:.1f} ms, "
                f"{g['ticks']} ticks, {g['over_100ms']} over 100 ms")

    print(f"switch interval {r['switch_interval_s'] * 1000:.1f} ms")
    print(f"{r['model']} load (random init, probe in the worker) {r['load_s']:.1f} s: {gaps(r['load'])}")
    print(f"{r['model']} batch {r['batch']}, {r['layers']} leaves, full capture, run {r['run_s']:.1f} s "
          f"({r['outcome']}{', budget question answered' if r['budget_asked'] else ''}): {gaps(r['run'])}")
    if r.get("estimate"):
        print(f"  memory estimate shown beside Run: {r['estimate']}")
    t = r.get("tree")
    if t:
        print(f"{t['model']} ({t['modules']} modules): ModuleTree.build {t['build_s'] * 1000:.0f} ms (worker), "
              f"show in the window {t['show_s'] * 1000:.0f} ms, "
              f"expand all {t['expand_all_s'] * 1000:.0f} ms (UI thread)")
        print(f"  its load through the window ({t['load_s']:.1f} s): {gaps(t['load_stall'])}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval during the run (seconds; default: Python's 0.005)")
    ap.add_argument("--no-tree", action="store_true", help=f"skip the {LARGEST} tree")
    args = ap.parse_args(argv)
    _print(measure_ui_stall(args.model, args.batch, args.switch_interval, tree=not args.no_tree))
    return 0


if __name__ == "__main__":
    sys.exit(main())
