"""The bad-input matrix, GUI half: every case goes through the real window and its
workers, shows a message that names the problem and the fix, and leaves the app usable
with the previous model and capture intact (a new run then succeeds).

Cases already in test_main_window.py are not repeated here: a corrupt PNG, a tensor of
the wrong rank, declining trust for a pickled module, an unknown model name.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from gradexplorer.base.devices import DeviceInfo
from gradexplorer.base.errors import GradExplorerError
from gradexplorer_app import dialogs

TIMEOUT = 60_000
CPU = [DeviceInfo("cpu", "cpu - test", None, None)]


def _state(w) -> tuple:
    s = w.session
    return s.model.spec if s.model else None, s.model, s.capture, s.batch


def _message(exc: BaseException) -> tuple[str, str]:
    assert isinstance(exc, GradExplorerError), f"a bug, not a message: {exc!r}"
    assert exc.problem and exc.fix
    return exc.problem, exc.fix


def _assert_intact_and_runs(qtbot, w, before: tuple) -> None:
    spec, model, capture, batch = before
    s = w.session
    assert s.model is not None and s.model.spec == spec and s.model is model
    assert s.capture is capture and s.batch is batch
    assert w.run_panel.run_button.isEnabled()
    with qtbot.waitSignal(w.run_done, timeout=TIMEOUT) as done:
        w.run()
    assert done.args == ["ok"]
    assert s.capture is not None and s.capture is not capture


# ---------------------------------------------------------------------------
# Input files
# ---------------------------------------------------------------------------


def _png_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def _bad_input(kind: str, tmp_path: Path) -> Path:
    if kind == "empty":
        path = tmp_path / "empty.png"
        path.write_bytes(b"")
    elif kind == "truncated":
        path = tmp_path / "truncated.png"
        path.write_bytes(_png_bytes()[:80])
    elif kind == "not an image":
        path = tmp_path / "notes.txt"
        path.write_text("these are my notes, not a picture\n")
    elif kind == "corrupt jpeg":
        path = tmp_path / "garbage.jpg"
        path.write_bytes(b"\xff\xd8\xff\xe0" + os.urandom(300))
    elif kind == ".pt not a tensor":
        path = tmp_path / "dict.pt"
        torch.save({"weights": [1, 2, 3]}, path)
    elif kind == "wrong channel count":
        path = tmp_path / "two_channels.pt"
        torch.save(torch.randn(2, 2, 64, 64), path)
    elif kind == "wrong rank (5-D)":
        path = tmp_path / "video.pt"
        torch.save(torch.randn(1, 2, 3, 64, 64), path)
    else:  # pragma: no cover
        raise AssertionError(kind)
    return path


BAD_INPUTS = ["empty", "truncated", "not an image", "corrupt jpeg", ".pt not a tensor",
              "wrong channel count", "wrong rank (5-D)"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", BAD_INPUTS)
def test_bad_input_file_is_named_and_the_app_stays_usable(qtbot, demo, shown_errors, tmp_path, kind):
    path = _bad_input(kind, tmp_path)
    before = _state(demo)
    with qtbot.waitSignal(demo.error_shown, timeout=TIMEOUT):
        demo.load_inputs([str(path)])
    problem, fix = _message(shown_errors[-1][1])
    if kind.startswith("wrong"):
        # One tensor file: the message names its shape and the shape wanted.
        shape = tuple(torch.load(path, weights_only=True).shape)
        assert str(shape) in problem and "(B, 3, 64, 64)" in problem + fix, problem
    else:
        assert path.name in problem or path.name in fix, problem
    _assert_intact_and_runs(qtbot, demo, before)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["RGBA", "L", "LA"])
def test_alpha_and_grayscale_images_are_handled_not_refused(qtbot, demo, shown_errors, tmp_path, mode):
    path = tmp_path / f"picture_{mode}.png"
    colour = {"RGBA": (255, 0, 0, 128), "L": 120, "LA": (120, 60)}[mode]
    Image.new(mode, (80, 80), colour).save(path)
    with qtbot.waitSignal(demo.batch_loaded, timeout=TIMEOUT):
        demo.load_inputs([str(path)])
    batch = demo.session.batch
    assert tuple(batch.tensor.shape) == (1, 3, 64, 64)
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["ok"] and not shown_errors


@pytest.fixture
def nan_run(qtbot, demo, shown_errors, tmp_path):
    """The demo run on a batch whose first sample has a patch of NaN."""
    x = torch.rand(2, 3, 64, 64)
    x[0, :, 10:20, 10:20] = float("nan")
    path = tmp_path / "nan.pt"
    torch.save(x, path)
    with qtbot.waitSignal(demo.batch_loaded, timeout=TIMEOUT):
        demo.load_inputs([str(path)])
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["ok"] and not shown_errors
    return demo


@pytest.mark.slow
def test_nan_in_the_input_is_captured_not_a_crash(nan_run):
    cap = nan_run.session.capture
    first = cap[cap.layer_order[0]].calls[0]
    assert first.stats["activation"]["nan_count"] > 0
    assert torch.isnan(cap.output[0]).all() and not torch.isnan(cap.output[1]).any()


def test_nan_in_the_input_is_flagged_in_the_tree_and_flow_chart(nan_run):
    from gradexplorer.analysis.gradient_flow import layer_flags

    cap = nan_run.session.capture
    first = cap.layer_order[0]
    assert "nan/inf" in layer_flags(cap)[first]
    assert nan_run.tree_view.tree_model.flag_of(first)


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


FACTORIES = '''
import torch
from torch import nn


def raises():
    raise ValueError("the factory is broken")


def not_a_module():
    return {"weights": 1}


class HalfWay(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.relu = nn.ReLU()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.relu(self.conv(x))
        raise RuntimeError("something went wrong midway")


def halfway():
    return HalfWay()
'''


@pytest.fixture
def factories(tmp_path):
    path = tmp_path / "factories.py"
    path.write_text(FACTORIES)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fn, words", [
    ("raises", ["factory is broken"]),
    ("not_a_module", ["nn.Module"]),
])
def test_factory_that_fails_shows_why_and_keeps_the_model(qtbot, demo, shown_errors, monkeypatch, factories,
                                                          fn, words):
    monkeypatch.setattr(dialogs, "confirm_trust", lambda *a: True)
    before = _state(demo)
    with qtbot.waitSignal(demo.error_shown, timeout=TIMEOUT):
        demo.load_model(f"{factories}:{fn}", trust=True)
    problem, fix = _message(shown_errors[-1][1])
    for word in words:
        assert word in problem + " " + fix
    _assert_intact_and_runs(qtbot, demo, before)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_torchscript_archive_is_refused_with_the_reason(qtbot, demo, shown_errors, monkeypatch, tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 2))).save(str(path))
    monkeypatch.setattr(dialogs, "confirm_trust", lambda *a: True)
    before = _state(demo)
    with qtbot.waitSignal(demo.error_shown, timeout=TIMEOUT):
        demo.load_model(str(path))
    problem, fix = _message(shown_errors[-1][1])
    assert "TorchScript" in problem
    _assert_intact_and_runs(qtbot, demo, before)


@pytest.mark.slow
def test_pickled_module_declined_keeps_the_previous_model(qtbot, demo, shown_errors, monkeypatch, tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 2)), path)
    asked = []
    monkeypatch.setattr(dialogs, "confirm_trust", lambda *a: asked.append(a) or False)
    before = _state(demo)
    with qtbot.waitSignal(demo.error_shown, timeout=TIMEOUT):
        demo.load_model(str(path))
    assert asked
    problem, fix = _message(shown_errors[-1][1])
    assert "whole.pt" in problem + fix
    _assert_intact_and_runs(qtbot, demo, before)


@pytest.mark.slow
def test_forward_that_raises_midway_says_which_layers_ran(qtbot, demo, shown_errors, monkeypatch, factories):
    with qtbot.waitSignal(demo.model_loaded, timeout=TIMEOUT):
        demo.load_model(f"{factories}:halfway", trust=True, inputs=["random:2x3x16x16"])
    assert demo.session.probe_error is not None  # the probe saw it first, without raising
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["failed"]
    problem, fix = _message(shown_errors[-1][1])
    assert "midway" in problem and "conv" in problem and "relu" in problem
    # Still usable: back to the demo, and it runs.
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.load_model("demo:shapes", run=True)
    assert done.args == ["ok"]


@pytest.mark.slow
def test_weights_not_cached_while_offline_name_the_file_and_folder(qtbot, demo, shown_errors, monkeypatch,
                                                                  tmp_path):
    from urllib.error import URLError

    import gradexplorer.models.weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))

    def offline(*args, **kwargs):
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(gradexplorer.models.weights, "urlopen", offline)
    before = _state(demo)
    with qtbot.waitSignal(demo.error_shown, timeout=TIMEOUT):
        demo.load_model("resnet18", weights="DEFAULT")
    problem, fix = _message(shown_errors[-1][1])
    enum = gradexplorer.models.weights.resolve_weights("resnet18", "DEFAULT")
    target = gradexplorer.models.weights.weights_file(enum)
    assert target.name in problem and str(target.parent) in problem
    assert str(tmp_path) in str(target)
    _assert_intact_and_runs(qtbot, demo, before)


# ---------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_target_class_out_of_range(qtbot, demo, shown_errors):
    panel = demo.run_panel
    before = _state(demo)
    panel.target_combo.setCurrentIndex(panel.target_combo.findData("class"))
    panel.class_edit.setText("999")
    panel.class_edit.editingFinished.emit()
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["failed"]
    problem, fix = _message(shown_errors[-1][1])
    assert "999" in problem and "out of range" in problem
    panel.target_combo.setCurrentIndex(panel.target_combo.findData("top1"))
    _assert_intact_and_runs(qtbot, demo, before)


@pytest.mark.slow
def test_zero_layers_ticked_run_says_so(qtbot, demo, shown_errors):
    before = _state(demo)
    demo.session.select_none()
    assert not demo.run_panel.run_button.isEnabled()
    assert "Tick at least one layer" in demo.run_panel.run_button.toolTip()
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()  # Ctrl+R still reaches run(): it says what is missing
    assert done.args == ["failed"]
    problem, fix = _message(shown_errors[-1][1])
    assert "No layers" in problem and "Tick" in fix
    demo.session.select_all_leaves()
    _assert_intact_and_runs(qtbot, demo, before)


@pytest.mark.slow
def test_simulated_cuda_out_of_memory(qtbot, demo, shown_errors, monkeypatch):
    module = demo.session.model.module

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    before = _state(demo)
    monkeypatch.setattr(module, "forward", oom)
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["failed"]
    problem, fix = _message(shown_errors[-1][1])
    assert "out of" in problem and "statistics-only" in fix
    monkeypatch.delattr(module, "forward")
    _assert_intact_and_runs(qtbot, demo, before)


# ---------------------------------------------------------------------------
# Capture files
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_capture_file_from_a_newer_version(qtbot, demo, shown_errors, monkeypatch, tmp_path):
    from gradexplorer.files.capture_file import VERSION, capture_to_dict

    data = capture_to_dict(demo.session.capture)
    data["version"] = VERSION + 1
    path = tmp_path / "future.pt"
    torch.save(data, path)
    monkeypatch.setattr(dialogs, "ask_open_file", lambda *a: str(path))
    before = _state(demo)
    with qtbot.waitSignal(demo.file_done, timeout=TIMEOUT) as done:
        demo.open_capture_action.trigger()  # Ctrl+O
    assert done.args == ["failed"]
    problem, fix = _message(shown_errors[-1][1])
    assert "newer" in problem and str(VERSION + 1) in problem
    _assert_intact_and_runs(qtbot, demo, before)


@pytest.mark.slow
@pytest.mark.parametrize("code, words", [(errno.EROFS, "permission denied"), (errno.ENOSPC, "disk is full")])
def test_export_to_a_read_only_folder_or_a_full_disk_leaves_no_file(qtbot, demo, shown_errors, monkeypatch,
                                                                    tmp_path, code, words):
    import gradexplorer.files.capture_file

    # The file's bytes are written, then the disk says no (atomic_save binds torch.save
    # as a default argument, so the failure is injected at the fsync that follows).
    real_fsync = gradexplorer.files.capture_file.os.fsync

    def failing(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(gradexplorer.files.capture_file.os, "fsync", failing)
    folder = tmp_path / "export"
    folder.mkdir()
    path = folder / "cap.pt"
    monkeypatch.setattr(dialogs, "ask_save_file", lambda *a: str(path))
    before = _state(demo)
    with qtbot.waitSignal(demo.file_done, timeout=TIMEOUT) as done:
        demo.export_capture_action.trigger()  # Ctrl+S
    assert done.args == ["failed"]
    problem, fix = _message(shown_errors[-1][1])
    assert words in problem
    assert list(folder.iterdir()) == []  # no half-written file, no temporary left
    monkeypatch.setattr(gradexplorer.files.capture_file.os, "fsync", real_fsync)
    _assert_intact_and_runs(qtbot, demo, before)


@pytest.mark.slow
def test_export_over_an_input_file_is_refused_and_the_input_kept(qtbot, demo, shown_errors, monkeypatch, tmp_path):
    x = tmp_path / "x.pt"
    torch.save(torch.randn(2, 3, 64, 64), x)
    with qtbot.waitSignal(demo.batch_loaded, timeout=TIMEOUT):
        demo.load_inputs([str(x)])
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT):
        demo.run()
    before = x.read_bytes()
    link = tmp_path / "link.pt"
    link.symlink_to(x)
    monkeypatch.setattr(dialogs, "ask_save_file", lambda *a: str(link))
    with qtbot.waitSignal(demo.file_done, timeout=TIMEOUT) as done:
        demo.export_capture_action.trigger()
    assert done.args == ["failed"]
    problem, fix = _message(shown_errors[-1][1])
    assert "same file as the input" in problem and "another output" in fix
    assert x.read_bytes() == before and link.is_symlink()
