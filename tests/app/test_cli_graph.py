"""``gradexplorer graph``: the JSON contract, pictures, no Qt for JSON/DOT, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from gradexplorer.model_graph.graph import ModelGraph
from tests.app.test_cli import QT_MODULES, ROOT, assert_user_error, run, subprocess_env

FACTORY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class TwoBranch(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 3)
            self.b = nn.Sequential(nn.Linear(4, 5), nn.Tanh())
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(torch.cat([self.a(x), self.b(x)], dim=1))


    def make():
        torch.manual_seed(0)
        return TwoBranch()
    """
)


@pytest.fixture
def factory(tmp_path):
    path = tmp_path / "twobranch.py"
    path.write_text(FACTORY)
    return f"{path}:make"


def test_json_contract(tmp_path, capsys, factory):
    out = tmp_path / "g.json"
    code, _, err = run(capsys, "graph", "--model", factory, "--trust", "--random", "2x4", "--out", out)
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["format"] == "gradexplorer.graph" and data["version"] == 1
    kinds = {n["id"]: n["kind"] for n in data["nodes"]}
    assert sorted(kinds.values()) == sorted(["input", "output", "module", "module", "module", "module",
                                             "module", "module", "op"])
    for n in data["nodes"]:
        assert set(n) >= {"id", "kind", "name", "type", "call", "parent", "shape", "stats"}
        assert n["parent"] is None or kinds[n["parent"]] == "module"
    cat = next(n for n in data["nodes"] if n["kind"] == "op")
    assert (cat["name"], cat["type"], cat["shape"]) == ("cat", "torch.cat", [1, 8])
    pairs = {(e["src"], e["dst"]) for e in data["edges"]}
    assert ("m:b.1:0", cat["id"]) in pairs and ("m:a:0", cat["id"]) in pairs
    assert all(e["grad_l2"] is None for e in data["edges"])
    assert ModelGraph.from_dict(data).nodes[cat["id"]].parent == "m::0"


def test_grads_put_norms_on_edges(tmp_path, capsys, factory):
    out = tmp_path / "g.json"
    code, _, err = run(capsys, "graph", "--model", factory, "--trust", "--random", "3x4", "--grads",
                       "--target", "sum", "--out", out)
    assert code == 0, err
    data = json.loads(out.read_text())
    head_out = next(e for e in data["edges"] if e["dst"] == "out:output")
    assert head_out["grad_l2"] == pytest.approx(6 ** 0.5)  # d sum / d y = ones(3, 2)
    assert all(isinstance(e["grad_l2"], float) for e in data["edges"])


def test_pictures(tmp_path, capsys, factory):
    for suffix in ("dot", "svg", "png"):
        out = tmp_path / f"g.{suffix}"
        code, _, err = run(capsys, "graph", "--model", factory, "--trust", "--random", "2x4", "--depth", "1",
                           "--out", out)
        assert code == 0, err
        data = out.read_bytes()
        if suffix == "png":
            assert data[:8] == b"\x89PNG\r\n\x1a\n"
        elif suffix == "svg":
            text = data.decode()
            assert text.startswith("<svg") and ">cat<" in text and ">b<" in text and ">b.0<" not in text
        else:
            text = data.decode()
            assert text.startswith("digraph") and '"m:b:0"' in text and '"m:b.0:0"' not in text


