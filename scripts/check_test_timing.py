"""Tests assert behaviour, never time: a check that `make lint` runs over tests/.

A wall-clock assert fails on a loaded machine (and each failed CI run costs a whole run), and a
test that sleeps and then asserts that something has (or has not yet) happened races the
machine's load. Timings belong in the benchmarks, which print them. This check finds, in every
``tests/**/*.py``:

- an ``assert`` whose condition reads a clock (``time.time``, ``time.monotonic``,
  ``time.perf_counter``, their ``_ns`` forms) or a name computed from one (``seconds =
  time.perf_counter() - start``; ``deadline = time.monotonic() + 10``);
- a ``time.sleep(...)`` statement in a test function's own body (not inside a loop): a sleep
  then an assert. Polling until a condition holds, inside a ``while`` or ``for``, is fine:
  pytest-timeout (``timeout`` in pyproject.toml) ends a poll that never succeeds.

Code inside strings (a model factory written to a file) is not read. Exit status 1 lists each
place with its line.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOCKS = {"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns"}


def _is_clock_call(node: ast.AST, timers: frozenset[str] = frozenset()) -> bool:
    """A call of a clock, or of a function of the same file that returns a time it read."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name) and func.id in timers:
        return True
    if isinstance(func, ast.Attribute) and func.attr in CLOCKS:
        return isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in {"monotonic", "perf_counter"}


def _reads_clock(node: ast.AST, timed: set[str], timers: frozenset[str] = frozenset()) -> bool:
    return any(_is_clock_call(n, timers) or (isinstance(n, ast.Name) and n.id in timed) for n in ast.walk(node))


def _timers(tree: ast.Module) -> frozenset[str]:
    """The functions of a file that return a time they read (``return procs, time.monotonic() - t``)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            timed = _timed_names(node)
            returns = [n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None]
            if any(_reads_clock(r.value, timed) for r in returns if r.value is not None):
                found.add(node.name)
    return frozenset(found)


def _timed_names(scope: ast.AST, timers: frozenset[str] = frozenset()) -> set[str]:
    """Names assigned, in ``scope``, from an expression that reads a clock (to a fixed point)."""
    timed: set[str] = set()
    assigns = [n for n in ast.walk(scope) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))]
    grew = True
    while grew:
        grew = False
        for node in assigns:
            if node.value is None or not _reads_clock(node.value, timed, timers):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and name.id not in timed:
                        timed.add(name.id)
                        grew = True
    return timed


def _is_sleep(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        return False
    func = stmt.value.func
    return (isinstance(func, ast.Attribute) and func.attr == "sleep"
            and isinstance(func.value, ast.Name) and func.value.id == "time")


def _straight_line(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a body outside loops (and outside nested functions and classes)."""
    for stmt in body:
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)):
            continue
        yield stmt
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                yield from _straight_line(inner)
        for handler in getattr(stmt, "handlers", []):
            yield from _straight_line(handler.body)


def problems(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    timers = _timers(tree)
    for function in functions:
        timed = _timed_names(function, timers)
        for node in ast.walk(function):
            if isinstance(node, ast.Assert) and _reads_clock(node.test, timed, timers):
                yield f"{shown}:{node.lineno}: an assert on the wall clock (a timing belongs in a benchmark)"
        if function.name.startswith("test"):
            for stmt in _straight_line(function.body):
                if _is_sleep(stmt):
                    yield (f"{shown}:{stmt.lineno}: time.sleep in a test's body (wait for the event itself, "
                           "or poll for it in a loop)")


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [ROOT / "tests"]
    files = sorted(p for root in roots for p in ([root] if root.is_file() else root.rglob("*.py")))
    found = [line for path in files for line in problems(path.resolve())]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
