"""Run ▸ Run over folder…: the window's dataset capture, through the real worker."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from gradexplorer.base.errors import BatchError, GradExplorerError
from gradexplorer.recording.dataset_capture import DatasetSource, capture_dataset
from gradexplorer_app import dialogs
from gradexplorer_app.window import dataset_run
from tests.conftest import assert_no_hooks
from tests.picture_folders import write_pictures

TIMEOUT = 60_000


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_pictures(tmp_path_factory.mktemp("folder"), 7, seed=1, note="readme.txt")


def start(qtbot, window, monkeypatch, path, batch_size=3, max_samples=None):
    monkeypatch.setattr(dialogs, "ask_folder", lambda parent, caption: str(path))
    monkeypatch.setattr(dataset_run, "ask_dataset_run", lambda parent, f, b: (batch_size, max_samples))
    with qtbot.waitSignal(window.dataset_run.done, timeout=TIMEOUT) as done:
        window.run_folder_action.trigger()
    return done.args[0]


@pytest.mark.slow
def test_run_over_folder_shows_the_merged_statistics(qtbot, demo, monkeypatch, folder):
    s = demo.session
    model = s.model
    layers = s.selected_in_order()
    assert start(qtbot, demo, monkeypatch, folder) == "ok"
    cap = s.capture
    assert cap.meta["mode"] == "stats" and cap.meta["dataset"]["samples"] == 7
    assert cap.meta["dataset"]["series"]["samples"] == [3, 3, 1]
    assert s.model is model  # the same model stays loaded
    assert_no_hooks(model.module)
    assert all(p.grad is None for p in model.module.parameters())

    # Independently: capture_dataset on the same files, model and layers.
    source = DatasetSource([str(folder)], model, 3)
    ref = capture_dataset(model.module, source.batches(range(source.total)), layers=layers, target="top1")
    assert ref.samples == 7
    for (layer, call, kind), merged in ref.rows.items():
        if kind == "grad":
            owner, pname = layer.rsplit(".", 1)
            shown = cap[owner].param_stats[pname]
        else:
            shown = cap[layer].calls[call].stats[kind]
        summ = merged.summary()
        for key in ("numel", "min", "max", "nan_count", "inf_count"):
            assert shown[key] == summ[key], (layer, kind, key)
        assert shown["mean"] == pytest.approx(summ["mean"], rel=1e-9, abs=1e-12)
        assert shown["std"] == pytest.approx(summ["std"], rel=1e-9, abs=1e-12)
        np.testing.assert_array_equal(shown["merged"]["hist"].numpy(), merged.hist)

    # The window's histogram view draws those statistics for the layer shown.
    demo.tree_view.select_layer("features.2.conv")
    demo.views.show_view("Histogram")
    hv = demo.views.histogram_view
    hv.set_tensor("grad_output")
    shown = hv.current_stats()
    assert shown["numel"] == ref.rows[("features.2.conv", 0, "grad_output")].summary()["numel"]
    # The per-batch series opens in a timeline window.
    assert demo.dataset_timeline_action.isEnabled() and demo.dataset_timeline_button.isVisibleTo(demo)
    tw = demo.dataset_run.open_timeline()
    qtbot.waitUntil(lambda: tw.view.timeline is not None, timeout=TIMEOUT)
    assert list(tw.view.timeline.steps) == [0, 1, 2]
    tw.view.shutdown()
    tw.close()


@pytest.mark.slow
def test_max_samples_and_progress_with_eta(qtbot, demo, monkeypatch, folder):
    seen: list[str] = []
    demo.dataset_run.runner.progress.connect(lambda *a: seen.append(demo.run_panel.progress.format()))
    assert start(qtbot, demo, monkeypatch, folder, batch_size=2, max_samples=5) == "ok"
    assert demo.session.capture.meta["dataset"]["samples"] == 5
    assert any("/3 batches, ETA" in text for text in seen), seen
    assert demo.run_panel.run_button.isEnabled()


@pytest.mark.slow
def test_cancel_mid_run_keeps_the_previous_capture(qtbot, demo, monkeypatch, folder):
    before = demo.session.capture
    first_done = threading.Event()
    go_on = threading.Event()
    original = DatasetSource.batches

    def slow_batches(self, indices):
        for i, item in enumerate(original(self, indices)):
            if i == 1:  # the second batch waits until the test has pressed Cancel
                first_done.set()
                go_on.wait(30)
            yield item

    monkeypatch.setattr(DatasetSource, "batches", slow_batches)
    monkeypatch.setattr(dialogs, "ask_folder", lambda parent, caption: str(folder))
    monkeypatch.setattr(dataset_run, "ask_dataset_run", lambda parent, f, b: (2, None))
    with qtbot.waitSignal(demo.dataset_run.done, timeout=TIMEOUT) as done:
        demo.run_folder_action.trigger()
        assert demo.run_panel.cancel_button.isEnabled()
        assert first_done.wait(30)
        demo.run_panel.cancel_button.click()
        go_on.set()
    assert done.args == ["cancelled"]
    assert demo.session.capture is before
    assert "cancelled" in demo.run_panel.progress.format()
    assert not demo.dataset_timeline_action.isEnabled()
    assert_no_hooks(demo.session.model.module)


def test_empty_folder_is_a_dialog_with_the_fix(qtbot, demo, monkeypatch, shown_errors, tmp_path):
    before = demo.session.capture
    (tmp_path / "notes.txt").write_text("no pictures here")
    assert start(qtbot, demo, monkeypatch, tmp_path) == "failed"
    title, exc = shown_errors[-1]
    assert isinstance(exc, BatchError)
    assert "has no image files" in exc.problem and "notes.txt" in exc.problem
    assert "PNG or JPEG" in exc.fix
    assert demo.session.capture is before


@pytest.mark.slow
def test_unreadable_image_names_the_file(qtbot, demo, monkeypatch, shown_errors, tmp_path, folder):
    for p in sorted(folder.glob("*.png"))[:3]:
        (tmp_path / p.name).write_bytes(p.read_bytes())
    (tmp_path / "img9.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    before = demo.session.capture
    assert start(qtbot, demo, monkeypatch, tmp_path, batch_size=2) == "failed"
    title, exc = shown_errors[-1]
    assert isinstance(exc, GradExplorerError) and "img9.png" in exc.problem
    assert demo.session.capture is before
    assert_no_hooks(demo.session.model.module)


def test_model_that_does_not_take_images(qtbot, window, monkeypatch, shown_errors, folder):
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT):
        window.load_model("demo:seed-mlp", run=True)
    assert start(qtbot, window, monkeypatch, folder) == "failed"
    title, exc = shown_errors[-1]
    assert isinstance(exc, BatchError)
    assert "(B, 10)" in exc.problem and exc.fix


def test_without_a_model_it_says_what_to_do(qtbot, window, monkeypatch, shown_errors):
    window.dataset_run.run_over_folder("/nonexistent")
    title, exc = shown_errors[-1]
    assert "no model" in exc.problem and "Model panel" in exc.fix


@pytest.mark.slow
def test_a_new_run_makes_the_folder_run_stale(qtbot, demo, monkeypatch, folder):
    go_on = threading.Event()
    original = DatasetSource.batches

    def slow_batches(self, indices):
        for item in original(self, indices):
            go_on.wait(30)
            yield item

    monkeypatch.setattr(DatasetSource, "batches", slow_batches)
    with qtbot.waitSignal(demo.dataset_run.done, timeout=TIMEOUT) as done:
        demo.dataset_run.run_over_folder(str(folder), batch_size=3)
        with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as run:
            demo.run()
            go_on.set()
    assert done.args[0] in ("cancelled", "stale") and run.args == ["ok"]
    assert demo.session.capture.meta["mode"] != "stats" or "dataset" not in demo.session.capture.meta


def test_the_question_has_sane_defaults(qtbot):
    from gradexplorer_app.window.dataset_run import DEFAULT_BATCH_SIZE, DatasetRunDialog

    d = DatasetRunDialog(None, "/some/folder")
    qtbot.addWidget(d)
    assert d.values() == (DEFAULT_BATCH_SIZE, None)  # every sample
    d.batch_spin.setValue(0)  # clamped to 1
    d.max_spin.setValue(500)
    assert d.values() == (1, 500)
    from PySide6.QtWidgets import QLabel

    texts = " ".join(label.text() for label in d.findChildren(QLabel))
    assert "Statistics only" in texts and "/some/folder" in texts


def test_the_question_is_shown_through_dialogs_run_modal(qtbot, monkeypatch):
    """The question's dialog is shown by the one replaceable modal call; its answer is the
    dialog's values when accepted, None when cancelled."""
    shown = []

    def accept(dialog):
        shown.append(dialog)
        dialog.batch_spin.setValue(5)
        dialog.max_spin.setValue(40)
        return True

    monkeypatch.setattr(dialogs, "run_modal", accept)
    assert dataset_run.ask_dataset_run(None, "/some/folder", 8) == (5, 40)
    assert isinstance(shown[0], dataset_run.DatasetRunDialog)
    monkeypatch.setattr(dialogs, "run_modal", lambda dialog: False)
    assert dataset_run.ask_dataset_run(None, "/some/folder", 8) is None


