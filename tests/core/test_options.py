"""CaptureOptions and BatchSpec: plain, hashable, validated once, easy to vary."""

from __future__ import annotations

import dataclasses

import pytest

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.pipeline.options import BatchSpec, CaptureOptions


def test_options_are_frozen_hashable_and_normalised():
    a = CaptureOptions("demo:seed-mlp", layers=["fc1", "fc2"], batch=BatchSpec(inputs=["x.png"]), weights="  ")
    b = CaptureOptions("demo:seed-mlp", layers=("fc1", "fc2"), batch=BatchSpec(inputs=("x.png",)), weights=None)
    assert a == b and hash(a) == hash(b)
    assert a.layers == ("fc1", "fc2") and a.weights is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.mode = "stats"  # type: ignore[misc]
    assert {a: 1}[b] == 1


def test_variants_with_replace_are_validated_too():
    base = CaptureOptions("demo:seed-mlp")
    stats = dataclasses.replace(base, mode="stats")
    assert stats.mode == "stats" and stats.stats_only and base.mode == "full"
    assert dataclasses.replace(base, autocast="bf16").autocast == "bf16"
    with pytest.raises(GradExplorerError) as info:
        dataclasses.replace(base, autocast="int8")
    assert "int8" in info.value.problem and "bf16" in info.value.fix


@pytest.mark.parametrize("kwargs, words", [
    ({"mode": "fast"}, ("fast", "stats")),
    ({"target": "top5"}, ("top5", "class:N")),
    ({"memory_budget": 0}, ("budget", "bytes")),
    ({"memory_budget": True}, ("budget", "bytes")),
    ({"layers": ("fc1", " ")}, ("empty layer pattern", "layer4.*")),
])
def test_bad_settings_say_what_and_how_to_fix(kwargs, words):
    with pytest.raises(GradExplorerError) as info:
        CaptureOptions("demo:seed-mlp", **kwargs)
    text = str(info.value)
    for word in words:
        assert word in text


def test_a_model_is_required():
    with pytest.raises(GradExplorerError) as info:
        CaptureOptions("  ")
    assert "--model" in info.value.fix


def test_batch_spec_round_trips_the_window_sources():
    cases = {
        ("demo",): BatchSpec(demo=True),
        ("random",): BatchSpec(random=""),
        ("random:2x10",): BatchSpec(random="2x10"),
        ("a.png", "b.png"): BatchSpec(inputs=("a.png", "b.png")),
        (): BatchSpec(),
    }
    for sources, spec in cases.items():
        assert BatchSpec.from_sources(list(sources)) == spec
        assert spec.sources() == list(sources)
    assert BatchSpec().is_default and not BatchSpec(random="").is_default
    # A list handed to CaptureOptions is read as sources.
    assert CaptureOptions("m", batch=["random:4x10"]).batch == BatchSpec(random="4x10")


def test_batch_spec_takes_one_kind_of_input():
    with pytest.raises(GradExplorerError) as info:
        BatchSpec(inputs=("a.png",), demo=True)
    assert "--input" in info.value.fix and "--demo-input" in info.value.fix


def test_describe_is_plain():
    d = CaptureOptions("demo:seed-mlp", batch=BatchSpec(random="4x10")).describe()
    assert d["batch"] == ["random:4x10"] and d["model"] == "demo:seed-mlp" and d["force"] is False


def test_capture_settings_carry_every_run_option_and_what_the_job_resolved():
    import torch

    from gradexplorer.capturing.settings import ReportSettings

    options = CaptureOptions("demo:seed-mlp", layers=("fc1", "fc*"), target="sum", mode="stats", train=True,
                             input_grad=True, autocast="bf16", device="cpu")
    report = ReportSettings(meta={"k": 1})
    labels = torch.tensor([1, 0])
    s = options.capture_settings(report, target="class:1", labels=labels, device=torch.device("cpu"),
                                 expected_calls=7)
    assert s.record.layers == ["fc1", "fc*"] and s.record.target == "class:1" and s.record.labels is labels
    assert s.record.mode == "stats" and s.record.input_grad and s.record.expected_calls == 7
    assert s.run.device == torch.device("cpu") and s.run.train and s.run.autocast == "bf16"
    assert s.report is report
    plain = CaptureOptions("demo:seed-mlp").capture_settings()
    assert plain.record.layers is None and plain.record.target == "top1" and plain.run.device == "auto"
    assert plain.record.mode == "full" and not plain.run.train and plain.report.meta is None
