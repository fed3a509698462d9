"""How fast, and at what memory, inputs too large for the memory budget are refused: a
Hugging Face config that declares 38 GB of parameters (its weights missing), one of a
million layers, a 3 GB text file, and 200,000 lines of text; and what a thumbnail of a
sample that declares 1 GiB in 4 bytes (``torch.zeros(1).expand(16384, 16384)``) costs.

    python -m benchmarks.hub_refusals [--repeats 5] [--budget 4GiB]

Each case runs in a fresh process (imports done first: torch, transformers and the loader,
which are not what is measured), ``--repeats`` times, the cases interleaved. Figures, median
and range over the repeats: the CPU time and the wall time of the call that refuses, and the
resident memory the process gained during it (``ru_maxrss`` after, less before). The
refusal's message is printed once. Nothing here asserts: the tests assert the refusals
themselves, under an address-space cap (``tests/core/test_hub_hostile.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    import torch, transformers
    import gradexplorer.models.loading, gradexplorer.models.hf_models, gradexplorer.batches.sources
    from gradexplorer.models import load_model
    from gradexplorer.batches import load_batch
    from gradexplorer.base.errors import GradExplorerError
    case, folder, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if case == "thumbnail":
        from PySide6.QtWidgets import QApplication
        from gradexplorer_app.window.batch_panel import tensor_to_pixmap
        app = QApplication.instance() or QApplication([])
        call = lambda: tensor_to_pixmap(torch.zeros(1).expand(16384, 16384))
    elif case in ("text file", "text lines"):
        loaded = load_model("hf:" + folder + "/gpt2")
        name = "big.txt" if case == "text file" else "lines.txt"
        call = lambda: load_batch(["text:" + folder + "/" + name], loaded, memory_budget=budget)
    else:
        call = lambda: load_model("hf:" + folder + "/" + case.replace(" ", "-"), memory_budget=budget)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        call()
        said = "(no refusal)"
    except GradExplorerError as exc:
        said = f"{type(exc).__name__}: {exc}"
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print("RESULT " + json.dumps({"cpu": cpu, "wall": wall, "grown_kib": grown, "said": said}))
""")

CASES = ("38 GB config", "million layers", "text file", "text lines", "thumbnail")


def _prepare(folder: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from tests import hf_hostile, hf_tiny

    hf_tiny.save("gpt2", folder / "gpt2")
    for name, changes in (("38-GB-config", {"n_embd": 8192, "n_head": 64, "n_layer": 8, "vocab_size": 370_000}),
                          ("million-layers", {"n_layer": 1_000_000})):
        hf_tiny.copy(folder / "gpt2", folder / name)
        hf_hostile.edit_json(folder / name / "config.json", lambda c, changes=changes: c.update(changes))
    (folder / "38-GB-config" / "model.safetensors").unlink()
    with open(folder / "big.txt", "wb") as f:
        f.truncate(3 << 30)  # sparse: 3 GB declared, nothing on disk
    (folder / "lines.txt").write_text("\n".join(" ".join(hf_tiny.WORDS[:10]) for _ in range(200_000)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hub_refusals", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", default="4GiB", help="--memory-budget of the refusals (default 4GiB)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from gradexplorer.base.units import parse_size

    budget = parse_size(args.budget)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    results: dict[str, list[dict]] = {case: [] for case in CASES}
    with tempfile.TemporaryDirectory(prefix="gx-refusals-") as tmp:
        folder = Path(tmp)
        _prepare(folder)
        for _ in range(args.repeats):
            for case in CASES:
                done = subprocess.run([sys.executable, "-c", _CHILD, case, str(folder), str(budget)],
                                      capture_output=True, text=True, env=env, timeout=600)
                line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
                if line is None:
                    print(f"{case}: failed\n{done.stderr[-2000:]}")
                    return 1
                results[case].append(json.loads(line[len("RESULT "):]))
    print(f"budget {args.budget}, {args.repeats} fresh processes each, median (range)")
    print(f"{'case':<16} {'CPU s':>18} {'wall s':>18} {'memory gained MiB':>22}")
    for case, runs in results.items():
        def fmt(values: list[float]) -> str:
            return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"
        grown = [r["grown_kib"] / 1024 for r in runs]
        print(f"{case:<16} {fmt([r['cpu'] for r in runs]):>18} {fmt([r['wall'] for r in runs]):>18} "
              f"{statistics.median(grown):>10.0f} ({min(grown):.0f}-{max(grown):.0f})")
    for case, runs in results.items():
        print(f"  {case}: {runs[0]['said'][:220]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
