"""Soak: many captures in one process must not leak memory, hooks, threads or files.

    python scripts/soak.py [--captures 500] [--gui 100] [--json]

Core soak (default): ``--captures`` consecutive captures of resnet18 (random init, batch 2,
64x64) alternating full and statistics-only modes, layer selections and the input
gradient, with every 6th run cancelled part-way and every 6th failing in forward (a batch
of the wrong shape). The last capture is kept, as the GUI keeps it. Prints resident memory
(RSS) after the warm-up and at the end and its growth, the hooks left on any module, the
threads and open file descriptors before and after. Target: growth < 5%, no hooks, no
threads or descriptors left over; the exit status is 1 when one is missed.

GUI soak (``--gui N``): N runs through ``gradexplorer_app.window.main_window.MainWindow`` headless
(``QT_QPA_PLATFORM=offscreen``) on the built-in demo, alternating modes, every 10th
cancelled just after it started; the same figures. Threads and descriptors are counted
after the warm-up (torch and Qt start their thread pools lazily).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

HOOK_ATTRS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
              "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")


def rss_bytes() -> int:
    """Resident set size now (VmRSS), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def os_threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return threading.active_count()


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def hooks_left(model: torch.nn.Module) -> int:
    return sum(len(getattr(m, attr, None) or ()) for m in model.modules() for attr in HOOK_ATTRS)


class _CancelAt:
    """A cancel flag that sets itself at its n-th check (capture checks it at every module
    call and every gradient): a cancel at a random point of forward or backward."""

    def __init__(self, at: int):
        self.at = at
        self.checks = 0

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks >= self.at


def _figures(kind, runs, outcomes, rss_warm, rss_end, hooks, threads, fds, seconds) -> dict:
    growth = (rss_end - rss_warm) / rss_warm * 100 if rss_warm else float("nan")
    return {
        "kind": kind, "runs": runs, "outcomes": outcomes, "rss_warm": rss_warm, "rss_end": rss_end,
        "growth_pct": growth, "hooks_left": hooks, "threads_before": threads[0],
        "threads_after": threads[1], "fds_before": fds[0], "fds_after": fds[1], "seconds": seconds,
    }


def _print(fig: dict) -> bool:
    ok = (fig["growth_pct"] < 5 and fig["hooks_left"] == 0
          and fig["threads_after"] <= fig["threads_before"] and fig["fds_after"] <= fig["fds_before"])
    mib = 2**20
    print(f"{fig['kind']} soak: {fig['runs']} runs in {fig['seconds']:.0f} s "
          f"({', '.join(f'{k} {v}' for k, v in sorted(fig['outcomes'].items()))})")
    print(f"  RSS after warm-up {fig['rss_warm'] / mib:.0f} MiB, at the end {fig['rss_end'] / mib:.0f} MiB: "
          f"growth {fig['growth_pct']:+.1f}% (target < 5%)")
    print(f"  hooks left on any module: {fig['hooks_left']}")
    print(f"  threads before/after: {fig['threads_before']}/{fig['threads_after']}; "
          f"open file descriptors before/after: {fig['fds_before']}/{fig['fds_after']}")
    print(f"  {'PASS' if ok else 'FAIL'}")
    return ok


