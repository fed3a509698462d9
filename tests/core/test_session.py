"""The GUI's state object, without Qt."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import CaptureCancelled, GradExplorerError
from gradexplorer.capturing.inputs import Batch
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.session import Session, prepare_model, tree_from_names


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = Block()
        self.block2 = Block()
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.block2(self.block1(x)))


def loaded(spec="net", model=None):
    return LoadedModel(module=model or Net(), spec=spec, name=spec, categories=["a", "b", "c"],
                       input_shape=(4,))


def batch(n=2):
    return Batch(torch.randn(n, 4), torch.tensor([0, 2] * (n // 2)), [f"s{i}" for i in range(n)], "random")


def session_with_model(spec="net"):
    s = Session()
    s.set_model(prepare_model(loaded(spec)))
    s.set_batch(batch(), ["random:2x4"])
    return s


def test_prepare_probes_calls_and_shapes():
    prepared = prepare_model(loaded())
    assert prepared.probe_error is None
    assert prepared.tree.probed
    assert prepared.tree["block1.fc"].output_shapes == [(1, 4)]
    assert prepared.output_keys == []


def test_prepare_reports_a_failing_probe():
    lm = loaded()
    lm.input_shape = (5,)
    prepared = prepare_model(lm)
    assert prepared.probe_error is not None
    assert not prepared.tree.probed


def test_default_selection_is_every_leaf_and_signals_fire():
    s = Session()
    seen = []
    s.selection_changed.connect(seen.append)
    s.set_model(prepare_model(loaded()))
    assert s.selection == {"block1.fc", "block1.relu", "block2.fc", "block2.relu", "head"}
    assert seen[-1] == s.selection


def test_a_model_given_with_its_batch_is_never_announced_without_it():
    """Every listener of every signal set_model emits sees the new model with its own batch
    (a graph view had probed the new model on no batch, making a sample of its own)."""
    s = session_with_model()
    old_batch, new_batch = s.batch, batch(4)
    seen = []
    for name in ("model_changed", "tree_changed", "batch_changed", "capture_changed", "selection_changed"):
        getattr(s, name).connect(lambda *_a, name=name: seen.append((name, s.model.spec, s.batch)))
    s.set_model(prepare_model(loaded("other")), new_batch, ["random:4x4"])
    assert [n for n, *_ in seen] == ["model_changed", "tree_changed", "batch_changed", "capture_changed",
                                     "selection_changed"]
    assert all(spec == "other" and b is new_batch for _n, spec, b in seen)
    assert s.batch_sources == ["random:4x4"]
    seen.clear()
    s.set_model(prepare_model(loaded("third")))  # no batch given: the batch stays, unannounced
    assert s.batch is new_batch and "batch_changed" not in [n for n, *_ in seen]
    s.set_model(prepare_model(loaded("fourth")), None)  # none: no batch
    assert s.batch is None and s.batch_sources == [] and old_batch is not None


def test_set_checked_on_containers_and_leaves():
    s = session_with_model()
    s.select_none()
    s.set_checked("block1", True)
    assert s.selection == {"block1.fc", "block1.relu"}
    s.set_checked("block1.relu", False)
    assert s.selection == {"block1.fc"}
    s.select(["block1"])
    s.set_checked("block1", False)
    assert s.selection == set()
    s.select_type("Linear")
    assert s.selection == {"block1.fc", "block2.fc", "head"}
    s.select_children("block2")
    assert {"block2.fc", "block2.relu"} <= s.selection
    s.select_all_leaves()
    assert len(s.selection) == 5
    s.select_patterns("block2.*")
    assert s.selection == {"block2.fc", "block2.relu"}
    with pytest.raises(GradExplorerError):
        s.select_patterns("nope*")


def test_selection_survives_reloading_the_same_spec_only():
    s = session_with_model()
    s.set_selection(["block2.fc", "head"])
    s.set_model(prepare_model(loaded()))
    assert s.selection == {"block2.fc", "head"}
    s.set_model(prepare_model(loaded("other")))
    assert len(s.selection) == 5


def test_selection_keeps_only_names_that_still_exist():
    s = session_with_model()
    s.set_selection(["block2.fc", "head"])

    class Smaller(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 3)

        def forward(self, x):
            return self.head(x)

    s.set_model(prepare_model(loaded("net", Smaller())))
    assert s.selection == {"head"}


def test_run_capture_uses_the_settings_and_meta():
    s = session_with_model()
    s.set_selection(["block1.fc", "head"])
    s.set_mode("stats")
    s.set_input_grad(True)
    cap = s.run_capture()
    assert cap.layer_order == ["block1.fc", "head"]
    assert cap.mode == "stats"
    assert cap.input_grad is not None
    assert cap.meta["model"] == "net"
    assert cap.meta["categories"] == ["a", "b", "c"]
    assert cap.meta["sample_names"] == ["s0", "s1"]


def test_cross_entropy_needs_labels_and_accepts_names():
    s = session_with_model()
    s.set_target("cross_entropy")
    s.set_labels("b, c")
    request = s.run_request()
    assert request.labels.tolist() == [1, 2]
    s.batch.labels = None
    s.set_labels("")
    with pytest.raises(GradExplorerError):
        s.run_request()


def test_settings_signal_and_validation():
    s = Session()
    seen = []
    s.settings_changed.connect(seen.append)
    s.set_device("cpu")
    s.set_train(True)
    s.set_target("class:2", "out")
    s.set_target("class:2", "out")
    assert seen == ["device", "train", "target"]
    assert s.target_spec() == "class:2@out"
    with pytest.raises(GradExplorerError):
        s.set_target("bogus")
    with pytest.raises(GradExplorerError):
        s.set_mode("half")


def test_generations_drop_stale_results():
    s = session_with_model()
    captures = []
    s.capture_changed.connect(captures.append)
    first = s.begin_run()
    second = s.begin_run()
    cap2 = second.run()
    cap1 = first.run()
    assert s.finish_run(first.generation, cap1) == "stale"
    assert s.capture is None
    assert s.finish_run(second.generation, cap2, 0.1) == "ok"
    assert s.capture is cap2 and captures[-1] is cap2
    third = s.begin_run()
    assert s.finish_run(third.generation, CaptureCancelled()) == "cancelled"
    assert s.capture is cap2
    fourth = s.begin_run()
    s.set_batch(batch(4))  # a new batch makes the run in flight stale
    assert s.finish_run(fourth.generation, fourth.run()) == "stale"


def test_cancel_flag_stops_a_run_and_leaves_the_model():
    s = session_with_model()
    flag = threading.Event()
    flag.set()
    with pytest.raises(CaptureCancelled):
        s.run_capture(cancel=flag)
    for m in s.model.module.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks


def test_open_capture_without_the_model_builds_a_tree():
    s = session_with_model()
    cap = s.run_capture()
    other = Session()
    other.open_capture(cap, "x.pt")
    assert other.model is None
    assert set(other.tree.nodes) >= {"", "block1", "block1.fc", "head"}
    assert other.tree["block1.fc"].type == "Linear"
    assert other.tree["block1.fc"].output_shapes == [(2, 4)]
    assert other.selection == set(cap.layer_order)
    # The same model keeps its tree.
    s.open_capture(cap, "x.pt")
    assert s.model is not None and s.capture is cap and s.capture_path == "x.pt"


def test_tree_from_names_nests():
    tree = tree_from_names(["a.b.c", "a.d", "e"])
    assert tree[""].children == ["a", "e"]
    assert tree["a"].children == ["a.b", "a.d"]
    assert tree.leaves() == ["a.b.c", "a.d", "e"]


@pytest.mark.slow
def test_session_module_imports_no_qt():
    code = ("import sys, gradexplorer.pipeline.session; print(any(m.split('.')[0] in "
            "('PySide6', 'PyQt5', 'PyQt6', 'pyqtgraph', 'superqt', 'qtpy') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(__import__('pathlib').Path(__file__).resolve().parents[2]))
    assert out.stdout.strip() == "False", out.stderr
