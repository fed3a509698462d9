"""A seeded fuzz of capture files (dict edits, pickle bytes flipped, zip damage) through the
readers in-process, a sample through the CLI's subprocesses, and the window's open path
headless; and the hostile files that once crashed a reader, one test each.

Every run ends with exit 0, 1 or 2 (a failure with one ``error:`` message), never 70, a
traceback, a hang or a segfault. ``GRADEXPLORER_FUZZ=1`` runs thousands instead of a few
hundred; ``python -m benchmarks.fuzz`` runs each through a fresh process and prints counts.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradexplorer_app.cli.common import EXIT_INTERNAL
from gradexplorer_app.cli.main import main
from tests.app.conftest import TIMEOUT
from tests.capture_mutations import (
    _hostile_values,
    draw_every_view,
    fuzz_cases,
    save,
    valid_capture_dict,
    valid_dataset_capture_dict,
)

FULL = os.environ.get("GRADEXPLORER_FUZZ") == "1"
N_IN_PROCESS = 3000 if FULL else 240
N_SUBPROCESS = 200 if FULL else 5
N_WINDOW = 600 if FULL else 40
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def valid() -> dict:
    return valid_capture_dict()


def run_cli(*argv, stdout: list[str] | None = None) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    if stdout is not None:
        stdout.append(out.getvalue())
    return code, err.getvalue()


def _said(code: int, err: str, what: str, verdict: str = "") -> None:
    """Exit 0, or 1 or 2 with one message; ``diff`` exits 1 with its verdict when the files
    differ (``verdict``: its standard output)."""
    assert code in (0, 1, 2) and code != EXIT_INTERNAL, f"{what}: exit {code}: {err[-1500:]}"
    assert "Traceback" not in err, f"{what}: {err[-1500:]}"
    if code == 1 and "result     DIVERGED" in verdict:
        return
    if code:
        assert "error: " in err, f"{what}: exit {code} without a message: {err[-500:]}"


@pytest.mark.slow
def test_fuzzed_captures_through_the_readers(tmp_path, valid):
    base = save(valid, tmp_path / "base.pt")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    slowest = (0.0, "")
    for i, (name, blob) in enumerate(fuzz_cases(valid, seed=1, n=N_IN_PROCESS)):
        path = tmp_path / "m.pt"
        path.write_bytes(blob)
        reader = ("inspect", "layer", "graph", "diff")[i % 4]
        argv = {"inspect": ("inspect", path), "layer": ("inspect", path, "--layer", "fc1"),
                "graph": ("graph", "--capture", path, "--out", tmp_path / "g.svg"),
                "diff": ("diff", base, path)}[reader]
        t = time.monotonic()
        out: list[str] = []
        code, err = run_cli(*argv, stdout=out)
        _said(code, err, f"#{i} {name} through {reader}", out[0] if reader == "diff" else "")
        slowest = max(slowest, (time.monotonic() - t, f"#{i} {name} through {reader}"))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < 2 * 1024 * 1024, f"peak memory grew by {grown / 1024:.0f} MiB"  # KiB on Linux
    # A hang is pytest-timeout's to catch; the time is a figure, not a verdict.
    print(f"slowest case: {slowest[1]}, {slowest[0]:.1f} s")


@pytest.mark.slow
def test_fuzzed_captures_through_the_cli_processes(tmp_path, valid):
    """A sample in fresh processes, as a user runs them: the exit status and one message."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               GRADEXPLORER_SETTINGS=str(tmp_path / "s.ini"))
    cases = list(fuzz_cases(valid, seed=2, n=len(_hostile_values(valid)) + 200))
    picked = [c for i, c in enumerate(cases) if i % max(1, len(cases) // N_SUBPROCESS) == 0][:N_SUBPROCESS]
    for i, (name, blob) in enumerate(picked):
        path = tmp_path / f"m{i}.pt"
        path.write_bytes(blob)
        result = subprocess.run([sys.executable, "-m", "gradexplorer", "inspect", str(path)], env=env,
                                cwd=tmp_path, capture_output=True, text=True, timeout=120)
        _said(result.returncode, result.stderr, name)


def _switch_every_view(qtbot, window) -> None:
    draw_every_view(window, lambda: qtbot.wait(1))


@pytest.mark.slow
def test_fuzzed_captures_through_the_window(qtbot, window, shown_errors, tmp_path, valid):
    """The window's open path, headless: a dialog or the capture on screen, every view tab
    drawn (NaN, empty or complex arrays once crashed the plotting library)."""
    for i, (name, blob) in enumerate(fuzz_cases(valid, seed=3, n=N_WINDOW)):
        path = tmp_path / f"w{i}.pt"
        path.write_bytes(blob)
        errors = len(shown_errors)
        with qtbot.waitSignal(window.file_done, timeout=TIMEOUT) as done:
            window.open_capture(str(path))
        assert done.args in (["open"], ["failed"]), name
        if done.args == ["failed"]:
            assert len(shown_errors) == errors + 1, name
            assert "Traceback" not in str(shown_errors[-1][1])
        _switch_every_view(qtbot, window)


@pytest.fixture(scope="module")
def valid_dataset() -> dict:
    return valid_dataset_capture_dict()


@pytest.mark.slow
def test_fuzzed_dataset_captures_through_the_readers(tmp_path, valid_dataset):
    """The parts only a dataset capture has (each record's exact merge, the log2 edges, the
    per-batch series) through the readers, and the timeline's series of a file that opens."""
    from gradexplorer.files.capture_file import load_capture
    from gradexplorer.recording.timeline import capture_onset, timeline_from_capture

    base = save(valid_dataset, tmp_path / "base.pt")
    for i, (name, blob) in enumerate(fuzz_cases(valid_dataset, seed=4, n=N_IN_PROCESS // 2)):
        path = tmp_path / "m.pt"
        path.write_bytes(blob)
        for argv in (("inspect", path), ("inspect", path, "--layer", "fc1"), ("diff", base, path)):
            out: list[str] = []
            code, err = run_cli(*argv, stdout=out)
            _said(code, err, f"#{i} {name} through {argv[0]}", out[0] if argv[0] == "diff" else "")
        if code == 0 or "DIVERGED" in out[0]:
            cap = load_capture(path)
            for kind in ("grad_output", "activation"):
                for stat in cap.meta["dataset"]["series"]["fields"]:
                    timeline_from_capture(cap, kind, stat)
            capture_onset(cap)


@pytest.mark.slow
def test_fuzzed_dataset_captures_through_the_window(qtbot, window, shown_errors, tmp_path, valid_dataset):
    """A damaged exact merge drawn by the histogram view once crashed the window (SIGSEGV)."""
    for i, (name, blob) in enumerate(fuzz_cases(valid_dataset, seed=5, n=N_WINDOW // 2)):
        path = tmp_path / f"d{i}.pt"
        path.write_bytes(blob)
        errors = len(shown_errors)
        with qtbot.waitSignal(window.file_done, timeout=TIMEOUT) as done:
            window.open_capture(str(path))
        assert done.args in (["open"], ["failed"]), name
        if done.args == ["failed"]:
            assert len(shown_errors) == errors + 1, name
        _switch_every_view(qtbot, window)


@pytest.mark.parametrize("name, field", [
    ("merged hist of 3 bins", "merged.hist has 3 bins, but hist has 261"),
    ("merged {}", "merged.numel is missing"),
    ("merged of wrong types", "merged.numel is -5"),
    ("merged hist negative", "merged.hist holds negative values"),
    ("hist_edges of 10", "hist has 261 log2 bins, but the capture's histogram edges make 9"),
    ("series rows of another width", "has shape (2, 1), expected (3, 5)"),
    ("series batch list longer", "expected (103, 5)"),
    ("snr of wrong types", "snr['fc1.weight'] is a str"),
])
def test_a_damaged_dataset_capture_is_refused_by_name(tmp_path, valid_dataset, name, field):
    import copy

    from tests.capture_mutations import _dataset_hostile_values

    data = copy.deepcopy(valid_dataset)
    dict(_dataset_hostile_values(valid_dataset))[name](data)
    code, err = run_cli("inspect", save(data, tmp_path / "h.pt"))
    assert code == 1 and field in err, err


# -- the files that once crashed a reader ------------------------------------------------


def _hostile(valid: dict, tmp_path: Path, name: str) -> Path:
    import copy

    edit = dict(_hostile_values(valid))[name]
    data = copy.deepcopy(valid)
    edit(data)
    return save(data, tmp_path / "h.pt")


@pytest.mark.parametrize("name, field", [
    ("complex output", "field output is a complex64 tensor"),
    ("(0, 5) activation", "activation has shape (0, 5), no samples"),
    ("NaN hist", "hist holds NaN"),
    ("negative hist", "hist holds negative values"),
    ("zero-sample input", "field input has shape (0, 10), no samples"),
])
def test_exotic_tensors_are_refused_by_name(tmp_path, valid, name, field):
    code, err = run_cli("inspect", _hostile(valid, tmp_path, name))
    assert code == 1 and field in err, err


def test_nan_hist_edges_of_a_dataset_capture_are_refused(tmp_path, valid):
    import torch

    data = dict(valid)
    data["meta"] = dict(valid["meta"], dataset={"hist_edges": torch.tensor([0.0, float("nan"), 1.0])})
    code, err = run_cli("inspect", save(data, tmp_path / "d.pt"))
    assert code == 1 and "hist_edges holds NaN" in err, err


@pytest.mark.parametrize("name, field", [
    ("empty graph", "field graph.nodes is empty"),
    ("graph self parent", "the parents form a cycle"),
    ("graph cycle", "the parents form a cycle"),
    ("node_values ''", "graph.meta.node_values[''] names a node the graph does not have"),
    ("1200-deep graph", "more than 128 containers deep"),
    ("3000-deep layer name", "nested at most 128 modules deep"),
])
def test_a_damaged_carried_graph_is_refused_by_name(tmp_path, valid, name, field):
    for argv in (("inspect", "{}"), ("graph", "--capture", "{}", "--out", str(tmp_path / "g.svg"))):
        code, err = run_cli(*(a.format(_hostile(valid, tmp_path, name)) for a in argv))
        assert code == 1 and field in err, err


def test_a_deep_parent_chain_lays_out_in_linear_time():
    """Each view of the graph is one pass over its nodes, whatever their depth: the collapse
    depth search visits every depth (once cubic: depth 1000 took 34 s)."""
    from gradexplorer.model_graph.graph import GraphNode, ModelGraph

    nodes = [GraphNode(f"c{i}", "module", f"c{i}", "T", 0, f"c{i - 1}" if i else None) for i in range(128)]
    nodes += [GraphNode(f"leaf{j}", "op", "add", "add", None, "c127") for j in range(5000)]
    graph = ModelGraph(nodes, [])
    calls = 0
    real = ModelGraph.ancestors

    def counted(self, nid):
        nonlocal calls
        calls += 1
        return real(self, nid)

    ModelGraph.ancestors = counted  # type: ignore[method-assign]
    try:
        graph.default_depth(max_visible=10_000)
        view = graph.view(graph.expanded_to_depth(200))
    finally:
        ModelGraph.ancestors = real  # type: ignore[method-assign]
    assert calls == 0  # no per-node walk up the chain
    assert len(view.nodes) == 5000


def test_a_layer_named_3000_deep_builds_its_tree():
    from gradexplorer.pipeline.session import tree_from_names

    tree = tree_from_names(["a." * 3000 + "b"])
    assert len(tree) == 3002


def test_huge_gradient_norms_do_not_overflow(tmp_path, valid):
    for argv in (("inspect", "{}"), ("inspect", "{}", "--layer", "fc1")):
        code, err = run_cli(*(a.format(_hostile(valid, tmp_path, "l2 1e308")) for a in argv))
        assert code == 0, err


def test_a_huge_histogram_is_refused_before_it_is_read(tmp_path, valid):
    base = save(valid, tmp_path / "base.pt")
    code, err = run_cli("diff", base, _hostile(valid, tmp_path, "1e12-element hist"))
    # refused by its size before it is read: by the memory check (the declared elements) or by
    # the schema (the bins a histogram may have), whichever looks first
    assert code in (1, 2) and ("hist has 1,000,000,000,000 values, expected at most 65,536" in err
                               or "1,000,000,000,000 elements" in err), err


def test_sizes_and_labels_past_any_machine_are_refused(tmp_path):
    out = tmp_path / "o.pt"
    code, err = run_cli("capture", "--model", "demo:seed-mlp", "--random", "2x10", "--memory-budget", "9" * 400,
                        "--out", out)
    assert code == 1 and "larger than any memory" in err, err
    code, err = run_cli("capture", "--model", "demo:seed-mlp", "--random", "2x10", "--labels", "1" + "0" * 400,
                        "--out", out)
    assert code == 1 and "far too large to be a class" in err, err


def test_an_input_file_with_no_samples_is_refused_as_random_0x10_is(tmp_path):
    import torch

    torch.save(torch.zeros(0, 10), tmp_path / "z.pt")
    out = tmp_path / "o.pt"
    code, err = run_cli("capture", "--model", "demo:seed-mlp", "--input", tmp_path / "z.pt", "--out", out)
    assert code == 1 and "the input has shape (0, 10): no samples" in err, err
    assert not out.exists()
