"""One pipeline, one file format: the CLI and the window's session write the same capture
for the same options, and each front end reads the other's files (both format versions).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from gradexplorer.files.capture_file import save_capture
from gradexplorer.files.meta import VOLATILE_KEYS
from gradexplorer.pipeline.job import STAGE_KERNELS, CaptureJob, probe_model
from gradexplorer.pipeline.options import BatchSpec, CaptureOptions
from gradexplorer.pipeline.session import Session
from gradexplorer_app.cli.common import capture_options
from gradexplorer_app.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "resources" / "demo_shapes" / "samples"
IMAGES = [str(SAMPLES / "circle_1.png"), str(SAMPLES / "cross_1.png")]
DATA = ROOT / "tests" / "core" / "data"
LAYERS = ["features.0.conv", "features.5.conv1", "features.5.bn1", "features.5.relu", "classifier"]


def assert_same(a, b, where: str = "") -> None:
    """Equal plain values; tensors equal exactly, dtype included."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (where, sorted(set(a) ^ set(b)))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where  # NaN statistics
    else:
        assert a == b, (where, a, b)


def without_volatile(data: dict) -> dict:
    data = dict(data)
    meta = dict(data["meta"])
    for key in VOLATILE_KEYS:
        assert key in meta
        meta.pop(key)
    data["meta"] = meta
    return data


def cli_args(*extra: str) -> list[str]:
    return ["capture", "--model", "demo:shapes", "--input", *IMAGES, "--layers", *LAYERS, "--device", "cpu",
            *extra]


def session_file(options: CaptureOptions, path: Path) -> Path:
    """What the window does with ``options``: load through a job (as its model worker
    does), set the session, begin a run and run it (as its run worker does), save."""
    loader = CaptureJob(dataclasses.replace(options, layers=(), target="top1", labels=None))
    loaded, batch = loader.load_model(), loader.load_batch()
    prepared = probe_model(loaded, batch.tensor)
    prepared.options = loader.options
    s = Session()
    s.set_model(prepared)
    s.set_batch(batch, options.batch.sources())
    s.set_selection(options.layers)
    s.set_target(options.target.split("@")[0], options.target.partition("@")[2] or None)
    s.set_labels(options.labels or "")
    s.set_mode(options.mode)
    s.set_device(options.device)
    s.set_train(options.train)
    s.set_input_grad(options.input_grad)
    # The session hands the job the options the CLI would build (the window has asked
    # about the memory budget already: force).
    assert s.capture_options() == options
    request = s.begin_run()
    cap = request.run()
    assert s.finish_run(request.generation, cap) == "ok"
    return save_capture(s.capture, path)


@pytest.mark.parametrize("extra", [
    ("--target", "cross_entropy", "--labels", "circle,cross", "--input-grad"),
    ("--stats-only", "--train"),
])
def test_cli_and_session_write_the_same_file(tmp_path, capsys, extra):
    argv = cli_args(*extra)
    options = capture_options(build_parser().parse_args(argv + ["--out", "x.pt"]))
    cli_path = tmp_path / "cli.pt"
    assert main(argv + ["--out", str(cli_path), "-q"]) == 0, capsys.readouterr().err
    window_path = session_file(options, tmp_path / "window.pt")
    cli_data = torch.load(cli_path, weights_only=True)
    window_data = torch.load(window_path, weights_only=True)
    assert cli_data["version"] == window_data["version"] == 2
    assert cli_data["meta"]["sample_names"] == ["circle_1.png", "cross_1.png"]
    assert_same(without_volatile(cli_data), without_volatile(window_data))


def inspect_lines(capsys, path: Path) -> list[str]:
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    return [line for line in out.splitlines() if not line.startswith(("file ", "created "))]


def test_inspect_shows_the_same_for_a_window_file_and_a_cli_file(tmp_path, capsys):
    argv = cli_args("--target", "cross_entropy", "--labels", "circle,cross", "--stats-only")
    options = capture_options(build_parser().parse_args(argv + ["--out", "x.pt"]))
    cli_path = tmp_path / "cli.pt"
    assert main(argv + ["--out", str(cli_path), "-q"]) == 0
    window_path = session_file(options, tmp_path / "window.pt")
    capsys.readouterr()
    cli_out, window_out = inspect_lines(capsys, cli_path), inspect_lines(capsys, window_path)
    assert cli_out == window_out
    text = "\n".join(cli_out)
    assert "samples  circle_1.png, cross_1.png" in text and "labels   0 (circle), 4 (cross)" in text
    assert "preprocessing: RGB, resize to 64x64" in text


