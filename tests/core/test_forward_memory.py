"""One sample's forward (the probe) is held to the memory budget before it runs: its peak is
told on fake tensors (gradexplorer.capturing.forward_memory), from the shapes alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.forward_memory import forward_peak
from gradexplorer.capturing.inputs import ModelInputs
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer.pipeline.job import SAMPLE_WORK_FACTOR, ProbeOverBudget, probe_fits, probe_graph, probe_sample
from gradexplorer_app.cli.main import main
from tests.memory_watch import LargestResult, RowReader

F32 = 4


def test_the_peak_is_the_largest_set_of_tensors_alive_at_once():
    """Sequential keeps one activation and the caller's input: input, conv1's output and the
    ReLU's (not in place) are alive together; conv1's is freed before conv2's is made."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 4, 3, padding=1))
    h, w = 96, 80
    told = forward_peak(model, torch.randn(1, 3, h, w))
    assert told is not None
    assert told.peak == (3 + 16 + 16) * h * w * F32
    assert told.operations >= 3


def test_parameters_and_buffers_are_not_counted():
    """A 64 MiB weight is in memory already: the forward adds only its input and output."""
    model = nn.Sequential(nn.Linear(4096, 4096), nn.BatchNorm1d(4096))
    told = forward_peak(model, torch.randn(2, 4096))
    assert told is not None and told.peak == (2 * 4096 + 2 * 4096 + 2 * 4096) * F32


class _Caching(nn.Module):
    """Caches a table on itself in forward (as rotary embeddings do), and reads a value back."""

    def __init__(self, read_back: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.read_back = read_back

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        self.table = x * 2
        y = self.lin(x if scale is None else x * scale)
        if self.read_back:
            return y * float(y.sum().item())  # a value read into Python: not on fake tensors
        return y


def test_the_model_is_left_as_it_was():
    model = _Caching().train()
    params = dict(model.named_parameters())
    told = forward_peak(model, ModelInputs((torch.randn(3, 8),), {"scale": torch.ones(3, 8)}))
    assert told is not None and told.peak > 0
    assert not hasattr(model, "table")  # no fake tensor left on the model
    assert dict(model.named_parameters()) == params and model.training
    model(torch.randn(3, 8))  # still runs for real
    assert model.table.shape == (3, 8) and not type(model.table).__name__.startswith("Fake")


def test_a_forward_that_reads_values_back_cannot_be_told():
    model = _Caching(read_back=True)
    assert forward_peak(model, torch.randn(3, 8)) is None
    assert not hasattr(model, "table")


def test_probe_fits_refuses_with_the_figures_and_falls_back_on_the_rule_of_thumb():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU())
    x = torch.randn(1, 3, 256, 256)
    peak = (3 + 16 + 16) * 256 * 256 * F32
    probe_fits(model, x, budget=peak)
    with pytest.raises(ProbeOverBudget, match=r"needs about 8\.8 MiB at its peak") as info:
        probe_fits(model, x, budget=peak - 1)
    assert "--memory-budget" in info.value.fix and "--force" in info.value.fix
    unknown = _Caching(read_back=True)
    small = torch.randn(1, 8)
    probe_fits(unknown, small, budget=8 * F32 * SAMPLE_WORK_FACTOR)
    with pytest.raises(ProbeOverBudget, match=f"{SAMPLE_WORK_FACTOR} times that"):
        probe_fits(unknown, small, budget=8 * F32 * SAMPLE_WORK_FACTOR - 1)


@pytest.fixture
def no_real_probe(monkeypatch):
    ran = []
    real = ModuleTree.probe
    monkeypatch.setattr(ModuleTree, "probe", lambda self, *a, **k: ran.append(1) or real(self, *a, **k))
    return ran


def test_a_sample_over_the_budget_is_refused_before_the_model_runs(tmp_path, capsys, no_real_probe):
    """--memory-budget holds for the probe too (it once ran first, whatever the budget)."""
    out = tmp_path / "o.pt"
    code = main(["capture", "--model", "demo:shapes", "--random", "1x3x512x512", "--memory-budget", "8MiB",
                 "--out", str(out), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: one sample's forward needs about"), err
    assert "budget is 8.0 MiB (set by --memory-budget)" in err and "--force" in err, err
    assert no_real_probe == [] and not out.exists()


@pytest.mark.slow
def test_force_runs_the_probe_anyway(tmp_path, capsys, no_real_probe):
    out = tmp_path / "o.pt"
    code = main(["capture", "--model", "demo:shapes", "--random", "1x3x96x96", "--memory-budget", "1MiB", "--force",
                 "--stats-only", "--out", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    assert no_real_probe and out.exists()


GiB = 2**30
EXPANDED = torch.zeros(1).expand(64, 16384, 16384)  # 64 GiB declared, 4 bytes stored


def test_the_graph_runs_on_a_view_of_the_first_sample_never_a_copy():
    with LargestResult() as seen:
        graph = probe_graph(RowReader(), EXPANDED)
    assert seen.largest < 4 * 2**20, seen.largest
    assert any(n.kind == "module" and n.name == "fc" for n in graph)


def test_the_graph_is_refused_over_the_budget_before_anything_of_its_size_is_made():
    model = RowReader(dense=True)
    with LargestResult() as seen, pytest.raises(ProbeOverBudget, match=r"needs about 1\.0 GiB at its peak") as info:
        probe_graph(model, EXPANDED, memory_budget=GiB // 4)
    assert "budget is 256 MiB" in info.value.problem and "smaller samples" in info.value.fix
    assert seen.largest < 4 * 2**20, seen.largest
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_random_sample_over_the_budget_is_refused_before_it_is_made():
    """No batch: the sample would be made from the model's input shape (1 GiB here)."""
    model = RowReader()
    with LargestResult() as seen, pytest.raises(ProbeOverBudget, match=r"16384x16384\) takes 1\.0 GiB"):
        probe_sample(model, (16384, 16384), None, memory_budget=GiB // 4)
    assert seen.largest == 0
    with pytest.raises(ProbeOverBudget, match=r"takes 1\.0 GiB"):
        probe_graph(RowReader(), None, (16384, 16384), memory_budget=GiB // 4)
    small = probe_sample(RowReader(), (4, 8), None)
    assert small is not None and tuple(small.shape) == (1, 4, 8)
    with pytest.raises(GradExplorerError, match="input shape is not known"):
        probe_graph(nn.Sequential(nn.ReLU()), None, None)
