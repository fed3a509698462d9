"""Which tests are slow, by the rule that `make test-fast` relies on, and are they marked so.

The rule (docs/development.md, "Tiers"): a test function is slow when one of its cases takes
THRESHOLD seconds or more (setup + call + teardown) in a whole run's `--durations=0` report
(in one process: two processes share the cores and inflate each test's time);
`@pytest.mark.slow` then goes on the function, so all of its cases leave the fast tier. So that
the fast tier still touches every test file, a file in which the rule would leave no test keeps
its quickest one in the fast tier when that one takes under KEEP_UNDER seconds.

    make test PYTEST_WORKERS=0 PYTEST_ARGS="--durations=0" 2>&1 | tee durations.txt
    .venv/bin/python scripts/slow_tests.py durations.txt

collects the suite (without running it), prints the functions to mark and those marked that
the report no longer finds slow, and exits 1 when a slow function is unmarked. `--list` prints
only the node ids of the slow functions, one a line.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections import defaultdict
from pathlib import Path

THRESHOLD = 1.0
KEEP_UNDER = 3.0

_LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S.*?)\s*$")


def case_seconds(report: Path) -> dict[str, float]:
    """Seconds of each test case (setup + call + teardown) in a `--durations=0` report."""
    seconds: dict[str, float] = defaultdict(float)
    for line in report.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if m:
            seconds[m.group(3)] += float(m.group(1))
    return seconds


def function_of(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


def collected() -> dict[str, bool]:
    """Every test function of the suite, and whether it carries the `slow` mark."""
    import pytest

    marks: dict[str, bool] = {}

    class Recorder:
        def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
            for item in items:
                fn = function_of(item.nodeid)
                marks[fn] = marks.get(fn, False) or item.get_closest_marker("slow") is not None

    with contextlib.redirect_stdout(sys.stderr):  # the listing is this script's output
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"],
                           plugins=[Recorder()])
    if code not in (0, 5):
        sys.exit(f"collecting the suite failed (pytest exit {code})")
    return marks


def slow_functions(seconds: dict[str, float], functions: list[str]) -> set[str]:
    """The functions the rule calls slow, given each case's seconds and every function."""
    worst: dict[str, float] = defaultdict(float)
    for nodeid, s in seconds.items():
        fn = function_of(nodeid)
        worst[fn] = max(worst[fn], s)
    slow = {fn for fn in functions if worst.get(fn, 0.0) >= THRESHOLD}
    by_file: dict[str, list[str]] = defaultdict(list)
    for fn in functions:
        by_file[fn.split("::", 1)[0]].append(fn)
    for fns in by_file.values():
        if all(fn in slow for fn in fns):
            quickest = min(fns, key=lambda fn: worst.get(fn, 0.0))
            if worst.get(quickest, 0.0) < KEEP_UNDER:
                slow.discard(quickest)
    return slow


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="pytest output with --durations=0")
    parser.add_argument("--list", action="store_true", help="print the slow functions only")
    args = parser.parse_args()
    seconds = case_seconds(args.report)
    if not seconds:
        sys.exit(f"{args.report} has no durations: run pytest with --durations=0")
    marks = collected()
    slow = slow_functions(seconds, sorted(marks))
    if args.list:
        print("\n".join(sorted(slow)))
        return 0
    unmarked = sorted(fn for fn in slow if not marks[fn])
    # Only a clear miss is reported the other way: a marked test near the threshold may be
    # slow on the next run.
    worst: dict[str, float] = defaultdict(float)
    for nodeid, s in seconds.items():
        worst[function_of(nodeid)] = max(worst[function_of(nodeid)], s)
    quick = sorted(fn for fn, m in marks.items()
                   if m and fn not in slow and worst.get(fn, 0.0) < THRESHOLD / 2)
    for fn in unmarked:
        print(f"mark slow ({worst[fn]:.1f} s): {fn}")
    for fn in quick:
        print(f"marked slow, now {worst.get(fn, 0.0):.2f} s: {fn}")
    print(f"{len(slow)} slow functions of {len(marks)}; {len(unmarked)} unmarked")
    return 1 if unmarked else 0


if __name__ == "__main__":
    sys.exit(main())
