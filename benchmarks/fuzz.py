"""Mutated capture files, dataset captures, watch logs and Hugging Face caches through every
reader: the counts of what went wrong.

    python -m benchmarks.fuzz [--n 2000] [--datasets 500] [--logs 100] [--hub 0] [--seed 0]
                              [--workers 2] [--budget SECONDS] [--in-process] [--readers inspect,diff,...]

Capture mutations (dict-level edits, pickle bytes flipped, zip damage, and the hostile files
that once crashed a reader; the generator is ``tests/capture_mutations.py``'s ``fuzz_cases``),
the same of a dataset capture (each record's exact merge, the log2 histogram edges, the
per-batch series), and watch-log mutations (SQL-level and byte-level edits of a valid log:
``tests/log_mutations.py``), and Hugging Face cache mutations (``--hub N``: ``config.json``,
``tokenizer.json``, ``tokenizer_config.json``, the safetensors header, ``refs/main`` and what
a file is, ``tests/hub_mutations.py``), each through the loaders of ``hf:`` models:
``capture --model hf:... --text`` and ``layers --model hf:... --probe --text``, offline.

By default each run is a fresh process, as a user starts it: each capture mutation goes
through one reader in turn (``inspect``, ``inspect --layer``, ``graph --capture``, ``diff``
against the valid file, and the window's open path, ``gradexplorer FILE --screenshot`` under
offscreen Qt; for a dataset capture ``timeline --screenshot`` instead of the graph), and
each log mutation through all three log readers (``inspect``, ``inspect --csv``,
``timeline --screenshot``). A run past 60 s is killed and counted as a hang; a process may
map 8 GiB at most (a memory bomb then fails where it would have allocated, and is counted by
its message); its peak resident memory comes from ``wait4``.

``--in-process`` runs every mutation through every reader in this one process: the four
command-line readers, the window's open path (the main window, offscreen, every view tab
drawn for each layer, and each tensor and scope of the histogram view:
``draw_every_view``), the timeline view (a dataset capture's series, a log's heatmap), and
for logs ``inspect``, ``inspect --csv`` and the timeline's reads. A run past 60 s aborts it
with a traceback (faulthandler), and the peak memory is this process's high-water mark.

The counts printed: exit codes, exit 70s, hangs, segfaults, runs that failed without a
message, memory blow-ups and the peak resident memory of one run. Figures only: nothing
here asserts; ``tests/app/test_capture_fuzz.py`` and ``tests/core/test_watch_log_fuzz.py``
run seeded subsets in the default test run (thousands with ``GRADEXPLORER_FUZZ=1``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 60.0
#: The address space one run may map: the window maps about 4 GiB without allocating it.
ADDRESS_SPACE = 8 << 30
#: Peak resident memory above this is a blow-up.
BLOW_UP = 2 << 30
#: The console script's own entry point, run by this interpreter.
GRADEXPLORER = [sys.executable, "-c", "import sys; from gradexplorer_app.cli.main import main; sys.exit(main())"]
READERS = ("inspect", "inspect --layer", "graph --capture", "diff", "window")
LOG_READERS = ("inspect", "inspect --csv", "timeline")
HUB_READERS = ("capture --text", "layers --probe")
#: Words of an allocation that the address-space limit stopped (a bomb that was not refused).
ALLOCATION_FAILED = ("can't allocate memory", "cannot allocate memory", "memoryerror", "out of memory",
                     "std::bad_alloc")


@dataclass
class Run:
    """One reader on one mutated file."""

    name: str
    reader: str
    code: int | str  # the exit status, or "hang" / "segfault"
    seconds: float
    peak_kib: int
    said: str  # the message line (or the last line of stderr)
    out: str = ""

    @property
    def blew_up(self) -> bool:
        return self.peak_kib * 1024 > BLOW_UP or any(w in self.said.lower() for w in ALLOCATION_FAILED)

    @property
    def silent(self) -> bool:
        """Failed without saying why (``diff`` exits 1 with its verdict when the files differ)."""
        if self.code in (0, "hang", "segfault"):
            return False
        if "error" in self.said.lower():
            return False
        return not (self.reader == "diff" and self.code == 1 and "result     DIVERGED" in self.out)


def _command(reader: str, path: Path, base: Path, out: Path) -> list[str]:
    exe = GRADEXPLORER
    if reader == "inspect":
        return [*exe, "inspect", str(path)]
    if reader == "inspect --layer":
        return [*exe, "inspect", str(path), "--layer", "fc1"]
    if reader == "graph --capture":
        return [*exe, "graph", "--capture", str(path), "--out", str(out.with_suffix(".svg"))]
    if reader == "diff":
        return [*exe, "diff", str(base), str(path)]
    if reader == "window":
        return [*exe, str(path), "--screenshot", str(out.with_suffix(".png"))]
    if reader == "inspect --csv":
        return [*exe, "inspect", str(path), "--csv", str(out.with_suffix(".csv"))]
    if reader == "timeline":
        return [*exe, "timeline", str(path), "--screenshot", str(out.with_suffix(".png"))]
    if reader == "capture --text":  # path: a Hugging Face home, which the caller makes HF_HOME
        return [*exe, "-q", "capture", "--model", "hf:acme/fuzz", "--text", "the cat", "--out",
                str(out.with_suffix(".pt"))]
    if reader == "layers --probe":
        return [*exe, "-q", "layers", "--model", "hf:acme/fuzz", "--probe", "--text", "the cat"]
    raise ValueError(reader)


def _limit_memory() -> None:
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _said(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    said = [ln for ln in lines if "error" in ln.lower()]  # Qt's own warnings may come after the message
    return (said or lines or [""])[-1]


def run_one(name: str, reader: str, cmd: list[str], env: dict) -> Run:
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT, preexec_fn=_limit_memory)
        hung = threading.Event()

        def kill() -> None:
            hung.set()
            proc.kill()

        timer = threading.Timer(HANG_S, kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - start
        err.seek(0)
        out.seek(0)
        stderr = err.read().decode(errors="replace")
        stdout = out.read().decode(errors="replace")
    code: int | str = proc.returncode
    if hung.is_set():
        code = "hang"
    elif code in (-11, 139):
        code = "segfault"
    return Run(name, reader, code, seconds, usage.ru_maxrss, _said(stderr), stdout[-4000:])


def report(title: str, runs: list[Run], wanted: int, wall: float) -> None:
    """Print the counts of ``runs`` (and every run that did not end in 0, 1 or 2 with a message)."""
    codes = collections.Counter(r.code for r in runs)
    silent = [r for r in runs if r.silent]
    blown = [r for r in runs if r.blew_up]
    peak = max((r.peak_kib for r in runs), default=0)
    print(f"{title}: {len(runs)} of {wanted} runs in {wall:.0f} s")
    by_reader = collections.Counter(r.reader for r in runs)
    print("  readers: " + ", ".join(f"{k} {v}" for k, v in by_reader.items()))
    print("  exit codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items(), key=str)))
    print(f"  exit 70: {codes.get(70, 0)}   hangs over {HANG_S:.0f} s: {codes.get('hang', 0)}   "
          f"segfaults: {codes.get('segfault', 0)}   failures without a message: {len(silent)}   "
          f"memory blow-ups: {len(blown)}")
    print(f"  peak memory of one run: {peak / 1024:.0f} MiB")
    slowest = max(runs, key=lambda r: r.seconds, default=None)
    if slowest is not None:
        print(f"  slowest run: {slowest.seconds:.1f} s ({slowest.reader}, {slowest.name})")
    for r in runs:
        if r.code not in (0, 1, 2) or r in silent or r in blown:
            print(f"    {r.code}  {r.reader:<16} {r.name}  {r.said[:160]}")
    sys.stdout.flush()


#: One run in a fresh process: its name, reader, command, and what it adds to the environment.
Job = tuple[str, str, list[str], dict[str, str]]


def _pool(jobs: list[Job], workers: int, budget: float, env: dict) -> tuple[list[Run], float]:
    deadline = time.monotonic() + budget
    runs: list[Run] = []
    lock = threading.Lock()
    start = time.monotonic()

    def work(job: Job) -> None:
        if time.monotonic() > deadline:
            return
        name, reader, cmd, extra = job
        result = run_one(name, reader, cmd, {**env, **extra})
        with lock:
            runs.append(result)
            if len(runs) % 100 == 0:
                print(f"  ... {len(runs)} runs, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(work, jobs))
    return runs, time.monotonic() - start


# -- in this process -------------------------------------------------------------------------


def _in_process(name: str, reader: str, call: Callable[[], tuple[int, str, str]]) -> Run:
    import faulthandler

    faulthandler.dump_traceback_later(HANG_S, exit=True)  # a hang ends the benchmark, loudly
    start = time.monotonic()
    try:
        code, err, out = call()
    finally:
        faulthandler.cancel_dump_traceback_later()
    return Run(name, reader, code, time.monotonic() - start,
               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, _said(err) if code else "", out[-4000:])


def _cli(*argv: object) -> tuple[int, str, str]:
    from gradexplorer_app.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    text = err.getvalue()
    if "Traceback" in text:
        code = 70
    return code, text, out.getvalue()


class _Window:
    """The main window, offscreen, with its error dialog recorded instead of shown."""

    def __init__(self) -> None:
        from PySide6.QtWidgets import QApplication

        from gradexplorer.base.devices import DeviceInfo
        from gradexplorer_app.window import error_dialog
        from gradexplorer_app.window.main_window import MainWindow

        self.app = QApplication.instance() or QApplication([])
        self.errors: list[str] = []
        error_dialog.show_error = lambda parent, title, exc, **kw: self.errors.append(f"error: {title}: {exc}")
        self.window = MainWindow(devices=[DeviceInfo("cpu", "cpu", None, None)], restore_geometry=False)
        self.window.resize(1500, 950)
        self.window.show()

    def open(self, path: Path) -> tuple[int, str, str]:
        from PySide6.QtCore import QEventLoop, QTimer

        loop = QEventLoop()
        done: list[str] = []

        def finished(kind: str) -> None:
            done.append(kind)
            loop.quit()

        self.window.file_done.connect(finished)
        before = len(self.errors)
        try:
            QTimer.singleShot(int(HANG_S * 1000), loop.quit)
            self.window.open_capture(str(path))
            if not done:
                loop.exec()
        finally:
            self.window.file_done.disconnect(finished)
        if not done:
            return 124, "no answer", ""
        from tests.capture_mutations import draw_every_view

        draw_every_view(self.window, self.app.processEvents)
        if done[0] == "open":
            return 0, "", ""
        said = self.errors[before:]
        if len(said) != 1 or "Traceback" in said[0]:
            return 70, "; ".join(said) or "failed without a dialog", ""
        return 1, said[0], ""


class _Timeline:
    """The timeline view, offscreen: a log opened, its heatmap drawn or its failure said."""

    def __init__(self) -> None:
        from gradexplorer_app.views.timeline_view import TimelineView

        self.view = TimelineView(poll_ms=3_600_000)
        self.view.resize(1200, 800)
        self.view.show()

    def open(self, path: Path, capture: bool = False) -> tuple[int, str, str]:
        """A log (or with ``capture``, a dataset capture) opened and drawn, or its failure said."""
        from PySide6.QtCore import QEventLoop, QTimer

        loop = QEventLoop()
        said: list[str] = []
        drawn: list[bool] = []

        def failed(message: str) -> None:
            said.append(message)
            loop.quit()

        def updated() -> None:
            drawn.append(True)
            loop.quit()

        self.view.failed.connect(failed)
        self.view.updated.connect(updated)
        try:
            QTimer.singleShot(int(HANG_S * 1000), loop.quit)
            if capture:
                self.view.open_capture(str(path))
            else:
                self.view.open_log(str(path))
            if not (said or drawn):
                loop.exec()
        finally:
            self.view.failed.disconnect(failed)
            self.view.updated.disconnect(updated)
            self.view.timer.stop()
        if said:
            return 1, f"error: {said[0]}", ""
        return (0, "", "") if drawn else (124, "no answer", "")


def _hub_section(args: argparse.Namespace, folder: Path, env: dict) -> None:
    """Each mutated Hugging Face cache through the ``hf:`` loaders: both in this process, or
    in turn in fresh processes (each with its own copy of the cache)."""
    from tests.hub_mutations import mutated, mutations, valid_cache

    base = folder / "hub-base"
    valid_cache(base)
    cases = mutations(args.seed, args.hub)
    start = time.monotonic()
    if args.in_process:
        import huggingface_hub.constants as constants

        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ.pop("HF_HUB_CACHE", None)
        runs: list[Run] = []
        for i, mutation in enumerate(cases):
            home = mutated(base, mutation, folder / "hub-home")
            os.environ["HF_HOME"] = str(home)
            constants.HF_HUB_CACHE = str(home / "hub")
            label = f"#{i} {mutation.name}"
            for reader in HUB_READERS:
                cmd = _command(reader, home, base, folder / "hub-out")[len(GRADEXPLORER):]
                runs.append(_in_process(label, reader, lambda cmd=cmd: _cli(*cmd)))
            if i % 100 == 99:
                print(f"  ... {i + 1} caches, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
        report(f"hub mutations, in process (seed {args.seed})", runs, len(cases) * len(HUB_READERS),
               time.monotonic() - start)
        return
    jobs = []
    for i, mutation in enumerate(cases):
        home = mutated(base, mutation, folder / f"hub{i:04d}" / "home")
        reader = HUB_READERS[i % len(HUB_READERS)]
        jobs.append((f"#{i} {mutation.name}", reader, _command(reader, home, base, folder / f"hub{i:04d}" / "out"),
                     {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(home / "hub")}))
    runs, wall = _pool(jobs, args.workers, args.budget, env)
    report(f"hub mutations, fresh processes (seed {args.seed})", runs, len(jobs), wall)


def _log_reads(path: Path, csv: Path) -> tuple[int, str, str]:
    """``inspect --csv``, then what the timeline view reads of a log that passed."""
    code, err, out = _cli("inspect", path, "--csv", csv)
    if code == 0:
        from gradexplorer.recording import timeline

        try:
            for kind, stat in (("grad_output", "l2"), ("activation", "std"), ("weight", "update_ratio")):
                timeline.read_timeline(path, kind, stat)
            timeline.nonfinite_onset(path)
        except Exception as exc:  # noqa: BLE001 - counted: a log that inspect passed must read
            return 70, f"timeline: {type(exc).__name__}: {exc}", out
    return code, err, out


# -- main ----------------------------------------------------------------------------------


def _capture_section(title: str, cases: list[tuple[str, bytes]], readers: list[str], base: Path, folder: Path,
                     args: argparse.Namespace, env: dict, window: _Window | None,
                     timeline_view: _Timeline | None) -> None:
    """Each mutated capture through the readers: all of them in this process, or in turn in
    fresh processes."""
    start = time.monotonic()
    if args.in_process:
        runs: list[Run] = []
        path = folder / "m.pt"
        for i, (name, blob) in enumerate(cases):
            path.write_bytes(blob)
            label = f"#{i} {name}"
            for reader in readers:
                if reader == "window":
                    assert window is not None
                    runs.append(_in_process(label, reader, lambda: window.open(path)))
                elif reader == "timeline":
                    assert timeline_view is not None
                    runs.append(_in_process(label, reader, lambda: timeline_view.open(path, capture=True)))
                else:
                    cmd = _command(reader, path, base, folder / "out")[len(GRADEXPLORER):]
                    runs.append(_in_process(label, reader, lambda cmd=cmd: _cli(*cmd)))
            if i % 100 == 99:
                print(f"  ... {i + 1} files, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
        report(f"{title}, in process (seed {args.seed})", runs, len(cases) * len(readers), time.monotonic() - start)
        return
    jobs = []
    for i, (name, blob) in enumerate(cases):
        path = folder / f"{title[:1]}{i:05d}.pt"
        path.write_bytes(blob)
        reader = readers[i % len(readers)]
        jobs.append((f"#{i} {name}", reader, _command(reader, path, base, folder / f"out{title[:1]}{i:05d}"), {}))
    runs, wall = _pool(jobs, args.workers, args.budget, env)
    report(f"{title}, fresh processes (seed {args.seed})", runs, len(jobs), wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="capture mutations (default 2000)")
    parser.add_argument("--datasets", type=int, default=500, help="dataset-capture mutations (default 500)")
    parser.add_argument("--logs", type=int, default=100, help="watch-log mutations (default 100)")
    parser.add_argument("--hub", type=int, default=0, help="Hugging Face cache mutations (default 0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget", type=float, default=4 * 3600.0, help="wall-clock seconds for each section")
    parser.add_argument("--readers", default=",".join(READERS), help="comma-separated: " + ", ".join(READERS))
    parser.add_argument("--in-process", action="store_true",
                        help="every mutation through every reader in this process (see above)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    _limit_memory()
    from tests.capture_mutations import fuzz_cases, save, valid_capture_dict, valid_dataset_capture_dict
    from tests.log_mutations import mutated, mutations as log_mutations, valid_log

    # A PYTHONPATH given (another checkout's source roots) comes first.
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen",
           "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)}
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    # A dataset capture has no graph: its timeline (the per-batch series) stands in.
    dataset_readers = [("timeline" if r == "graph --capture" else r) for r in readers]
    with tempfile.TemporaryDirectory(prefix="gx-fuzz-") as tmp:
        folder = Path(tmp)
        env["GRADEXPLORER_SETTINGS"] = str(folder / "settings.ini")
        os.environ["GRADEXPLORER_SETTINGS"] = env["GRADEXPLORER_SETTINGS"]
        if args.hub:
            _hub_section(args, folder, env)
        window = _Window() if args.in_process and "window" in readers and args.n + args.datasets else None
        timeline_view = _Timeline() if args.in_process and window is not None else None
        data = valid_capture_dict()
        base = save(data, folder / "base.pt")
        if args.n:
            _capture_section("capture mutations", list(fuzz_cases(data, args.seed, args.n)), readers, base, folder,
                             args, env, window, timeline_view)
        if args.datasets:
            data = valid_dataset_capture_dict()
            base = save(data, folder / "dataset.pt")
            _capture_section("dataset-capture mutations", list(fuzz_cases(data, args.seed, args.datasets)),
                             [r for r in dataset_readers if r != "timeline" or timeline_view or not args.in_process],
                             base, folder, args, env, window, timeline_view)
        if not args.logs:
            return 0
        base_log = valid_log(folder / "base.gxw")
        logs = log_mutations(args.seed, args.logs)
        start = time.monotonic()
        if args.in_process:
            runs = []
            for i, mutation in enumerate(logs):
                path = mutated(base_log, mutation, folder / f"l{i % 8}.gxw")
                label = f"#{i} {mutation.name}"
                runs.append(_in_process(label, "inspect", lambda: _cli("inspect", path)))
                runs.append(_in_process(label, "inspect --csv + timeline reads",
                                        lambda: _log_reads(path, folder / "l.csv")))
                if timeline_view is not None:
                    runs.append(_in_process(label, "timeline view", lambda: timeline_view.open(path)))
            report(f"log mutations, in process (seed {args.seed})", runs, (3 if timeline_view else 2) * args.logs,
                   time.monotonic() - start)
            return 0
        jobs = []
        for i, mutation in enumerate(logs):
            path = mutated(base_log, mutation, folder / f"l{i:04d}.gxw")
            for reader in LOG_READERS:
                jobs.append((f"#{i} {mutation.name}", reader, _command(reader, path, base, folder / f"lo{i:04d}"), {}))
        runs, wall = _pool(jobs, args.workers, args.budget, env)
        report(f"log mutations, fresh processes (seed {args.seed})", runs, len(jobs), wall)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
