"""DatasetJob: the one dataset capture of the command line and the window, its memory budget included."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import CaptureCancelled, GradExplorerError
from gradexplorer.capturing.memory_estimate import budget_shortfall
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.dataset_job import STAGE_BATCHES, DatasetJob, DatasetOverBudget
from gradexplorer.pipeline.job import CaptureJob
from gradexplorer.pipeline.options import BatchSpec, CaptureOptions
from tests.conftest import assert_no_hooks


def make_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 5))


@pytest.fixture
def samples(tmp_path):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(10, 8, generator=gen) * 3 + 1
    path = tmp_path / "samples.pt"
    torch.save(x, path)
    return path, x


def dataset_job(path, net, batch_size=3, progress=None, cancel=None, **options) -> DatasetJob:
    loaded = LoadedModel(net, "net.pt", "net", input_shape=(8,))
    opts = CaptureOptions("net.pt", batch=BatchSpec(inputs=(str(path),)), device="cpu", mode="stats", **options)
    return DatasetJob(CaptureJob(opts, progress, cancel, loaded=loaded), batch_size)


def test_run_equals_float64_over_every_sample_at_once(samples):
    path, x = samples
    net = make_net()
    seen: list[tuple[str, int, int]] = []
    cap, stats = dataset_job(path, net, progress=lambda *a: seen.append(a)).run()
    assert stats.samples == 10 and stats.batches == 4
    assert seen[0] == (STAGE_BATCHES, 0, 4) and seen[-1] == (STAGE_BATCHES, 4, 4)
    assert cap.meta["dataset"]["series"]["samples"] == [3, 3, 3, 1] and cap.meta["batch_source"] == str(path)
    assert_no_hooks(net)
    assert all(p.grad is None for p in net.parameters())

    # Independently: the whole set in one forward, the top-1 logit's gradient by autograd.
    h = net[0](x)
    out = net[2](net[1](h))
    (g,) = torch.autograd.grad(out.gather(1, out.argmax(1, keepdim=True)).sum(), [h])
    for tensor, kind in ((h, "activation"), (g, "grad_output")):
        ref = tensor.detach().double().numpy().ravel()
        got = cap["0"].calls[0].stats[kind]
        assert got["numel"] == ref.size
        assert got["mean"] == pytest.approx(ref.mean(), rel=1e-5, abs=1e-7)
        assert got["std"] == pytest.approx(ref.std(ddof=1), rel=1e-5, abs=1e-7)  # n - 1, as MergeStats
        assert got["min"] == pytest.approx(ref.min(), rel=1e-6) and got["max"] == pytest.approx(ref.max(), rel=1e-6)


def test_over_the_budget_is_refused_in_the_command_lines_words_and_force_runs(samples):
    path, _x = samples
    net = make_net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    estimate = dataset_job(path, net).estimate()
    need = estimate.total + estimate.transient  # on the CPU: what it keeps and what a batch needs
    assert budget_shortfall(estimate, "cpu", budget=need) is None

    refused = dataset_job(path, net, memory_budget=need - 1)
    with pytest.raises(DatasetOverBudget) as info:
        refused.run()
    exc = info.value
    assert isinstance(exc, GradExplorerError)
    assert exc.shortfall.need == need and exc.shortfall.budget == need - 1 and exc.shortfall.set_by_user
    assert "per process" in exc.problem and "set by --memory-budget" in exc.problem
    assert "--batch-size" in exc.fix and "--layers" in exc.fix and "--force to run anyway" in exc.fix
    assert_no_hooks(net)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())

    assert dataset_job(path, net, memory_budget=need).run()[1].samples == 10
    assert dataset_job(path, net, memory_budget=need - 1, force=True).run()[1].samples == 10


def test_a_caller_says_the_refusal_in_its_own_words(samples):
    path, _x = samples
    net = make_net()
    job = dataset_job(path, net, memory_budget=1_000)
    job.words = lambda estimate, short, plan: (f"needs {short.need}", "press the button.")
    with pytest.raises(DatasetOverBudget) as info:
        job.estimate()
    assert info.value.problem == f"needs {job.shortfall.need}" and info.value.fix == "press the button."


def test_cancel_stops_between_module_calls_and_leaves_no_hook(samples):
    path, _x = samples
    net = make_net()
    cancel = threading.Event()
    done: list[int] = []

    def progress(stage, n, total):
        done.append(n)
        if n == 1:
            cancel.set()

    with pytest.raises(CaptureCancelled):
        dataset_job(path, net, progress=progress, cancel=cancel).run()
    assert max(done) == 1
    assert_no_hooks(net)


def test_no_folder_or_file_is_said(samples):
    net = make_net()
    loaded = LoadedModel(net, "net.pt", "net", input_shape=(8,))
    job = DatasetJob(CaptureJob(CaptureOptions("net.pt", device="cpu"), loaded=loaded), 3)
    with pytest.raises(GradExplorerError, match=r"needs a folder of images or a \.pt tensor file"):
        job.run()
    assert_no_hooks(net)