# -- the memory budget ----------------------------------------------------------------------------


def dataset_need(session, folder, batch_size: int) -> int:
    """The bytes a run over ``folder`` needs on the CPU by the dataset estimate (statistics kept
    plus one batch's forward and backward), for the session's model and layers."""
    import dataclasses

    from gradexplorer.capturing.memory_estimate import budget_shortfall
    from gradexplorer.pipeline.dataset_job import DatasetJob
    from gradexplorer.pipeline.job import CaptureJob
    from gradexplorer.pipeline.options import BatchSpec

    options = dataclasses.replace(session.capture_options(force=True), batch=BatchSpec(inputs=(str(folder),)),
                                  mode="stats", train=False, input_grad=False)
    estimate = DatasetJob(CaptureJob(options, loaded=session.model), batch_size).estimate()
    short = budget_shortfall(estimate, "cpu", budget=1)
    assert short is not None and short.need == estimate.total + estimate.transient
    return short.need


def model_state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}, module.training


@pytest.mark.slow
def test_over_the_budget_is_refused_in_the_windows_words(qtbot, demo, monkeypatch, shown_errors, folder):
    from gradexplorer.base.units import format_bytes
    from gradexplorer.pipeline.dataset_job import DatasetOverBudget

    s = demo.session
    before, model = s.capture, s.model
    need = dataset_need(s, folder, 3)
    state, training = model_state(model.module)
    s.set_memory_budget(need - 1)
    assert start(qtbot, demo, monkeypatch, folder) == "failed"
    title, exc = shown_errors[-1]
    assert title == "Over the memory budget" and isinstance(exc, DatasetOverBudget)
    assert exc.shortfall.need == need and exc.shortfall.budget == need - 1
    assert f"needs about {format_bytes(need)} of memory" in exc.problem
    assert "the memory budget you set" in exc.problem
    # The window's controls, not the command line's flags.
    assert "batch size in the Run over folder question" in exc.fix and "module tree" in exc.fix
    assert "Run anyway" in exc.fix and "--batch-size" not in exc.fix and "--force" not in exc.fix
    # Nothing ran: the capture shown and the model are as they were.
    assert s.capture is before and s.model is model
    assert_no_hooks(model.module)
    assert all(p.grad is None for p in model.module.parameters())
    after, after_training = model_state(model.module)
    assert after_training == training and after.keys() == state.keys()
    assert all(torch.equal(after[k], state[k]) for k in state)
    assert not demo.dataset_timeline_action.isEnabled()
    assert "over the memory budget" in demo.run_panel.progress.format()

    # At the figure said, it fits: the refusal is the estimate's, not a guess.
    s.set_memory_budget(need)
    assert start(qtbot, demo, monkeypatch, folder) == "ok"
    assert s.capture.meta["dataset"]["samples"] == 7


