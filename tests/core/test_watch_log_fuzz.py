"""Seeded mutations of a watch log (tests/log_mutations.py) through every reader: ``inspect``,
``inspect --csv``, the timeline's reads, and a sample through the command line in fresh
processes (``timeline --screenshot`` too). Each ends with exit 0, 1 or 2 and a message,
never 70, a traceback or a hang. ``GRADEXPLORER_FUZZ=1`` runs thousands."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from gradexplorer_app.cli.main import main
from tests.log_mutations import mutated, mutations, valid_log

# Every test here takes a second or more (scripts/slow_tests.py): none is in make test-fast.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("GRADEXPLORER_FUZZ") == "1"
COUNT = 3000 if FULL else 300
SAMPLE = 40 if FULL else 4


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return valid_log(tmp_path_factory.mktemp("log") / "base.gxw")


def test_mutated_logs_through_inspect_and_csv_in_process(base, tmp_path, capsys):
    from gradexplorer.recording import timeline

    # ru_maxrss is the process's high-water mark: what the mutations add to it is theirs.
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    outcomes = {0: 0, 1: 0, 2: 0}
    for i, mutation in enumerate(mutations(seed=1, count=COUNT)):
        path = mutated(base, mutation, tmp_path / f"m{i % 8}.gxw")
        csv = tmp_path / "out.csv"
        code = main(["inspect", str(path), "--csv", str(csv)])
        _out, err = capsys.readouterr()
        assert code in outcomes, f"{mutation.name}: exit {code}\n{err}"
        assert "Traceback" not in err and "internal error" not in err, f"{mutation.name}\n{err}"
        if code:
            assert err.startswith("error: ") and len(err.strip()) > 20, f"{mutation.name}: {err!r}"
        else:
            for kind, stat in (("grad_output", "l2"), ("activation", "std"), ("weight", "update_ratio"),
                               ("grad_norm", "max")):
                timeline.read_timeline(path, kind, stat)
            timeline.nonfinite_onset(path)
        outcomes[code] += 1
    assert outcomes[1] > COUNT // 10, outcomes  # most mutations are refused, with a message
    assert outcomes[0] > 0, outcomes  # and harmless ones still read
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start
    assert grown < 2 << 30, f"the mutations raised peak memory by {grown >> 20} MiB"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QT_QPA_PLATFORM": "offscreen",
           "GRADEXPLORER_SETTINGS": str(cwd / "settings.ini")}
    limit = "ulimit -v 4000000; "  # 4 GB of address space: a blow-up fails instead of swapping
    command = " ".join(f"'{a}'" for a in (sys.executable, "-m", "gradexplorer", *args))
    return subprocess.run(["bash", "-c", limit + "exec " + command], capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd)


def test_a_sample_of_mutated_logs_through_the_command_line(base, tmp_path):
    chosen = mutations(seed=2, count=SAMPLE * 10)[::10]
    for i, mutation in enumerate(chosen):
        path = mutated(base, mutation, tmp_path / f"s{i}.gxw")
        for args in (["inspect", str(path)], ["inspect", str(path), "--csv", str(tmp_path / "o.csv")],
                     ["timeline", str(path), "--screenshot", str(tmp_path / "shot.png")]):
            done = _cli(*args, cwd=tmp_path)
            assert done.returncode in (0, 1, 2), f"{mutation.name} {args[0]}: {done.returncode}\n{done.stderr}"
            assert "Traceback" not in done.stderr, f"{mutation.name}\n{done.stderr}"
            if done.returncode:
                assert "error" in done.stderr.lower() or done.stderr.strip(), f"{mutation.name}: no message"
