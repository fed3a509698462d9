"""The program asks torch for 2 MiB pages on Linux (``app/__init__.py``), in a fresh
process as the ``gradexplorer`` command starts, and keeps what the user set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

linux = sys.platform.startswith("linux")
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
thp_mode = _THP.read_text().split("[")[1].split("]")[0] if linux and _THP.exists() else "none"

# A 64 MiB tensor written through, then the process's huge pages as the kernel counts them.
PROBE = """
import json, os, sys
import app
import torch
t = torch.empty(64 << 20, dtype=torch.uint8)
t.fill_(1)
huge = 0
for line in open("/proc/self/smaps_rollup"):
    if line.startswith("AnonHugePages:"):
        huge = int(line.split()[1])
print(json.dumps({"env": os.environ.get("THP_MEM_ALLOC_ENABLE"), "huge_kib": huge}))
"""


def _probe(value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = value
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not linux, reason="torch's huge-page allocation is Linux only")
def test_the_program_turns_huge_pages_on_and_keeps_the_users_choice():
    assert _probe(None)["env"] == "1"
    assert _probe("0")["env"] == "0"


@pytest.mark.skipif(thp_mode != "madvise", reason=f"transparent huge pages are '{thp_mode}', not 'madvise'")
def test_torch_really_allocates_huge_pages_when_the_program_starts_first():
    # Under "madvise" only torch's madvise() gives huge pages: with the setting on, a big
    # tensor lands (at least partly) in them; turned off, none does.
    assert _probe(None)["huge_kib"] > 0
    assert _probe("0")["huge_kib"] == 0
