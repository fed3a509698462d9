"""The window and the CLI pick the same batch when the user names none (gradexplorer.pipeline.job.default_batch_spec).

The window's side is its model-load task (what a worker runs when a model is opened); the
CLI's side is `capture`'s arguments -> options -> job, and one real `capture` run.
"""

from __future__ import annotations

import textwrap
import threading

import pytest
import torch

from gradexplorer.pipeline.job import CaptureJob
from gradexplorer.pipeline.options import BatchSpec
from gradexplorer_app.cli import common, main as cli
from gradexplorer_app.window.controller import load_model_task
from gradexplorer_app.window.model_panel import ModelRequest

NETS = textwrap.dedent(
    """
    import torch
    from torch import nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(30, 8)
            self.head = nn.Linear(8, 30)

        def forward(self, ids):
            return self.head(self.embed(ids)).mean(1)

    def lm():
        torch.manual_seed(0)
        return LM()

    def half_mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 3)).half()

    def opaque():
        class Twice(nn.Module):
            def forward(self, x):
                return x * 2
        return Twice()
    """
)


@pytest.fixture
def nets(tmp_path):
    path = tmp_path / "nets.py"
    path.write_text(NETS)
    return path


def _window_pick(spec: str, trust: bool):
    task = load_model_task(ModelRequest(spec, trust=trust), None, [])
    loaded = task(lambda *a: None, threading.Event())
    return loaded.sources, loaded.batch


def _cli_pick(spec: str, trust: bool, tmp_path):
    argv = ["capture", "--model", spec, "--out", str(tmp_path / "x.pt")] + (["--trust"] if trust else [])
    job = CaptureJob(common.capture_options(cli.build_parser().parse_args(argv)))
    return job.batch_spec(), job.load_batch()


@pytest.mark.parametrize(
    ("model", "spec", "dtype"),
    [
        ("resnet18", BatchSpec(random="2x3x224x224"), torch.float32),
        ("{nets}:lm", BatchSpec(random="2x16"), torch.int64),
        ("{nets}:half_mlp", BatchSpec(random="2x12"), torch.float16),
    ],
    ids=["torchvision", "embedding", "fp16"],
)
def test_window_and_cli_pick_the_same_batch(model, spec, dtype, nets, tmp_path):
    model = model.format(nets=nets)
    trust = model != "resnet18"
    sources, window_batch = _window_pick(model, trust)
    cli_spec, cli_batch = _cli_pick(model, trust, tmp_path)
    assert BatchSpec.from_sources(sources) == cli_spec == spec
    assert window_batch.tensor.dtype == cli_batch.tensor.dtype == dtype
    assert torch.equal(window_batch.tensor, cli_batch.tensor)
    if dtype == torch.int64:
        assert int(cli_batch.tensor.min()) >= 0 and int(cli_batch.tensor.max()) < 30


def test_cli_capture_without_input_says_what_it_made(nets, tmp_path, capsys):
    out = tmp_path / "lm.pt"
    code = cli.main(["capture", "--model", f"{nets}:lm", "--trust", "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "no input was given: 2 random samples of token ids in [0, 30)" in err and "--input" in err
    # Said in the summary too, which -q keeps.
    assert "batch     2x16 (2 random samples, no --input given)" in stdout
    from gradexplorer.files.capture_file import load_capture

    capture = load_capture(out)
    _sources, window_batch = _window_pick(f"{nets}:lm", True)
    assert torch.equal(capture.input, window_batch.tensor)


def test_no_shape_known_window_has_no_batch_and_cli_refuses(nets, tmp_path, capsys):
    sources, batch = _window_pick(f"{nets}:opaque", True)
    assert batch is None and sources == []
    code = cli.main(["capture", "--model", f"{nets}:opaque", "--trust", "--out", str(tmp_path / "x.pt"), "-q"])
    err = capsys.readouterr().err
    assert code == common.EXIT_USER and len(err.splitlines()) == 1
    assert "input shape is not known" in err and "--input" in err and "--random SHAPE" in err
