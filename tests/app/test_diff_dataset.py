"""``gradexplorer diff`` and the compare window on dataset captures (statistics merged over batches)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradexplorer.capturing.capture import capture
from gradexplorer.comparison.compare import CompareError, compare, histogram_distance
from gradexplorer.files.capture_file import save_capture
from gradexplorer.recording.dataset_capture import batch_count, capture_dataset, iter_tensor_batches, to_capture
from gradexplorer_app.cli.diff import EXIT_DIVERGED, EXIT_SAME, EXIT_TROUBLE
from gradexplorer_app.cli.main import main

LAYERS = ["l1", "act", "l2"]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(6, 8)
        self.act = nn.Tanh()
        self.l2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.l2(self.act(self.l1(x)))


def dataset_cap(model: nn.Module, x: torch.Tensor, batch_size: int, reverse: bool = False):
    total = batch_count(len(x), batch_size)
    order = list(range(total))[::-1] if reverse else range(total)
    stats = capture_dataset(model, iter_tensor_batches(x, None, batch_size, order), layers=LAYERS,
                            total_batches=total)
    return to_capture(stats, model, LAYERS, {"model": "net", "target": "top1"})


@pytest.fixture(scope="module")
def caps(tmp_path_factory):
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(30, 6)
    out = tmp_path_factory.mktemp("diffds")
    paths = {}
    other = Net().eval()
    for name, cap in {
        "b5": dataset_cap(model, x, 5),
        "b5r": dataset_cap(model, x, 5, reverse=True),  # merged in another order
        "b7": dataset_cap(model, x, 7),  # the same samples, other batches
        "half": dataset_cap(model, x[:15], 5),
        "other": dataset_cap(other, x, 5),  # other weights
        "one": capture(model, x[:5], layers=LAYERS, mode="stats"),
    }.items():
        paths[name] = save_capture(cap, out / f"{name}.pt")
    return paths


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_same_batches_merged_in_another_order_are_within_tolerance(caps, capsys):
    code, out, err = run(capsys, "diff", caps["b5"], caps["b5r"])
    assert code == EXIT_SAME, out + err
    assert "within tolerance" in out


def test_other_weights_diverge(caps, capsys):
    code, out, err = run(capsys, "diff", caps["b5"], caps["other"])
    assert code == EXIT_DIVERGED, out + err
    assert "DIVERGES" in out


@pytest.mark.parametrize("a, b, needle", [
    ("b5", "half", "over 30 samples and B over 15"),
    ("b5", "b7", "6 batches of 5 against 5 batches of 7"),
    ("b5", "one", "B is one batch of 5 samples"),
    ("one", "b5", "A is one batch of 5 samples and B is a dataset capture over 30 samples"),
])
def test_different_data_is_refused_with_the_fix(caps, capsys, a, b, needle):
    code, out, err = run(capsys, "diff", caps[a], caps[b])
    assert code == EXIT_TROUBLE
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err
    assert needle in lines[0] and ("same samples" in lines[0] or "same --batch-size" in lines[0])


def test_log2_histograms_compare_bin_by_bin():
    torch.manual_seed(1)
    model = Net().eval()
    x = torch.randn(20, 6)
    a = dataset_cap(model, x, 5)
    b = dataset_cap(model, x * 3, 5)
    sa, sb = a["l1"].calls[0].stats["activation"], b["l1"].calls[0].stats["activation"]
    pa = sa["merged"]["hist"].numpy().astype(np.float64)
    pb = sb["merged"]["hist"].numpy().astype(np.float64)
    expected = 0.5 * np.abs(pa / pa.sum() - pb / pb.sum()).sum()
    assert expected > 0
    assert histogram_distance(sa, sb) == pytest.approx(expected, rel=1e-12)
    assert histogram_distance(sa, sa) == 0.0
    result = compare(a, b)
    row = next(c for c in result.calls if c.layer == "l1")
    assert row.kinds["activation"].stats.hist_distance == pytest.approx(expected, rel=1e-12)
    with pytest.raises(CompareError):
        compare(a, dataset_cap(model, x[:10], 5))


def test_compare_window_says_why_it_refuses(qtbot, caps, shown_errors):
    from gradexplorer_app.window.compare_window import CompareWindow

    w = CompareWindow()
    qtbot.addWidget(w)
    with qtbot.waitSignal(w.runner.failed, timeout=60_000):
        w.compare_files(str(caps["b5"]), str(caps["one"]))
    title, exc = shown_errors[-1]
    assert isinstance(exc, CompareError) and "one batch of 5 samples" in exc.problem
    with qtbot.waitSignal(w.runner.finished, timeout=60_000):
        w.compare_files(str(caps["b5"]), str(caps["b5r"]))
    assert w.view.result is not None and w.view.result.within
    w.runner.shutdown()