@pytest.mark.slow
def test_json_and_dot_import_no_qt(tmp_path, factory):
    code = textwrap.dedent(f"""
        import sys
        from gradexplorer_app.cli.main import main
        for suffix in ("json", "dot", "svg"):
            assert main(["graph", "--model", {factory!r}, "--trust", "--random", "2x4",
                         "--out", {str(tmp_path)!r} + "/g." + suffix]) == 0
        loaded = [m for m in sys.modules if m.split(".")[0] in {QT_MODULES!r}]
        assert not loaded, loaded
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_errors_are_one_line(tmp_path, capsys, factory):
    code, _, err = run(capsys, "graph", "--model", factory, "--trust", "--random", "2x4", "--out", tmp_path / "g.txt")
    assert_user_error(code, err, "must end in", ".json")
    code, _, err = run(capsys, "graph", "--random", "2x4", "--out", tmp_path / "g.json")
    assert_user_error(code, err, "needs a model or a capture file")
    code, _, err = run(capsys, "graph", "-q", "--model", factory, "--trust", "--random", "2x5",
                       "--out", tmp_path / "g.json")
    assert_user_error(code, err, "forward failed")
    code, _, err = run(capsys, "graph", "--model", factory, "--trust", "--random", "2x4", "--depth", "-1",
                       "--out", tmp_path / "g.svg")
    assert_user_error(code, err, "--depth")


def test_capture_colours_nodes_and_a_version1_file_without_graph(tmp_path, capsys, factory):
    cap_file = tmp_path / "c.pt"
    code, _, err = run(capsys, "capture", "--model", factory, "--trust", "--random", "2x4", "--out", cap_file)
    assert code == 0, err
    out = tmp_path / "g.json"
    code, _, err = run(capsys, "graph", "--model", factory, "--trust", "--random", "2x4", "--capture", cap_file,
                       "--out", out)
    assert code == 0, err
    data = json.loads(out.read_text())
    stats = {n["id"]: n["stats"] for n in data["nodes"]}
    saved = torch.load(cap_file, weights_only=True)
    want = saved["layers"]["head"]["calls"][0]["stats"]["grad_output"]["l2"]
    assert stats["m:head:0"]["grad_l2"] == pytest.approx(want)
    assert stats["m:b:0"] is None  # containers are not captured by default (leaves only)
    # The capture file carries the graph (plain containers, weights_only): no model needed.
    assert saved["graph"]["format"] == "gradexplorer.graph"
    out2 = tmp_path / "from_capture.json"
    code, _, err = run(capsys, "graph", "--capture", cap_file, "--out", out2)
    assert code == 0, err
    carried = json.loads(out2.read_text())
    assert {n["id"] for n in carried["nodes"]} == set(stats)
    assert {(e["src"], e["dst"]) for e in carried["edges"]} == {(e["src"], e["dst"]) for e in data["edges"]}
    head = next(n for n in carried["nodes"] if n["id"] == "m:head:0")
    assert head["stats"]["grad_l2"] == pytest.approx(want)
    head_edge = next(e for e in carried["edges"] if e["src"] == "m:head:0")
    assert head_edge["grad_l2"] == pytest.approx(want)  # the captured output's gradient
    # A capture file without a graph (version 1, or a model whose graph failed), and no
    # model: one clear sentence.
    saved.pop("graph", None)
    torch.save(saved, cap_file)
    code, _, err = run(capsys, "graph", "-q", "--capture", cap_file, "--out", tmp_path / "h.json")
    assert_user_error(code, err, "carries no graph", "--model")


def test_a_png_export_leaves_a_process_that_can_still_open_widgets():
    """svg_to_png makes the Qt application when there is none: it must be one that widgets
    accept (a bare QGuiApplication made every later QWidget abort the process)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("from gradexplorer_app.views.graph_picture import svg_to_png\n"
            "png = svg_to_png('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\"/>')\n"
            "from PySide6.QtWidgets import QWidget\n"
            "w = QWidget()\n"
            "print(png[:4] == b'\\x89PNG', type(w).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).resolve().parents[2]), env={**__import__("os").environ,
                                                                             "QT_QPA_PLATFORM": "offscreen"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "QWidget"]


def test_compare_colours_nodes_by_how_b_differs_from_a(tmp_path, capsys, factory):
    from gradexplorer.comparison.compare import compare
    from gradexplorer.files.capture_file import load_capture
    from gradexplorer.model_graph.compare import divergence_values

    a_file, b_file = tmp_path / "a.pt", tmp_path / "b.pt"
    for path, extra in ((a_file, []), (b_file, ["--autocast", "bf16"])):
        code, _, err = run(capsys, "capture", "--model", factory, "--trust", "--random", "2x4", *extra, "--out", path)
        assert code == 0, err
    out = tmp_path / "div.json"
    code, _, err = run(capsys, "graph", "--capture", a_file, "--compare", b_file, "--out", out)
    assert code == 0, err
    stats = {n["id"]: n["stats"] for n in json.loads(out.read_text())["nodes"]}
    result = compare(load_capture(a_file), load_capture(b_file))
    assert result.calls
    for c in result.calls:  # the numbers `gradexplorer diff` computes, on the nodes
        want = divergence_values(c)
        got = stats[f"m:{c.layer}:{c.call}"]
        for key in ("div_grad", "div_activation", "grad_ratio"):
            assert got[key] == pytest.approx(want[key])
    assert any(stats[f"m:{c.layer}:{c.call}"]["div_grad"] > 0 for c in result.calls)  # bf16 differs
    svg = tmp_path / "div.svg"
    code, _, err = run(capsys, "graph", "--capture", a_file, "--compare", b_file, "--color-by", "grad_ratio",
                       "--out", svg)
    assert code == 0, err
    assert "gradient norm ratio B / A, log scale, 1 in the middle" in svg.read_text()
    code, _, err = run(capsys, "graph", "--capture", a_file, "--color-by", "div_grad", "--out", svg)
    assert_user_error(code, err, "--compare")
    code, _, err = run(capsys, "graph", "--model", factory, "--trust", "--random", "2x4", "--compare", b_file,
                       "--out", svg)
    assert_user_error(code, err, "--capture")
