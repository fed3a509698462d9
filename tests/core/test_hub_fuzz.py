"""Seeded mutations of a Hugging Face cache (tests/hub_mutations.py: config.json,
tokenizer.json, tokenizer_config.json, safetensors headers, refs/main, what a file is)
through ``gradexplorer capture --model hf:... --text``: each ends with exit 0, 1 or 2 and one
message, never 70, a traceback, a hang or a blow-up, and no mutation writes into the cache.
A small slice by default; ``GRADEXPLORER_FUZZ=1`` runs 600 (``benchmarks/fuzz.py --hub``
runs them through fresh processes too)."""

from __future__ import annotations

import os
import resource

import pytest

from gradexplorer_app.cli.main import main
from tests import hf_tiny
from tests.hub_mutations import SPEC, mutated, mutations, valid_cache

pytest.importorskip("transformers")
FULL = os.environ.get("GRADEXPLORER_FUZZ") == "1"
COUNT = 600 if FULL else 12


def _files(home):
    return sorted((str(p.relative_to(home)), p.lstat().st_size) for p in home.rglob("*"))


def test_mutated_hub_caches_through_capture_in_process(tmp_path, monkeypatch, capsys):
    base = tmp_path / "base"
    valid_cache(base)
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    outcomes = {0: 0, 1: 0, 2: 0}
    for mutation in mutations(seed=1, count=COUNT):
        home = hf_tiny.offline_home(monkeypatch, mutated(base, mutation, tmp_path / "home"))
        before = _files(home)
        code = main(["-q", "capture", "--model", SPEC, "--text", "the cat", "--out", str(tmp_path / "out.pt")])
        err = capsys.readouterr().err
        assert code in outcomes, f"{mutation.name}: exit {code}\n{err}"
        assert "Traceback" not in err and "internal error" not in err, f"{mutation.name}\n{err}"
        if code:
            lines = [line for line in err.splitlines() if line.strip()]
            assert lines[-1].startswith("error: ") and len(lines[-1]) > 30, f"{mutation.name}: {err!r}"
        assert _files(home) == before, mutation.name
        outcomes[code] += 1
    assert outcomes[1] > COUNT // 3, outcomes  # most mutations are refused, with a message
    assert outcomes[0] > 0, outcomes  # and harmless ones still load
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start
    assert grown < 2 << 30, f"the mutations raised peak memory by {grown >> 20} MiB"
