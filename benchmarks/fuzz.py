"""Mutated capture files (and watch logs, where their generator exists) through every reader.

    python -m benchmarks.fuzz [--n 2000] [--seed 0] [--workers 2] [--budget SECONDS]

Each mutated capture (dict-level edits, pickle bytes flipped, zip damage; the generator is
``tests/capture_mutations.py``'s ``fuzz_cases``) goes through one reader in turn, in a fresh
process: ``inspect``, ``inspect --layer``, ``graph --capture``, ``diff`` against the valid
file, and the window's open path (``gradexplorer FILE --screenshot``, offscreen Qt). The
counts printed: exit codes, runs past 60 s, segfaults, runs that failed without a message,
and the peak resident memory of any one run (``ru_maxrss`` of the child, from ``wait4``).
A wall-clock budget stops starting new runs; the count reached is printed. A second section
runs watch-log mutations when ``tests/log_mutations.py`` provides ``mutations(seed, n,
base_log_path)``. Figures only: nothing here asserts.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 60.0
#: The console script's own entry point, run by this interpreter.
GRADEXPLORER = [sys.executable, "-c", "import sys; from gradexplorer.app.cli.main import main; sys.exit(main())"]
READERS = ("inspect", "inspect --layer", "graph --capture", "diff", "window")


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
    return [*exe, str(path), "--screenshot", str(out.with_suffix(".png"))]


def run_one(cmd: list[str], env: dict) -> tuple[int | str, float, int, str]:
    """(exit code, or "hang" / "segfault"; seconds; peak RSS in KiB; the last stderr line)."""
    with tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
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
        lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
    code: int | str = proc.returncode
    if hung.is_set():
        code = "hang"
    elif code in (-11, 139):
        code = "segfault"
    said = [ln for ln in lines if "error" in ln.lower()]  # Qt's own warnings may come after the message
    return code, seconds, usage.ru_maxrss, (said or lines or [""])[-1]


def _report(title: str, results: list[tuple[str, str, int | str, float, int, str]], started: int,
            wanted: int, wall: float) -> None:
    codes = collections.Counter(r[2] for r in results)
    silent = [r for r in results if r[2] not in (0, "hang", "segfault") and "error" not in r[5].lower()]
    peak = max((r[4] for r in results), default=0)
    print(f"{title}: {len(results)} of {wanted} runs in {wall:.0f} s (started {started})")
    print("  exit codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items(), key=str)))
    print(f"  exit 70: {codes.get(70, 0)}   hangs over {HANG_S:.0f} s: {codes.get('hang', 0)}   "
          f"segfaults: {codes.get('segfault', 0)}   failures without a message: {len(silent)}")
    print(f"  peak memory of one run: {peak / 1024:.0f} MiB")
    slowest = max(results, key=lambda r: r[3], default=None)
    if slowest is not None:
        print(f"  slowest run: {slowest[3]:.1f} s ({slowest[1]}, {slowest[0]})")
    for r in results:
        if r[2] not in (0, 1, 2) or r in silent:
            print(f"    {r[2]}  {r[1]:<16} {r[0]}  {r[5][:160]}")


def _pool(jobs: list, workers: int, budget: float, env: dict) -> tuple[list, int, float]:
    deadline = time.monotonic() + budget
    results: list = []
    started = 0
    lock = threading.Lock()
    start = time.monotonic()

    def work(job: tuple) -> None:
        nonlocal started
        name, reader, cmd = job
        with lock:
            if time.monotonic() > deadline:
                return
            started += 1
        code, seconds, rss, last = run_one(cmd, env)
        with lock:
            results.append((name, reader, code, seconds, rss, last))
            if len(results) % 100 == 0:
                print(f"  ... {len(results)} runs", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(work, jobs))
    return results, started, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="capture mutations (default 2000)")
    parser.add_argument("--logs", type=int, default=100, help="watch-log mutations (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget", type=float, default=3600.0, help="wall-clock seconds for each section")
    parser.add_argument("--readers", default=",".join(READERS), help="comma-separated: " + ", ".join(READERS))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.capture_mutations import fuzz_cases, valid_capture_dict

    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    with tempfile.TemporaryDirectory(prefix="gx-fuzz-") as tmp:
        folder = Path(tmp)
        data = valid_capture_dict()
        base = folder / "base.pt"
        import torch
        torch.save(data, base)
        jobs = []
        for i, (name, blob) in enumerate(fuzz_cases(data, args.seed, args.n)):
            path = folder / f"m{i:05d}.pt"
            path.write_bytes(blob)
            reader = readers[i % len(readers)]
            jobs.append((f"#{i} {name}", reader, _command(reader, path, base, folder / f"out{i:05d}")))
        results, started, wall = _pool(jobs, args.workers, args.budget, env)
        _report("capture mutations", results, started, len(jobs), wall)

        try:
            from tests.log_mutations import mutations as log_mutations  # type: ignore[import-not-found]
        except ImportError:
            print("log mutations: not available")
            return 0
        from gradexplorer.recording.watch_log import WatchLog  # noqa: F401 - the log's own writer
        base_log = folder / "base.gxw"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "demo_watch_log.py"), str(base_log)],
                       check=False, env=env, capture_output=True)
        jobs = []
        for i, case in enumerate(log_mutations(args.seed, args.logs, base_log)):
            path = Path(case[1] if isinstance(case, tuple) else case)
            exe = GRADEXPLORER
            cmd = [[*exe, "inspect", str(path)], [*exe, "inspect", str(path), "--csv", str(folder / f"l{i}.csv")],
                   [*exe, "timeline", str(path), "--screenshot", str(folder / f"l{i}.png")]][i % 3]
            jobs.append((f"#{i} {case[0] if isinstance(case, tuple) else path.name}", cmd[3], cmd))
        results, started, wall = _pool(jobs, args.workers, args.budget, env)
        _report("log mutations", results, started, len(jobs), wall)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
