"""CaptureJob: the steps from options to a capture, against autograd."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from gradexplorer.base.errors import CaptureCancelled, GradExplorerError
from gradexplorer.capturing.inputs import Batch
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.job import (
    STAGE_DOWNLOAD,
    STAGE_KERNELS,
    STAGE_LOAD_BATCH,
    STAGE_LOAD_MODEL,
    STAGE_PROBE,
    CaptureJob,
    OverBudget,
)
from gradexplorer.pipeline.options import BatchSpec, CaptureOptions
from tests.ground_truth import compare, reference

MLP = CaptureOptions("demo:seed-mlp", batch=BatchSpec(random="4x10"), device="cpu")


def no_hooks_left(model: torch.nn.Module) -> bool:
    return all(not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks) for m in model.modules())


def test_run_matches_autograd_and_reports_each_stage(monkeypatch):
    from gradexplorer.stats import cpu as cpu_stats

    # As in a fresh process: the kernels are prepared as a stage of their own, before forward.
    monkeypatch.setattr(cpu_stats, "_prepared", set())
    kernels = [STAGE_KERNELS] if cpu_stats.needs_preparing([torch.float32]) else []
    stages: list[str] = []
    job = CaptureJob(MLP, lambda stage, done, total: stages.append(stage))
    cap = job.run()
    names = list(cap.layers)
    assert names == ["fc1", "relu1", "fc2", "relu2", "fc3"]
    ref = reference(job.loaded.module, job.batch.tensor, names)
    assert compare(cap, ref, names) < 1e-5
    order = list(dict.fromkeys(stages))
    assert order == [STAGE_LOAD_MODEL, STAGE_LOAD_BATCH, STAGE_PROBE, *kernels, "forward", "backward"]
    assert set(cap.meta["timing"]) == {"load_model", "load_batch", "probe", "capture"} | (
        {"kernels"} if kernels else set())
    if kernels:
        assert torch.float32 in cpu_stats._prepared
        again: list[str] = []  # once per process
        CaptureJob(MLP, lambda stage, done, total: again.append(stage)).run()
        assert STAGE_KERNELS not in again
    assert job.memory is not None and job.memory.calls == 5
    assert no_hooks_left(job.loaded.module)


def test_a_job_writes_its_capture_records_on_its_own_thread(monkeypatch):
    # (a model without a graph: nothing else in the job reads the records)
    monkeypatch.setattr(CaptureJob, "_graph_for", lambda self, cap, model, inputs: None)
    cap = CaptureJob(MLP).run()
    # Written by the job (on the worker that runs it), not left to the window's first read.
    assert "_pending" not in cap.__dict__
    assert cap.__dict__["_layers"]["fc1"].calls[0].stats["activation"]["numel"] > 0


def test_each_step_runs_once():
    job = CaptureJob(MLP)
    loaded, batch = job.load_model(), job.load_batch()
    tree = job.probe()
    assert job.load_model() is loaded and job.load_batch() is batch and job.probe() is tree
    job.run()
    assert job.loaded is loaded and job.batch is batch and job.tree is tree


def test_a_given_model_and_batch_are_not_loaded_again(monkeypatch):
    import gradexplorer.batches
    import gradexplorer.models

    def refuse(*args, **kwargs):
        raise AssertionError("loaded again")

    monkeypatch.setattr(gradexplorer.models, "load_model", refuse)
    monkeypatch.setattr(gradexplorer.batches, "load_batch", refuse)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    loaded = LoadedModel(module, "net.pt", "net", categories=["a", "b", "c"], input_shape=(10,))
    batch = Batch(torch.randn(4, 10), None, ["w", "x", "y", "z"], "4 rows")
    options = CaptureOptions("net.pt", target="cross_entropy", labels="1,0,c,2", device="cpu")
    job = CaptureJob(options, loaded=loaded, batch=batch)
    cap = job.run()
    assert job.labels.tolist() == [1, 0, 2, 2]
    assert batch.labels is None  # the caller's batch is left as it was
    assert cap.meta["labels"] == [1, 0, 2, 2] and "with labels" in cap.meta["batch"]
    assert cap.meta["sample_names"] == ["w", "x", "y", "z"]
    names = list(cap.layers)
    ref = reference(module, batch.tensor, names, "cross_entropy", torch.tensor([1, 0, 2, 2]))
    assert compare(cap, ref, names) < 1e-5


def test_a_probed_tree_of_the_same_sample_size_is_reused():
    first = CaptureJob(MLP)
    first.probe()
    second = CaptureJob(MLP, loaded=first.loaded, batch=first.batch, tree=first.tree)
    stages: list[str] = []
    second.progress = lambda stage, done, total: stages.append(stage)
    assert second.probe() is first.tree and STAGE_PROBE not in stages
    other = CaptureJob(dataclasses.replace(MLP, batch=BatchSpec(random="4x10")), loaded=first.loaded,
                       batch=Batch(torch.zeros(2, 10, dtype=torch.float64), None, ["a", "b"], "zeros"),
                       tree=first.tree)
    assert other.probe() is not first.tree  # float64 samples are twice the size: probed again


def test_cancel_between_steps_stops_and_leaves_the_model_clean():
    cancel = threading.Event()

    def progress(stage, done, total):
        if stage == STAGE_PROBE:
            cancel.set()

    job = CaptureJob(MLP, progress, cancel)
    with pytest.raises(CaptureCancelled):
        job.run()
    assert job.result is None and no_hooks_left(job.loaded.module)

    cancel = threading.Event()
    job = CaptureJob(MLP, lambda stage, done, total: stage == "forward" and cancel.set(), cancel)
    with pytest.raises(CaptureCancelled):
        job.run()
    assert no_hooks_left(job.loaded.module)


def test_download_reports_progress_and_honours_cancel(monkeypatch):
    import gradexplorer.models
    import gradexplorer.models.weights

    cancel = threading.Event()
    calls = []

    def fake_fetch(weights, progress=None, cancel=None):
        progress(512, 1024)
        calls.append(weights)
        if cancel is not None and cancel.is_set():
            raise CaptureCancelled()

    monkeypatch.setattr(gradexplorer.models.weights, "is_cached", lambda weights: False)
    monkeypatch.setattr(gradexplorer.models.weights, "fetch_weights", fake_fetch)
    monkeypatch.setattr(gradexplorer.models, "load_model", lambda *a, **k: pytest.fail("loaded after a cancel"))
    seen = []

    def progress(stage, done, total):
        seen.append((stage, done, total))
        if stage == STAGE_DOWNLOAD:
            cancel.set()

    job = CaptureJob(CaptureOptions("resnet18", weights="DEFAULT"), progress, cancel)
    with pytest.raises(CaptureCancelled):
        job.load_model()
    assert (STAGE_DOWNLOAD, 512, 1024) in seen and len(calls) == 1


def test_over_the_budget_names_the_figure_and_the_ways_out():
    from gradexplorer.capturing.memory_estimate import format_bytes

    job = CaptureJob(dataclasses.replace(MLP, memory_budget=1000))
    with pytest.raises(OverBudget) as info:
        job.run()
    err = info.value
    assert format_bytes(err.estimate.total + err.estimate.transient) in err.problem
    assert "budget you set" in err.message
    assert "--force" in err.fix and "--memory-budget above" in err.fix and "smaller batch" in err.fix
    # 1000 bytes hold no statistics-only run either: advising one would send the user round
    stats_need = CaptureJob(dataclasses.replace(MLP, mode="stats", memory_budget=1 << 40)).estimate()
    assert stats_need is not None and stats_need.total + stats_need.transient > 1000
    assert "--stats-only" not in err.fix
    assert job.result is None
    # a budget between the two needs: statistics only fits, and the advice says so
    full_need = err.estimate.total + err.estimate.transient
    between = (stats_need.total + stats_need.transient + full_need) // 2
    with pytest.raises(OverBudget) as info:
        CaptureJob(dataclasses.replace(MLP, memory_budget=between)).run()
    assert "--stats-only" in info.value.fix and "--layers" in info.value.fix
    assert CaptureJob(dataclasses.replace(MLP, mode="stats", memory_budget=between)).run() is not None
    forced = CaptureJob(dataclasses.replace(MLP, memory_budget=1000, force=True))
    assert len(forced.run()) == 5 and forced.over_budget is not None


def test_kernels_prepared_for_the_dtypes_the_capture_summarises(monkeypatch):
    from gradexplorer.stats import cpu as cpu_stats

    if not cpu_stats.available():
        pytest.skip("numba kernels unavailable")
    monkeypatch.setattr(cpu_stats, "_prepared", set())
    job = CaptureJob(dataclasses.replace(MLP, autocast="bf16"))
    job.run()
    # float32 parameters and batch, bfloat16 activations under autocast
    assert cpu_stats._prepared == {torch.float32, torch.bfloat16}
    monkeypatch.setenv("GRADEXPLORER_CPU_KERNEL", "0")  # the fused path switched off: nothing to prepare
    monkeypatch.setattr(cpu_stats, "_prepared", set())
    stages: list[str] = []
    CaptureJob(MLP, lambda stage, done, total: stages.append(stage)).run()
    assert STAGE_KERNELS not in stages and cpu_stats._prepared == set()


def test_autocast_bf16_matches_autograd_under_autocast():
    job = CaptureJob(dataclasses.replace(MLP, autocast="bf16"))
    cap = job.run()
    assert cap.meta["autocast"] == "bf16"
    assert cap.layers["fc1"].calls[0].activation.dtype == torch.bfloat16
    assert cap.layers["fc1"].param_grads["weight"].dtype == torch.float32  # parameters stay fp32
    names = list(cap.layers)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = reference(job.loaded.module, job.batch.tensor, names)
    assert compare(cap, ref, names) < 1e-6
    full = CaptureJob(MLP, loaded=job.loaded, batch=job.batch).run()
    # The float32 capture differs, so the comparison above could fail.
    assert compare(full, ref, names) > 1e-4


def test_the_demo_model_brings_its_batch_others_follow_their_shape_or_need_one():
    demo = CaptureJob(CaptureOptions("demo:seed-mlp"))
    assert len(demo.load_batch()) > 0
    net = LoadedModel(torch.nn.Linear(3, 2), "net.pt", "net", input_shape=(3,))
    assert CaptureJob(CaptureOptions("net.pt"), loaded=net).load_batch().tensor.shape == (2, 3)
    opaque = LoadedModel(torch.nn.Identity(), "net.pt", "net")  # no shape, no first layer
    with pytest.raises(GradExplorerError) as info:
        CaptureJob(CaptureOptions("net.pt"), loaded=opaque).load_batch()
    assert "--input" in info.value.fix and "--random" in info.value.fix
    with pytest.raises(GradExplorerError) as info:
        CaptureJob(CaptureOptions("net.pt", batch=BatchSpec(demo=True)), loaded=net).load_batch()
    assert "demo model" in info.value.problem


def test_cross_entropy_without_labels_and_a_class_out_of_range():
    with pytest.raises(GradExplorerError) as info:
        CaptureJob(dataclasses.replace(MLP, target="cross_entropy")).run()
    assert "labels" in info.value.problem and "--labels" in info.value.fix
    net = LoadedModel(torch.nn.Linear(3, 2), "net.pt", "net", categories=["a", "b"], input_shape=(3,))
    job = CaptureJob(CaptureOptions("net.pt", target="class:5", batch=BatchSpec(random="2x3")), loaded=net)
    with pytest.raises(GradExplorerError) as info:
        job.run()
    assert "out of range" in info.value.problem and "0 to 1" in info.value.fix


def test_a_device_that_is_not_there_fails_before_loading(monkeypatch):
    import gradexplorer.models

    monkeypatch.setattr(gradexplorer.models, "load_model", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(GradExplorerError) as info:
        CaptureJob(dataclasses.replace(MLP, device="cuda:7")).run()
    assert "cuda:7" in str(info.value)
