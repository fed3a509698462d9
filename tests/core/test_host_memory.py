"""core/host_memory.py: freed memory kept for the next capture, seen as page faults."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from core import host_memory
from tests.conftest import ROOT

# Rounds of four 48 MiB tensors, each written and then freed: what a capture's gradients
# and copies do to the C library. Prints the page faults of each round.
ROUNDS = """
import json, resource, sys, torch
from core.host_memory import reuse_freed_memory
took = reuse_freed_memory() if sys.argv[1] == "keep" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = []
for _ in range(6):
    before = faults()
    held = [torch.ones(12 << 20) for _ in range(4)]
    del held
    counts.append(faults() - before)
print(json.dumps({"took": took, "faults": counts}))
"""

glibc_only = pytest.mark.skipif(host_memory._glibc() is None, reason="needs glibc")


def _rounds(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_freed_memory_is_reused_without_faulting_it_in_again():
    pages = 4 * (48 << 20) // 4096  # one round's memory, in 4 KiB pages
    default, kept = _rounds("default"), _rounds("keep")
    assert kept["took"] is True
    # glibc's default: blocks over 32 MiB are mapped and unmapped, every round faults anew
    assert all(n > pages // 2 for n in default["faults"]), default
    # kept: the first rounds fault memory in (torch's 64-byte aligned blocks do not fit
    # exactly in the ones freed before, until glibc has sorted those), then it is reused
    assert kept["faults"][0] > pages // 2 and all(n < pages // 20 for n in kept["faults"][-2:]), kept


@glibc_only
def test_the_setting_can_be_turned_off_and_memory_given_back(monkeypatch):
    monkeypatch.setenv("GRADEXPLORER_KEEP_FREED_MEMORY", "0")
    assert host_memory.reuse_freed_memory() is False
    assert isinstance(host_memory.release_freed_memory(), bool)


def test_without_glibc_both_do_nothing(monkeypatch):
    monkeypatch.setattr(host_memory, "_glibc", lambda: None)
    assert host_memory.reuse_freed_memory() is False
    assert host_memory.release_freed_memory() is False


def test_the_command_keeps_freed_memory_before_it_runs(monkeypatch):
    """The ``gradexplorer`` entry point (``app.cli:run``, also ``python -m app``) sets it
    up, then runs ``main`` and exits with its status."""
    import app.cli as cli

    calls = []
    monkeypatch.setattr(host_memory, "reuse_freed_memory", lambda: calls.append("keep") or True)
    monkeypatch.setattr(cli, "main", lambda argv=None: calls.append("main") or 3)
    with pytest.raises(SystemExit) as exited:
        cli.run()
    assert exited.value.code == 3 and calls == ["keep", "main"]
    assert 'gradexplorer = "app.cli:run"' in (ROOT / "pyproject.toml").read_text()
    assert "run()" in (ROOT / "app" / "__main__.py").read_text()
