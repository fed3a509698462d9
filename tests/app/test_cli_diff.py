"""``gradexplorer diff``: the table, the first divergent layers, and diff(1)'s exit status."""

from __future__ import annotations

import csv
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

from gradexplorer.capturing.capture import capture
from gradexplorer.files.capture_file import save_capture
from gradexplorer_app.cli.diff import EXIT_DIVERGED, EXIT_SAME, EXIT_TROUBLE
from gradexplorer_app.cli.main import main
from tests.app.test_cli import QT_MODULES, subprocess_env


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *needles: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


class Chain(nn.Module):
    def __init__(self, last: str = "l3"):
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 3)
        self.add_module(last, nn.Linear(3, 2))
        self.last = last

    def forward(self, x):
        return getattr(self, self.last)(self.l2(self.l1(x)))


@pytest.fixture
def files(tmp_path):
    """a.pt; b.pt (l2's weights scaled by 1.001); renamed.pt (l3 called head); stats versions."""
    torch.manual_seed(0)
    ma = Chain()
    mb = Chain()
    mb.load_state_dict(ma.state_dict())
    with torch.no_grad():
        mb.l2.weight.mul_(1.001)
    mr = Chain("head")
    mr.load_state_dict({k.replace("l3.", "head."): v for k, v in ma.state_dict().items()})
    x = torch.randn(6, 4)
    paths = {}
    for name, model, mode in (("a", ma, "full"), ("b", mb, "full"), ("renamed", mr, "full"),
                              ("sa", ma, "stats"), ("sb", mb, "stats")):
        paths[name] = tmp_path / f"{name}.pt"
        save_capture(capture(model, x, target="sum", mode=mode, meta={"model": "chain"}), paths[name])
    return paths


def test_identical_captures_exit_0(files, capsys):
    code, out, err = run(capsys, "diff", files["a"], files["a"], "-q")
    assert code == EXIT_SAME, err
    assert "result     within tolerance" in out
    assert "first divergent activation (forward order): none" in out
    assert err == ""


def test_divergent_captures_exit_1_and_name_the_first_divergent_layers(files, capsys):
    code, out, _ = run(capsys, "diff", files["a"], files["b"], "-q")
    assert code == EXIT_DIVERGED
    assert "first divergent activation (forward order): l2 call 0 (Linear)" in out
    # W2 changed: gradients at l3's and l2's outputs are unchanged, l1's is the first.
    assert "first divergent gradient (backward order): l1 call 0 (Linear)" in out
    assert "result     DIVERGED" in out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith(("l1 ", "l2 ", "l3 "))}
    assert rows["l1"].rstrip().endswith("DIVERGES: grad")
    assert "DIVERGES: act" in rows["l2"]


def test_a_loose_tolerance_passes(files, capsys):
    code, out, _ = run(capsys, "diff", files["a"], files["b"], "--rtol", "0.01", "--atol", "1e-4", "-q")
    assert code == EXIT_SAME, out
    assert "rtol 0.01  atol 1.00e-04" in out


def test_statistics_only_pair(files, capsys):
    code, out, _ = run(capsys, "diff", files["sa"], files["sb"], "-q")
    assert code == EXIT_DIVERGED
    assert "by statistics" in out and "ACT |dL2|/L2" in out
    assert "first divergent activation (forward order): l2 call 0" in out
    code, out, _ = run(capsys, "diff", files["sa"], files["sa"], "-q")
    assert code == EXIT_SAME


def test_renamed_layers_are_listed_and_mapped(files, capsys):
    code, out, _ = run(capsys, "diff", files["a"], files["renamed"], "-q")
    assert code == EXIT_DIVERGED
    assert "only in A: l3" in out and "only in B: head" in out
    code, out, _ = run(capsys, "diff", files["a"], files["renamed"], "--map", "l3=head", "-q")
    assert code == EXIT_SAME, out
    assert "l3 -> head" in out


def test_csv_export(files, capsys, tmp_path):
    code, _, err = run(capsys, "diff", files["a"], files["b"], "--csv", tmp_path / "d.csv")
    assert code == EXIT_DIVERGED
    assert "wrote" in err
    rows = list(csv.DictReader((tmp_path / "d.csv").open()))
    l2 = next(r for r in rows if r["layer"] == "l2" and r["kind"] == "activation")
    assert l2["within"] == "no" and float(l2["rel_l2"]) > 0
    assert {r["kind"] for r in rows} >= {"activation", "grad_output", "param:weight"}


def test_models_without_a_common_layer_exit_2(tmp_path, capsys, files):
    conv = nn.Sequential()
    conv.add_module("features", nn.Conv2d(3, 2, 3))
    other = tmp_path / "cnn.pt"
    save_capture(capture(conv, torch.randn(1, 3, 5, 5), target="sum", meta={"model": "cnn"}), other)
    code, out, err = run(capsys, "diff", files["a"], other, "-q")
    assert code == EXIT_TROUBLE and out == ""
    one_error_line(err, "no layer in common", "chain: l1, l2, l3", "cnn: features", "A_NAME=B_NAME")


@pytest.mark.parametrize("argv, needle", [
    (["diff", "{a}"], "required"),
    (["diff", "{a}", "{a}", "--rtol", "-1"], "--rtol"),
    (["diff", "{a}", "{a}", "--atol", "x"], "--atol"),
    (["diff", "{a}", "{a}", "--map", "l3"], "--map 'l3'"),
    (["diff", "{a}", "{a}", "--map", "l3.=head"], "mixes a prefix and a name"),
    (["diff", "{a}", "{missing}"], "no file"),
    (["diff", "{a}", "{junk}"], "cannot be read"),
    (["diff", "{a}", "{a}", "--csv", "{a}"], "same file as the input"),
    (["diff", "{a}", "{a}", "--csv", "{dir}"], "folder"),
])
def test_usage_and_file_problems_exit_2_with_one_line(files, tmp_path, capsys, argv, needle):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a capture")
    subs = {"a": files["a"], "missing": tmp_path / "nope.pt", "junk": junk, "dir": tmp_path}
    code, out, err = run(capsys, *[a.format(**subs) for a in argv])
    assert code == EXIT_TROUBLE, err
    one_error_line(err, needle)
    assert files["a"].stat().st_size > 100  # the capture was not overwritten


@pytest.mark.slow
def test_diff_imports_no_qt(files, tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from gradexplorer_app.cli.main import main
        code = main(["diff", {str(files['a'])!r}, {str(files['b'])!r}, "-q", "--csv", {str(tmp_path / 'x.csv')!r}])
        qt = sorted(m for m in sys.modules if m.split(".")[0] in {QT_MODULES!r})
        print("QT:", qt)
        sys.exit(code)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_DIVERGED, proc.stderr
    assert "QT: []" in proc.stdout


def test_random_weights_are_noted(files, tmp_path, capsys):
    _, out, _ = run(capsys, "diff", files["a"], files["a"], "-q")
    assert "note       both captures have random weights" in out
    torch.manual_seed(0)
    model = Chain()
    x = torch.randn(2, 4)
    for name in ("w1", "w2"):
        save_capture(capture(model, x, target="sum", meta={"model": "chain", "weights": "file:chain.pth"}),
                     tmp_path / f"{name}.pt")
    code, out, _ = run(capsys, "diff", tmp_path / "w1.pt", tmp_path / "w2.pt", "-q")
    assert code == EXIT_SAME and "note" not in out
