"""The window, driven through its widgets, writes the same capture file as the CLI."""

from __future__ import annotations

import pytest
import torch

from gradexplorer_app.cli.main import main
from tests.app.conftest import TIMEOUT
from tests.app.test_capture_pipeline import IMAGES, LAYERS, assert_same, cli_args, without_volatile


def _set_run_widgets(panel, extra: tuple[str, ...]) -> None:
    """What a user does in the run panel for the CLI flags ``extra``."""
    panel.input_grad_check.setChecked("--input-grad" in extra)
    (panel.stats_radio if "--stats-only" in extra else panel.full_radio).setChecked(True)
    (panel.train_radio if "--train" in extra else panel.eval_radio).setChecked(True)
    if "--target" in extra:
        panel.target_combo.setCurrentIndex(panel.target_combo.findData(extra[extra.index("--target") + 1]))
    if "--labels" in extra:
        panel.labels_edit.setText(extra[extra.index("--labels") + 1])
        panel.labels_edit.editingFinished.emit()  # what leaving the box does


@pytest.mark.parametrize("extra", [
    ("--target", "cross_entropy", "--labels", "circle,cross", "--input-grad"),
    ("--stats-only", "--train"),
])
def test_window_export_and_cli_capture_write_the_same_file(qtbot, window, tmp_path, capsys, shown_errors, extra):
    cli_path = tmp_path / "cli.pt"
    assert main(cli_args(*extra) + ["--out", str(cli_path), "-q"]) == 0, capsys.readouterr().err

    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.load_model("demo:shapes", inputs=IMAGES, layers=LAYERS)
    _set_run_widgets(window.run_panel, extra)
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        window.run_panel.run_button.click()
    assert done.args == ["ok"], shown_errors
    window_path = tmp_path / "window.pt"
    with qtbot.waitSignal(window.file_done, timeout=TIMEOUT) as saved:
        window.export_capture(str(window_path))
    assert saved.args == ["save"]

    cli_data = torch.load(cli_path, weights_only=True)
    window_data = torch.load(window_path, weights_only=True)
    assert window_data["meta"]["sample_names"] == ["circle_1.png", "cross_1.png"]
    assert_same(without_volatile(cli_data), without_volatile(window_data))