@pytest.mark.slow
def test_over_the_budget_offers_run_anyway_and_a_smaller_batch(qtbot, demo, monkeypatch, shown_errors, folder):
    s = demo.session
    before = s.capture
    s.set_memory_budget(dataset_need(s, folder, 3) - 1)
    assert start(qtbot, demo, monkeypatch, folder) == "failed"
    actions = dict(shown_errors.offered[-1]["actions"])
    assert list(actions) == [dataset_run.RUN_ANYWAY, dataset_run.SMALLER_BATCH]

    asked = []
    monkeypatch.setattr(dataset_run, "ask_dataset_run", lambda parent, f, b: asked.append((f, b)))
    actions[dataset_run.SMALLER_BATCH]()  # the question again, half the batch proposed; cancelled
    assert asked == [(str(folder), 1)]
    assert s.capture is before

    with qtbot.waitSignal(demo.dataset_run.done, timeout=TIMEOUT) as done:
        actions[dataset_run.RUN_ANYWAY]()
    assert done.args == ["ok"]
    assert s.capture.meta["dataset"]["samples"] == 7 and s.capture.meta["dataset"]["batches"] == 3
    assert_no_hooks(s.model.module)


@pytest.mark.slow
def test_unattended_the_refusal_offers_no_buttons(qtbot, demo, monkeypatch, shown_errors, folder):
    demo.controller.unattended = True
    demo.session.set_memory_budget(dataset_need(demo.session, folder, 3) - 1)
    assert start(qtbot, demo, monkeypatch, folder) == "failed"
    assert shown_errors[-1][0] == "Over the memory budget"
    assert shown_errors.offered[-1].get("actions", []) == []


@pytest.mark.slow
def test_the_command_line_and_the_window_give_one_figure(qtbot, demo, monkeypatch, shown_errors, capsys, folder):
    """One estimate: the same model, folder, layers and batch size over the same budget need
    the same bytes, said in each front end's words."""
    from gradexplorer.base.units import format_bytes
    from gradexplorer_app.cli.main import main

    s = demo.session
    need = dataset_need(s, folder, 3)
    s.set_memory_budget(need - 1)
    assert start(qtbot, demo, monkeypatch, folder) == "failed"
    window = shown_errors[-1][1]
    capsys.readouterr()
    code = main(["capture", "--model", "demo:shapes", "--input", str(folder), "--batch-size", "3",
                 "--stats-only", "--device", "cpu", "--memory-budget", str(need - 1), "--out",
                 str(folder.parent / "never.pt")])
    err = capsys.readouterr().err
    assert code != 0 and not (folder.parent / "never.pt").exists()
    describe = window.estimate.describe()
    assert f"needs about {format_bytes(need)} of memory per process ({describe})" in err
    assert f"needs about {format_bytes(need)} of memory ({describe})" in window.problem
    assert "--batch-size" in err and "--force to run anyway" in err
    assert f"--memory-budget above {format_bytes(need)}" in err
