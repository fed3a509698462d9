"""The main window end to end, headless: real workers, no real modal dialogs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PySide6.QtCore import Qt

from gradexplorer.analysis.capture_summary import default_layer
from gradexplorer.base.devices import DeviceInfo
from gradexplorer.base.errors import BatchError, GradExplorerError, TrustRequired
from gradexplorer_app import dialogs
from gradexplorer_app.window import error_dialog
from gradexplorer_app.window.main_window import MainWindow
from gradexplorer_app.window.settings import AppSettings
from tests.conftest import assert_no_hooks, assert_unchanged, snapshot

TIMEOUT = 60_000
CPU = [DeviceInfo("cpu", "cpu - test", None, None)]


@pytest.mark.slow
def test_demo_loads_and_runs_through_the_worker(demo):
    s = demo.session
    assert s.model.spec == "demo:shapes"
    assert len(s.batch) == 12
    cap = s.capture
    assert cap is not None and set(cap.layer_order) == s.selection
    assert cap.meta["model"] == "demo:shapes" and cap.meta["categories"][0]
    # The tree shows gradient norms, the batch panel the predictions.
    model = demo.tree_view.tree_model
    from gradexplorer_app.window.module_tree_view import COL_GRAD

    assert model.data(model.index_of("classifier", COL_GRAD))
    text = demo.batch_panel.list.item(0).text()
    assert "1. " in text and "%" in text
    # The first layer shown is where Grad-CAM is taken: the residual block's output.
    assert demo.tree_view.current_name() == "features.5.relu"
    assert default_layer(cap) == ("features.5.relu", 1)
    assert "last run" in demo.status_run.text()
    assert demo.run_panel.run_button.isEnabled()


@pytest.mark.slow
def test_heatmap_shows_the_captured_tensor_shape(qtbot, demo):
    views = demo.views
    demo.tree_view.select_layer("features.2.conv")
    views.show_view("Heatmap")
    views.heatmap_view.set_display("channel", channel=0)
    image = views.current_image_array()
    act = demo.session.capture["features.2.conv"].calls[0].activation
    assert image.shape == tuple(act.shape[-2:])


@pytest.mark.slow
def test_flow_chart_click_selects_the_tree_row(qtbot, demo):
    with qtbot.waitSignal(demo.tree_view.layer_activated):
        demo.views.layer_clicked.emit("features.4.conv")
    assert demo.tree_view.current_name() == "features.4.conv"


@pytest.mark.slow
def test_tree_selection_drives_the_next_run(qtbot, demo):
    model = demo.tree_view.tree_model
    model.setData(model.index_of(""), Qt.CheckState.Unchecked, Qt.ItemDataRole.CheckStateRole)
    assert not demo.run_panel.run_button.isEnabled()
    model.setData(model.index_of("features.4"), Qt.CheckState.Checked, Qt.ItemDataRole.CheckStateRole)
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT):
        demo.run()
    assert demo.session.capture.layer_order == ["features.4.conv", "features.4.bn", "features.4.relu"]


@pytest.mark.slow
def test_corrupt_image_shows_a_message_and_keeps_everything(qtbot, demo, shown_errors, tmp_path):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    before_batch, before_capture = demo.session.batch, demo.session.capture
    with qtbot.waitSignal(demo.error_shown, timeout=TIMEOUT):
        demo.load_inputs([str(bad)])
    title, exc = shown_errors[-1]
    assert isinstance(exc, BatchError) and "broken.png" in exc.problem
    assert demo.session.batch is before_batch and demo.session.capture is before_capture
    assert demo.session.model.spec == "demo:shapes"
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["ok"]


@pytest.mark.slow
def test_wrong_shape_tensor_shows_a_message(qtbot, demo, shown_errors, tmp_path):
    path = tmp_path / "x.pt"
    torch.save(torch.randn(2, 3, 10), path)
    capture = demo.session.capture
    with qtbot.waitSignal(demo.error_shown, timeout=TIMEOUT):
        demo.load_inputs([str(path)])
    assert isinstance(shown_errors[-1][1], GradExplorerError)
    assert "3" in shown_errors[-1][1].problem
    assert demo.session.capture is capture


@pytest.mark.slow
def test_a_good_tensor_batch_replaces_the_batch(qtbot, demo, tmp_path):
    path = tmp_path / "x.pt"
    torch.save(torch.randn(3, 3, 64, 64), path)
    with qtbot.waitSignal(demo.batch_loaded, timeout=TIMEOUT):
        demo.load_inputs([str(path)])
    assert len(demo.session.batch) == 3
    assert demo.session.capture is None  # it came from another batch
    assert demo.batch_panel.list.count() == 3
    assert str(path) in AppSettings().recent_inputs()


@pytest.mark.slow
def test_cancel_ends_the_run_as_cancelled_and_leaves_the_model(qtbot, demo):
    module = demo.session.model.module
    before = snapshot(module)
    capture = demo.session.capture
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
        demo.cancel()
    assert done.args == ["cancelled"]
    assert demo.session.capture is capture
    assert_unchanged(module, before)
    assert demo.run_panel.run_button.isEnabled() and not demo.run_panel.cancel_button.isEnabled()
    assert "cancelled" in demo.run_panel.progress.format()


@pytest.mark.slow
def test_a_new_run_supersedes_the_old_one(qtbot, demo):
    outcomes = []
    demo.run_done.connect(outcomes.append)
    demo.run()
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT, check_params_cb=lambda o: o == "ok"):
        demo.run()
    demo.run_runner.wait_idle(30)
    qtbot.wait(50)
    assert outcomes.count("ok") == 1
    assert_no_hooks(demo.session.model.module)


@pytest.mark.slow
def test_export_then_reopen_gives_the_same_tensors(qtbot, demo, tmp_path):
    path = tmp_path / "cap.pt"
    original = demo.session.capture
    with qtbot.waitSignal(demo.file_done, timeout=TIMEOUT) as done:
        demo.export_capture(str(path))
    assert done.args == ["save"] and path.exists()

    other = MainWindow(devices=CPU)
    qtbot.addWidget(other)
    try:
        with qtbot.waitSignal(other.file_done, timeout=TIMEOUT) as done:
            other.open_capture(str(path))
        assert done.args == ["open"]
        cap = other.session.capture
        assert other.session.model is None  # browsed without the model
        assert cap.layer_order == original.layer_order
        for name in original.layer_order:
            for a, b in zip(original[name].calls, cap[name].calls):
                assert torch.equal(a.activation, b.activation)
                assert torch.equal(a.grad_output, b.grad_output)
        assert torch.equal(cap.output, original.output)
        # The tree is rebuilt from the capture's names, with its shapes and norms.
        model = other.tree_view.tree_model
        assert model.index_of("features.5.relu").isValid()
        assert other.tree_view.current_name() in cap.layers
        assert not other.run_panel.run_button.isEnabled()
        assert "from file" in other.status_model.text()
        assert other.batch_panel.list.count() == len(original.input)
    finally:
        other.shutdown()


@pytest.mark.slow
def test_export_png_and_csv_go_to_the_views(qtbot, demo, tmp_path, monkeypatch):
    png, csv = tmp_path / "plot.png", tmp_path / "stats.csv"
    monkeypatch.setattr(dialogs, "ask_save_file", lambda *a: str(png))
    demo.export_png_action.trigger()
    monkeypatch.setattr(dialogs, "ask_save_file", lambda *a: str(csv))
    demo.export_csv_action.trigger()
    assert png.stat().st_size > 0 and csv.stat().st_size > 0


@pytest.mark.slow
def test_unknown_model_shows_the_message_and_keeps_the_old_one(qtbot, demo, shown_errors):
    capture = demo.session.capture
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.load_model("resnet1888", run=True)
    assert done.args == ["failed"]
    assert "resnet18" in shown_errors[-1][1].fix
    assert demo.session.model.spec == "demo:shapes" and demo.session.capture is capture


@pytest.mark.slow
def test_a_bug_shows_details_and_the_app_stays_usable(qtbot, demo, shown_errors, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    import gradexplorer.capturing.capture

    real = gradexplorer.capturing.capture.capture
    monkeypatch.setattr("gradexplorer.capturing.capture.capture", broken)
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["failed"]
    message, fix, details = error_dialog.describe(shown_errors[-1][1])
    assert "ZeroDivisionError" in message and "bug" in fix and "boom" in details
    # Only this patch is undone: conftest's dialog and settings patches stay.
    monkeypatch.setattr("gradexplorer.capturing.capture.capture", real)
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["ok"]


def test_factory_with_trust_confirmation(qtbot, window, monkeypatch, tmp_path):
    factory = tmp_path / "make_net.py"
    factory.write_text(
        "import torch.nn as nn\n"
        "def make():\n"
        "    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))\n")
    asked = []
    monkeypatch.setattr(dialogs, "ask_factory", lambda *a, **k: f"{factory}:make")
    monkeypatch.setattr(dialogs, "confirm_trust", lambda parent, what, why: asked.append(what) or True)
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.model_panel.factory_button.click()
    assert asked
    assert window.session.model.spec == f"{factory}:make"
    assert set(window.session.tree.leaves()) == {"0", "1", "2"}


def test_pickled_checkpoint_asks_for_trust_and_can_be_refused(qtbot, window, monkeypatch, tmp_path, shown_errors):
    path = tmp_path / "whole.pt"
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 2)), path)
    monkeypatch.setattr(dialogs, "ask_open_file", lambda *a: str(path))
    monkeypatch.setattr(dialogs, "ask_item", lambda *a: "")
    monkeypatch.setattr(dialogs, "confirm_trust", lambda *a: False)
    with qtbot.waitSignal(window.error_shown, timeout=TIMEOUT):
        window.model_panel.checkpoint_button.click()
    assert isinstance(shown_errors[-1][1], TrustRequired)
    assert window.session.model is None
    monkeypatch.setattr(dialogs, "confirm_trust", lambda *a: True)
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.model_panel.checkpoint_button.click()
    assert window.session.model.spec == str(path)


@pytest.mark.slow
def test_run_settings_widgets_and_session_stay_in_sync(qtbot, demo):
    panel, s = demo.run_panel, demo.session
    panel.stats_radio.setChecked(True)
    assert s.mode == "stats"
    s.set_mode("full")
    assert panel.full_radio.isChecked()
    panel.train_radio.setChecked(True)
    assert s.train
    panel.input_grad_check.setChecked(True)
    assert s.input_grad
    panel.target_combo.setCurrentIndex(panel.target_combo.findData("class"))
    panel.class_edit.setText("star")
    panel.class_edit.editingFinished.emit()
    assert s.target == f"class:{s.categories.index('star')}"
    s.set_target("sum")
    assert panel.target_combo.currentData() == "sum"
    panel.target_combo.setCurrentIndex(panel.target_combo.findData("cross_entropy"))
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["ok"]
    assert demo.session.capture.input_grad is not None
    assert demo.session.capture.meta["target"].startswith("cross_entropy")


def test_recent_models_and_geometry_are_remembered(qtbot, tmp_path):
    settings = AppSettings(str(tmp_path / "s.ini"))
    settings.add_recent_model("resnet18")
    settings.add_recent_model("vgg11")
    settings.add_recent_model("resnet18")
    assert settings.recent_models() == ["resnet18", "vgg11"]
    settings.set_value("window/splitter", "not a list")
    assert settings.value("window/splitter", list, []) == ["not a list"]
    assert settings.value("missing", int, 7) == 7
    settings.set_value("bad", "x")
    assert settings.value("bad", int, 3) == 3
    w = MainWindow(settings=settings, devices=CPU)
    qtbot.addWidget(w)
    w.resize(1234, 900)
    w.close()
    again = AppSettings(str(tmp_path / "s.ini"))
    assert again.geometry() is not None


def test_real_error_dialog_is_not_modal(qtbot):
    box = error_dialog.show_error(None, "Test", BatchError("The file is bad.", "Pick another."))
    qtbot.addWidget(box)
    assert not box.isModal()
    assert "The file is bad." in box.text() and box.informativeText() == "Pick another."
    box.close()


@pytest.mark.slow
def test_launch_with_screenshot(tmp_path):
    # In a fresh interpreter: launch() styles the whole QApplication, which other tests
    # in this process must not inherit.
    import os
    import subprocess
    import sys

    shot = tmp_path / "shot.png"
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", GRADEXPLORER_SETTINGS=str(tmp_path / "s.ini"),
               PYTHONPATH=str(root))
    code = f"from gradexplorer_app.window.launch import launch; raise SystemExit(launch(screenshot={str(shot)!r}))"
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.stat().st_size > 10_000


@pytest.mark.slow
def test_dropping_files_on_the_batch_panel_loads_them(qtbot, demo):
    from PySide6.QtCore import QMimeData, QPointF, QUrl
    from PySide6.QtGui import QDropEvent

    from gradexplorer.models.demos import SHAPES_SAMPLES

    files = sorted(SHAPES_SAMPLES.glob("*.png"))[:2]
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(f)) for f in files])
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.NoButton,
                       Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(demo.batch_loaded, timeout=TIMEOUT):
        demo.batch_panel.dropEvent(event)
    assert demo.session.batch.names == [f.name for f in files]
    assert demo.session.batch.images is not None
    assert "resize to 64x64" in demo.batch_panel.preprocess_label.text()


@pytest.mark.slow
def test_random_batch_and_model_switch_keeps_the_pictures(qtbot, demo):
    panel = demo.batch_panel
    panel.shape_edit.setText("3x3x64x64")
    with qtbot.waitSignal(demo.batch_loaded, timeout=TIMEOUT):
        panel.random_button.click()
    assert tuple(demo.session.batch.tensor.shape) == (3, 3, 64, 64)
    assert panel.list.count() == 3  # channel-mean pictures stand in for thumbnails


@pytest.mark.parametrize("name, expected", [("resnet18", ("layer4.1.relu", 1)), ("resnet50", ("layer4.2.relu", 2))])
def test_default_layer_of_a_resnet_is_the_last_blocks_output(name, expected):
    """Grad-CAM's usual layer: the last block's output after the residual add (the shared
    relu's last call), not its last BatchNorm, which misses the identity branch."""
    import torchvision

    from gradexplorer.capturing.capture import capture

    cap = capture(torchvision.models.get_model(name).eval(), torch.randn(1, 3, 64, 64), mode="stats")
    assert default_layer(cap) == expected