def core_soak(captures: int = 500, seed: int = 0, quiet: bool = False) -> dict:
    """Run ``captures`` captures in this process and return the figures."""
    import torchvision

    from gradexplorer.base.errors import CaptureCancelled, CaptureError
    from gradexplorer.capturing.capture import capture

    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 64, 64)
    bad = torch.randn(2, 1, 64, 64)  # wrong channel count: forward fails in conv1
    variants = [
        {"mode": "full"},
        {"mode": "stats"},
        {"mode": "full", "layers": ["layer4.*"], "input_grad": True},
        {"mode": "stats", "layers": ["*relu", "*.bn*"]},
        "cancel",
        "fail",
    ]
    warmup = max(min(captures // 10, 30), min(captures, 6))
    # Threads and descriptors are counted after the warm-up: torch starts its pools lazily.
    threads_before = fds_before = 0
    outcomes: dict[str, int] = {}
    kept = None
    rss_warm = 0
    t0 = time.perf_counter()
    for i in range(captures):
        variant = variants[i % len(variants)]
        try:
            if variant == "cancel":
                # resnet18 makes about 70 module calls and 60 gradient checks per run.
                flag = _CancelAt(rng.randint(1, 120))
                kept = capture(model, x, mode=rng.choice(["full", "stats"]), cancel=flag)
                outcome = "done"
            elif variant == "fail":
                capture(model, bad)
                outcome = "done"
            else:
                kept = capture(model, x, **variant)
                outcome = "done"
        except CaptureCancelled:
            outcome = "cancelled"
        except CaptureError:
            outcome = "failed"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if hooks_left(model):
            raise SystemExit(f"hooks left after run {i}")
        if i + 1 == warmup:
            gc.collect()
            rss_warm = rss_bytes()
            threads_before, fds_before = os_threads(), open_fds()
        if not quiet and (i + 1) % 50 == 0:
            print(f"  {i + 1}/{captures}: RSS {rss_bytes() / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    del kept
    gc.collect()
    return _figures("core", captures, outcomes, rss_warm, rss_bytes(), hooks_left(model),
                    (threads_before, os_threads()), (fds_before, open_fds()), time.perf_counter() - t0)


def gui_soak(runs: int = 100, quiet: bool = False) -> dict:
    """``runs`` runs through the main window, headless; returns the figures."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import tempfile

    from PySide6.QtWidgets import QApplication

    from gradexplorer_app.window import error_dialog
    from gradexplorer_app.window.main_window import MainWindow
    from gradexplorer_app.window.settings import AppSettings
    from gradexplorer_app.window.signal_wait import wait_for_signal

    app = QApplication.instance() or QApplication([])
    errors: list[str] = []
    error_dialog.show_error = lambda parent, title, exc: errors.append(f"{title}: {exc}")  # no modal boxes
    tmp = tempfile.TemporaryDirectory()
    win = MainWindow(settings=AppSettings(str(Path(tmp.name) / "soak.ini")), restore_geometry=False)
    win.show()

    def wait(signal, start, timeout_s=300):
        return wait_for_signal(signal, start, timeout_s)

    wait(win.model_loaded, lambda: win.load_model("demo:shapes"))
    if win.session.batch is None:
        raise SystemExit("the demo loaded without a batch")
    warmup = max(min(runs // 10, 10), min(runs, 3))
    threads_before = fds_before = 0
    outcomes: dict[str, int] = {}
    rss_warm = 0
    t0 = time.perf_counter()
    for i in range(runs):
        win.session.set_mode("full" if i % 2 == 0 else "stats")
        if i % 10 == 9:
            def start():
                win.run()
                win.cancel()
        else:
            start = win.run
        (outcome,) = wait(win.run_done, start)
        for _ in range(3):
            app.processEvents()
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if i + 1 == warmup:
            gc.collect()
            rss_warm = rss_bytes()
            threads_before, fds_before = os_threads(), open_fds()
        if not quiet and (i + 1) % 20 == 0:
            print(f"  {i + 1}/{runs}: RSS {rss_bytes() / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    win.run_runner.wait_idle(30)
    model = win.session.model.module
    gc.collect()
    fig = _figures("gui", runs, outcomes, rss_warm, rss_bytes(), hooks_left(model),
                   (threads_before, os_threads()), (fds_before, open_fds()), time.perf_counter() - t0)
    fig["errors"] = errors
    win.shutdown()
    win.close()
    win.deleteLater()
    app.processEvents()
    tmp.cleanup()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--captures", type=int, default=500, help="core captures (0 to skip)")
    ap.add_argument("--gui", type=int, default=0, metavar="N", help="also N runs through the GUI")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line at the end")
    args = ap.parse_args(argv)
    figures = []
    if args.captures:
        figures.append(core_soak(args.captures, quiet=args.json))
    if args.gui:
        figures.append(gui_soak(args.gui, quiet=args.json))
    ok = all(_print(f) for f in figures)
    if args.json:
        print(json.dumps(figures))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
