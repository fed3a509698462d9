"""The code checks that `make test` runs before the tests (and so `.ci/run` too).

- ruff: style and likely bugs, on the whole repository ([tool.ruff] in pyproject.toml);
- mypy: the types of the package, core/ and app/ ([tool.mypy]);
- import-linter: the architecture's import rules ([tool.importlinter]): the engine imports
  neither gradexplorer_app nor Qt, pyqtgraph, superqt or qtpy; the command line imports no
  Qt; the subpackages are layered;
- test timing: no test asserts on the wall clock or sleeps then asserts
  (scripts/check_test_timing.py); timings live in the benchmarks.

mypy and import-linter read the two packages from their source roots, core/ and app/: each
runs from the repository root as it is (`.venv/bin/mypy`, `.venv/bin/lint-imports`).

All four run, each says what failed and how to fix it, and the exit status is 1 when any
failed. Run it alone with `make lint` or `.venv/bin/python scripts/check_code.py`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

CHECKS = [
    (
        "ruff",
        [PY, "-m", "ruff", "check", "--quiet", "."],
        ("ruff found the problems listed above. Many fix themselves with "
         "`.venv/bin/python -m ruff check --fix .`; the rules are under [tool.ruff] in pyproject.toml "
         "(a deliberate exception takes `# noqa: CODE - why` on its line)."),
    ),
    (
        "mypy",
        [PY, "-m", "mypy"],
        ("mypy found type errors (listed above). Give the function the annotations it lacks or "
         "fix the type; rerun with `.venv/bin/mypy` from the repository root. Settings: [tool.mypy] in "
         "pyproject.toml."),
    ),
    (
        "import-linter",
        [PY, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
        ("An import breaks the architecture (the chain is shown above): the engine (core/) never imports "
         "gradexplorer_app (app/) or any Qt/plot package, the command line (gradexplorer_app.cli) imports no Qt, "
         "and a subpackage imports only from the layers below it (the list is in pyproject.toml). Move the "
         "code to the layer where it belongs; contracts: [tool.importlinter] in pyproject.toml."),
    ),
    (
        "test timing",
        [PY, "scripts/check_test_timing.py"],
        ("A test above asserts on the wall clock or sleeps and then asserts: on a loaded machine it fails. "
         "Assert the behaviour (the run had ended when close returned; the flag was set at this call), let "
         "pytest-timeout catch a hang, and print the time or move it to a benchmark (benchmarks/)."),
    ),
]


def main() -> int:
    failed = []
    for name, command, advice in CHECKS:
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode == 0:
            print(f"check {name}: ok ({seconds:.1f} s)", flush=True)
            continue
        failed.append(name)
        output = (proc.stdout + proc.stderr).strip()
        # import-linter opens with a drawn banner: leave it out.
        output = "\n".join(line for line in output.splitlines() if not set(line) & set("╔╗╚╝║═▶◀")).strip()
        print(f"check {name}: FAILED ({seconds:.1f} s)\n{output}\n\n>>> {advice}\n", flush=True)
    if failed:
        print(f"Code checks failed: {', '.join(failed)}. `make test` runs the tests once they pass.", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
