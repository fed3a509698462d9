"""Malformed capture files through every front end: the CLI's inspect, diff and graph
--capture (exit status and one message naming the field, never exit 70 or a traceback),
and the window's open and compare (a dialog; the previous capture stays on screen).

The fuzz mutates the fields of a valid capture (types, missing keys, values, shapes,
2,000-deep nesting), seeded; a mutation the schema accepts must then read cleanly."""

from __future__ import annotations

import contextlib
import io

import pytest

from gradexplorer_app.cli.common import EXIT_INTERNAL, EXIT_OK, EXIT_USER
from gradexplorer_app.cli.diff import EXIT_DIVERGED, EXIT_SAME, EXIT_TROUBLE
from gradexplorer_app.cli.main import main
from tests.app.conftest import TIMEOUT
from tests.capture_mutations import Mutation, mutations, names_the_field, save, valid_capture_dict


@pytest.fixture(scope="module")
def valid() -> dict:
    return valid_capture_dict()


def run_cli(*argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, err.getvalue()


def check_refusal(code: int, err: str, mutation: Mutation, refused_code: int) -> None:
    assert code != EXIT_INTERNAL and "Traceback" not in err, f"{mutation}: {err}"
    if code == refused_code:
        lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
        assert len(lines) == 1, f"{mutation}: {err}"
        assert names_the_field(lines[0], mutation), f"{mutation}: {lines[0]}"


@pytest.mark.slow
def test_fuzzed_captures_give_one_message_naming_the_field(tmp_path, valid):
    base = save(valid, tmp_path / "base.pt")
    variants = mutations(valid, seed=9, limit=300)
    assert len(variants) >= 300
    refused = 0
    for i, mutation in enumerate(variants):
        path = save(mutation.apply(valid), tmp_path / f"v{i}.pt")
        code, err = run_cli("inspect", path)
        assert code in (EXIT_OK, EXIT_USER), f"{mutation}: exit {code}: {err}"
        check_refusal(code, err, mutation, EXIT_USER)
        if mutation.must_fail:
            assert code == EXIT_USER, f"{mutation} was accepted"
        refused += code == EXIT_USER
        if i % 4 == 0:  # diff and graph read through the same loader; a quarter of the variants
            code, err = run_cli("diff", base, path)
            assert code in (EXIT_SAME, EXIT_DIVERGED, EXIT_TROUBLE), f"{mutation}: exit {code}: {err}"
            check_refusal(code, err, mutation, EXIT_TROUBLE)  # diff(1): 2 when a file cannot be read
            code, err = run_cli("graph", "--capture", path, "--out", tmp_path / "g.json")
            assert code in (EXIT_OK, EXIT_USER), f"{mutation}: exit {code}: {err}"
            check_refusal(code, err, mutation, EXIT_USER)
    assert refused >= len(variants) * 0.6  # most mutations break the schema, and are refused


def test_the_message_reads_as_the_cli_prints_it(tmp_path, valid):
    data = Mutation(("layers", "fc1", "calls", 0, "stats", "grad_output", "mean"), "type", "big").apply(valid)
    code, err = run_cli("inspect", save(data, tmp_path / "capture.pt"))
    assert code == EXIT_USER
    assert err.strip() == (
        "error: 'capture.pt': field layers['fc1'].calls[0].stats.grad_output.mean is a str, expected a number. "
        "The file is not a valid gradexplorer capture (damaged, or changed by another program); export the "
        "capture again.")


# -- the window ----------------------------------------------------------------------------

WINDOW_CASES = [
    Mutation(("layers", "fc1", "calls", 0, "stats", "activation", "mean"), "type", "0.5"),
    Mutation(("layers", "fc1", "calls"), "type", {"0": 1}),
    Mutation(("meta", "notes"), "deep", None),
    Mutation(("version",), "type", "2"),
    Mutation(("graph", "edges", 0, "src"), "value", "nowhere"),
    Mutation(("input",), "shape", None),
]


def _variant(valid: dict, mutation: Mutation) -> dict:
    from tests.capture_mutations import deep

    if mutation.kind == "deep":
        mutation = Mutation(mutation.path, "deep", deep())
    if mutation.kind == "shape":
        mutation = Mutation(mutation.path, "shape", valid["input"].reshape(-1))
    return mutation.apply(valid)


@pytest.mark.slow
def test_the_window_shows_a_dialog_and_keeps_the_previous_capture(qtbot, window, shown_errors, tmp_path, valid):
    good = save(valid, tmp_path / "good.pt")
    with qtbot.waitSignal(window.file_done, timeout=TIMEOUT) as done:
        window.open_capture(str(good))
    assert done.args == ["open"]
    shown = window.session.capture
    names = list(shown.layers)
    for i, mutation in enumerate(WINDOW_CASES):
        path = save(_variant(valid, mutation), tmp_path / f"bad{i}.pt")
        with qtbot.waitSignal(window.file_done, timeout=TIMEOUT) as done:
            window.open_capture(str(path))
        assert done.args == ["failed"], mutation
        title, exc = shown_errors[-1]
        assert f"bad{i}.pt" in str(exc) and "field " in str(exc), str(exc)
        assert names_the_field(str(exc), mutation) or mutation.path == ("input",), str(exc)
        assert window.session.capture is shown  # the previous capture stays on screen
        assert window.tree_view.tree_model.index_of(names[0]).isValid()
    assert len(shown_errors) == len(WINDOW_CASES)
    # Still usable: the next good file opens.
    with qtbot.waitSignal(window.file_done, timeout=TIMEOUT) as done:
        window.open_capture(str(good))
    assert done.args == ["open"] and window.session.capture is not shown


def test_compare_with_a_malformed_file_shows_a_dialog(qtbot, shown_errors, tmp_path, valid):
    from gradexplorer_app.window.compare_window import CompareWindow

    good = save(valid, tmp_path / "good.pt")
    bad = save(_variant(valid, WINDOW_CASES[0]), tmp_path / "bad.pt")
    w = CompareWindow(None)
    qtbot.addWidget(w)
    with qtbot.waitSignal(w.runner.finished, timeout=TIMEOUT):
        w.compare_files(str(good), str(good))
    before = w.view.result
    with qtbot.waitSignal(w.runner.failed, timeout=TIMEOUT):
        w.compare_files(str(good), str(bad))
    assert shown_errors[-1][0] == "Cannot compare"
    assert "field layers['fc1'].calls[0].stats.activation.mean is a str" in str(shown_errors[-1][1])
    assert w.view.result is before  # the previous comparison stays


@pytest.mark.slow
def test_gradexplorer_capture_file_opens_it_in_the_window_or_says_which_field(tmp_path, valid):
    """``gradexplorer CAPTURE.pt --screenshot``: the capture on screen (exit 0), or, for a
    malformed file, exit 1 with the field named on stderr (nobody sees the dialog)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", GRADEXPLORER_SETTINGS=str(tmp_path / "s.ini"),
               PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    good = save(valid, tmp_path / "good.pt")
    bad = save(_variant(valid, WINDOW_CASES[0]), tmp_path / "bad.pt")
    for path, code in ((good, 0), (bad, 1)):
        shot = tmp_path / f"{path.stem}.png"
        result = subprocess.run([sys.executable, "-m", "gradexplorer", str(path), "--screenshot", str(shot)],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert result.returncode == code, result.stderr[-2000:]
        assert shot.stat().st_size > 0 and "Traceback" not in result.stderr
    assert "field layers['fc1'].calls[0].stats.activation.mean is a str" in result.stderr
