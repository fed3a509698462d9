"""The histogram view draws dataset captures' signed log2 bins on their true edges."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch
from torch import nn

from gradexplorer.capturing.capture import capture
from gradexplorer.recording.dataset_capture import DatasetStats, to_capture
from gradexplorer.stats.merge import HIST_BINS, ZERO_BIN, MergeStats, hist_edges
from gradexplorer_app.views.capture_views import CaptureViews
from gradexplorer_app.views.histogram_view import edge_label

# Values spread over many octaves, both signs, zeros and float32 subnormals, none on an
# edge (so that which bar holds them does not depend on how edges are closed).
VALUES = np.array([0.0, 0.0, 0.0, 1e-40, -3e-42, 3.7e-5, 3.9e-5, -1234.5, -0.3, 0.3, 0.31, 5.5e3,
                   7e-20, -6e-30, 1.5, 2.5, 2.6, 2.7], dtype=np.float32)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x)


@pytest.fixture()
def views(qtbot):
    w = CaptureViews()
    qtbot.addWidget(w)
    w.resize(1100, 800)
    return w


def dataset_capture() -> tuple:
    """A dataset capture whose 'lin' activation is VALUES in two batches."""
    model = Net()
    stats = DatasetStats()
    half = len(VALUES) // 2
    for b, part in enumerate((VALUES[:half], VALUES[half:])):
        rows = {("lin", 0, "activation"): MergeStats.of_tensor(torch.from_numpy(part.copy())),
                ("lin", 0, "grad_output"): MergeStats.of_tensor(torch.ones(4))}
        stats.add_batch(b, 2, rows, {})
    return to_capture(stats, model, ["lin"], {"model": "test"}), model


def test_log2_bars_sit_on_the_stored_edges_with_the_stored_counts(views):
    cap, _ = dataset_capture()
    views.set_capture(cap, None)
    views.set_layer("lin")
    views.show_view("Histogram")
    hv = views.histogram_view
    hv.set_tensor("activation")
    edges, counts = hv.current_counts()
    stored = cap["lin"].calls[0].stats["activation"]
    assert stored["hist_kind"] == "log2" and len(stored["merged"]["hist"]) == HIST_BINS
    meta_edges = cap.meta["dataset"]["hist_edges"].numpy()
    np.testing.assert_array_equal(meta_edges, hist_edges())
    full = stored["merged"]["hist"].numpy()
    used = np.flatnonzero(full)
    lo, hi = used[0], used[-1] + 1
    # The bars drawn: the used span of the stored bins, on the stored edges, exact counts.
    np.testing.assert_array_equal(edges, meta_edges[lo:hi + 1])
    np.testing.assert_array_equal(counts, full[lo:hi])
    # Independent ground truth: each value falls between the edges of the bar counting it.
    truth = np.array([np.count_nonzero((a <= VALUES) & (b > VALUES)) for a, b in pairwise(edges)])
    np.testing.assert_array_equal(counts, truth)
    assert counts.sum() == len(VALUES)
    assert counts[ZERO_BIN - lo] == 5  # three zeros and two subnormals
    # On the plot: one unit per bin (bin index), stepMode center, the counts as heights,
    # in log counts by default (log2 bins' counts span powers of ten).
    assert hv.log_check.isChecked()
    x, y = hv.curve.getData()
    np.testing.assert_array_equal(x, np.arange(lo, hi + 1))
    np.testing.assert_allclose(y, np.log10(full[lo:hi] + 1.0))
    # The axis reads as the edges: every tick at an integer position names that edge.
    ticks = hv.plot.getAxis("bottom")._tickLevels[0]
    assert len(ticks) >= 3
    for pos, label in ticks:
        if label == "0":
            assert pos == ZERO_BIN + 0.5
        else:
            assert label == edge_label(meta_edges[int(pos)]), (pos, label)
    assert "2^10" in [t[1] for t in ticks] or any(t[1].startswith("-2^") for t in ticks)
    assert hv.zero_line.isVisible() and hv.zero_line.value() == ZERO_BIN + 0.5
    assert "whole dataset (4 samples in 2 batches" in hv.info_label.text()
    assert hv.scope_combo.itemText(0) == "whole dataset"
    table = views.stats_view
    table.refresh()
    assert "whole dataset (4 samples in 2 batches, merged)" in table.info_label.text()
    # The user's choice wins from then on: linear counts keep the bins.
    hv.log_check.click()
    assert not hv.log_check.isChecked()
    x2, y2 = hv.curve.getData()
    np.testing.assert_array_equal(x2, x)
    np.testing.assert_array_equal(y2, full[lo:hi])
    views.set_layer("lin")
    hv.refresh()
    assert not hv.log_check.isChecked()


def test_counts_beyond_float32_precision_stay_exact(views):
    cap, _ = dataset_capture()
    stored = cap["lin"].calls[0].stats["activation"]
    big = 2 ** 25 + 1  # float32 cannot hold it
    stored["merged"]["hist"][ZERO_BIN] = big
    stored["hist"][ZERO_BIN] = float(big)
    views.set_capture(cap, None)
    views.set_layer("lin")
    views.histogram_view.set_tensor("activation")
    edges, counts = views.histogram_view.current_counts()
    assert big in counts


def test_edge_labels():
    assert edge_label(0.0) == "0"
    assert edge_label(2.0 ** -7) == "2^-7"
    assert edge_label(-8.0) == "-2^3"
    assert edge_label(float("-inf")) == "-inf"


def test_ordinary_captures_keep_their_linear_bins(views):
    torch.manual_seed(0)
    model = Net()
    cap = capture(model, torch.randn(5, 3))
    views.set_capture(cap, None)
    views.set_layer("lin")
    views.show_view("Histogram")
    hv = views.histogram_view
    hv.set_tensor("activation")
    s = cap["lin"].calls[0].stats["activation"]
    edges, counts = hv.current_counts()
    np.testing.assert_array_equal(edges, np.linspace(s["hist_range"][0], s["hist_range"][1], len(s["hist"]) + 1))
    np.testing.assert_array_equal(counts, s["hist"].numpy())
    x, _ = hv.curve.getData()
    np.testing.assert_array_equal(x, edges)
    assert hv.plot.getAxis("bottom")._tickLevels is None
    # After a log2 capture, an ordinary one gets its plain axis back.
    dcap, _ = dataset_capture()
    views.set_capture(dcap, None)
    hv.set_tensor("activation")
    assert hv.plot.getAxis("bottom")._tickLevels is not None
    views.set_capture(cap, None)
    hv.set_tensor("activation")
    assert hv.plot.getAxis("bottom")._tickLevels is None
    assert "whole batch (5 samples" in hv.info_label.text() and hv.scope_combo.itemText(0) == "whole batch"
