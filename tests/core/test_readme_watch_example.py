"""The README's watch example runs as printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_readme_watch_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- watch-example -->\s*```python\n(.*?)```\s*<!-- /watch-example -->", text, re.S)
    assert block, "the README lost its watch example"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 20
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    steps = {line.split()[0] for line in lines}
    assert steps == {"0", "10", "20"}
    assert any("layer4.1.conv2" in line for line in lines)