def test_inspect_reads_both_version_1_dialects(capsys):
    cli_out = inspect_lines(capsys, DATA / "capture_v1_cli.pt")
    window_out = inspect_lines(capsys, DATA / "capture_v1_window.pt")
    for out in (cli_out, window_out):
        text = "\n".join(out)
        assert "batch    2 images (3×64×64) from" in text
        assert "samples  circle_1.png, cross_1.png" in text
        assert "preprocessing: RGB, resize to 64x64" in text
    assert any(line.startswith("labels   0 (circle), 4 (cross)") for line in cli_out)
    assert not any(line.startswith("labels ") for line in window_out)  # version 1 windows did not keep them


def test_session_options_round_trip_what_the_window_loaded():
    options = CaptureOptions("demo:seed-mlp", batch=BatchSpec(random="3x10"), layers=("fc1", "fc3"),
                             target="sum", device="cpu", mode="stats", input_grad=True, autocast="bf16",
                             memory_budget=10**9)
    job = CaptureJob(options)
    prepared = probe_model(job.load_model(), job.load_batch().tensor)
    prepared.options = options
    s = Session()
    s.set_model(prepared)
    s.set_batch(job.batch, ["random:3x10"])
    s.set_selection(["fc3", "fc1"])
    s.set_target("sum")
    s.set_mode("stats")
    s.set_device("cpu")
    s.set_input_grad(True)
    s.autocast, s.memory_budget = "bf16", 10**9
    assert s.capture_options() == options
    assert s.capture_options(force=True) == dataclasses.replace(options, force=True)
    cap = s.run_request().run()
    assert cap.meta["autocast"] == "bf16" and cap.layers["fc1"].calls[0].stats["activation"] is not None


@pytest.mark.parametrize("source", ["v1", "v2"])
def test_the_window_shows_names_preprocessing_and_labels_of_a_cli_file(qtbot, window, tmp_path, capsys, source):
    from tests.app.conftest import TIMEOUT

    if source == "v1":
        path = DATA / "capture_v1_cli.pt"
    else:
        path = tmp_path / "cli.pt"
        argv = cli_args("--target", "cross_entropy", "--labels", "circle,cross", "--stats-only")
        assert main(argv + ["--out", str(path), "-q"]) == 0, capsys.readouterr().err
    with qtbot.waitSignal(window.file_done, timeout=TIMEOUT) as done:
        window.open_capture(str(path))
    assert done.args == ["open"]
    panel = window.batch_panel
    items = [panel.list.item(i).text() for i in range(panel.list.count())]
    assert len(items) == 2
    assert items[0].splitlines()[:2] == ["circle_1.png", "label: circle"]
    assert items[1].splitlines()[:2] == ["cross_1.png", "label: cross"]
    assert panel.preprocess_label.text().startswith("Preprocessing: RGB, resize to 64x64")
    assert "2 images from" in panel.source_label.text()


def test_cli_autocast_is_run_and_recorded(tmp_path, capsys):
    path = tmp_path / "bf16.pt"
    assert main(["capture", "--model", "demo:seed-mlp", "--random", "4x10", "--autocast", "bf16",
                 "--device", "cpu", "--out", str(path), "-q"]) == 0, capsys.readouterr().err
    data = torch.load(path, weights_only=True)
    assert data["meta"]["autocast"] == "bf16"
    assert data["layers"]["fc1"]["calls"][0]["activation"].dtype == torch.bfloat16
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 0
    assert "dtype float32  autocast bf16" in capsys.readouterr().out


def test_a_window_run_loads_and_probes_nothing_again():
    options = CaptureOptions("demo:seed-mlp", batch=BatchSpec(random="4x10"), device="cpu")
    job = CaptureJob(options)
    prepared = probe_model(job.load_model(), job.load_batch().tensor)
    prepared.options = options
    s = Session()
    s.set_model(prepared)
    s.set_batch(job.batch, options.batch.sources())
    stages: list[str] = []
    cap = s.begin_run().run(lambda stage, done, total: stages.append(stage))
    assert set(stages) - {STAGE_KERNELS} == {"forward", "backward"} and len(cap) == 5
