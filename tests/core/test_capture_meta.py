"""One metadata schema (format version 2), and the readers of both version 1 dialects.

The version 1 files in tests/core/data were written by gradexplorer before the schema
(see tests/core/data/README.md): one by the CLI, one by the window's session.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gradexplorer.capturing.capture import capture
from gradexplorer.files.capture_file import VERSION, capture_to_dict, load_capture, save_capture
from gradexplorer.files.meta import RUN_KEYS, SOURCE_KEYS, CaptureMeta, capture_meta
from gradexplorer.pipeline.job import CaptureJob
from gradexplorer.pipeline.options import BatchSpec, CaptureOptions

DATA = Path(__file__).parent / "data"
SAMPLES = ("circle_1.png", "cross_1.png")
PREPROCESSING = ("RGB, resize to 64x64 (bilinear), scale to [0, 1], normalise with mean (0.5, 0.5, 0.5) "
                 "and std (0.24, 0.24, 0.24)")
SOURCE = "2 images from resources/demo_shapes/samples/circle_1.png, resources/demo_shapes/samples/cross_1.png"


def test_version_1_cli_file_reads_as_the_schema():
    raw = torch.load(DATA / "capture_v1_cli.pt", weights_only=True)
    assert raw["version"] == 1 and "input_names" in raw["meta"] and "sample_names" not in raw["meta"]
    cap = load_capture(DATA / "capture_v1_cli.pt")
    meta = capture_meta(cap)
    assert meta.sample_names == SAMPLES
    assert meta.preprocessing == PREPROCESSING
    assert meta.batch_source == SOURCE
    assert meta.labels == (0, 4) and meta.categories[0] == "circle" and meta.categories[4] == "cross"
    assert meta.batch == raw["meta"]["batch"]
    assert meta.model == "demo:shapes" and meta.target == "cross_entropy" and meta.mode == "stats"
    # The window reads the same keys from the upgraded dict.
    assert cap.meta["sample_names"] == list(SAMPLES) and cap.meta["preprocessing"] == PREPROCESSING
    assert "input_names" not in cap.meta
    assert cap.graph is None and cap.nonfinite_onset is None


def test_version_1_window_file_reads_as_the_schema():
    raw = torch.load(DATA / "capture_v1_window.pt", weights_only=True)
    assert raw["version"] == 1 and "batch" not in raw["meta"]
    cap = load_capture(DATA / "capture_v1_window.pt")
    meta = capture_meta(cap)
    assert meta.sample_names == SAMPLES and meta.preprocessing == PREPROCESSING and meta.batch_source == SOURCE
    assert meta.labels is None  # the window did not record them in version 1
    # The batch line the CLI wrote, made from what the window wrote (and the input's shape).
    cli = load_capture(DATA / "capture_v1_cli.pt")
    assert meta.batch == cli.meta["batch"].replace(", with labels", "")


def test_version_2_files_carry_every_key_and_round_trip(tmp_path):
    options = CaptureOptions("demo:seed-mlp", batch=BatchSpec(random="3x10"), device="cpu", input_grad=True)
    cap = CaptureJob(options).run()
    for key in SOURCE_KEYS + RUN_KEYS:
        assert key in cap.meta, key
    cap.graph = {"format": "gradexplorer.graph", "version": 1,
                 "nodes": [{"id": "in:input", "kind": "input", "name": "input", "type": "input"},
                           {"id": "m:fc1:0", "kind": "module", "name": "fc1", "type": "Linear"}],
                 "edges": [{"src": "in:input", "dst": "m:fc1:0", "shape": [1, 10]}]}
    data = capture_to_dict(cap)
    assert data["version"] == VERSION == 2
    assert data["graph"] == cap.graph and data["nonfinite_onset"] is None
    path = save_capture(cap, tmp_path / "v2.pt")
    back = load_capture(path)
    assert back.meta == {**cap.meta, "layer_order": cap.layer_order}
    assert capture_meta(back) == capture_meta(cap)
    assert back.graph == cap.graph and back.nonfinite_onset is None
    meta = capture_meta(back)
    assert meta.sample_names == ("random[0]", "random[1]", "random[2]")
    assert meta.input_grad is True and meta.arch is None and meta.autocast is None
    assert meta.batch == "3 random samples (10) from N(0, 1), seed 0, preprocessing: none"


def test_a_bare_capture_has_unknown_preprocessing_and_numbered_samples():
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    cap = capture(model, torch.randn(2, 4), device="cpu")
    meta = capture_meta(cap)
    assert isinstance(meta, CaptureMeta)
    assert meta.preprocessing == "unknown" and meta.sample_names == () and meta.sample_name(1) == "sample 1"
    assert meta.target == "top1" and meta.labels is None
