"""Trust is exactly what the user granted: --trust lets the model file or the factory run
code, nothing else. Weights files, input tensors and capture files are read with
``weights_only=True`` on every route, with trust on and off.

Each hostile file's unpickling would create a marker file: its absence proves no code ran.
"""

from __future__ import annotations

import os
import pickle
import shlex
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import BatchError, CaptureFileError, ModelLoadError, TrustRequired
from gradexplorer.batches import load_batch, load_tensor_file
from gradexplorer.files.capture_file import load_capture
from gradexplorer.files.pickle_scan import file_kind, unsafe_globals
from gradexplorer.models import load_model, trust_subject
from gradexplorer_app.cli.main import main

TORCH_ADVICE = "weights_only=False"


class _OpensFile:
    """Unpickling this opens (creates) the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


class _RunsCommand:
    """Unpickling this runs a shell command that creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


PAYLOADS = {"system": (_RunsCommand, "posix.system"), "open": (_OpensFile, "io.open")}
FORMATS = ("zip", "legacy", "raw")


def hostile(path: Path, marker: Path, *, payload: str = "system", fmt: str = "zip",
            key: str = "fc.bias") -> Path:
    """A weights-looking file whose unpickling creates ``marker``."""
    obj = {key: PAYLOADS[payload][0](marker)}
    if fmt == "raw":
        with open(path, "wb") as f:
            pickle.dump(obj, f)
    else:
        torch.save(obj, path, _use_new_zipfile_serialization=fmt == "zip")
    return path


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "pwned"


@pytest.fixture
def factory(tmp_path):
    path = tmp_path / "nets.py"
    path.write_text(textwrap.dedent(
        """
        import torch

        def build():
            return torch.nn.Sequential(torch.nn.Linear(4, 3))
        """
    ))
    return f"{path}:build"


def assert_refusal_words(message: str, blocked: str) -> None:
    assert blocked in message, message
    assert TORCH_ADVICE not in message and "set to `False`" not in message, message
    assert "trust=True" not in message


# --- weights files: never unpickled, whatever --trust says ---------------------------------


@pytest.mark.parametrize("trust", [False, True])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_torchvision_weights_file_never_runs_code(tmp_path, marker, trust, fmt, payload):
    evil = hostile(tmp_path / "evil.pth", marker, payload=payload, fmt=fmt)
    with pytest.raises(ModelLoadError) as info:
        load_model("resnet18", weights=str(evil), trust=trust)
    assert not isinstance(info.value, TrustRequired)  # a trust dialog could not help
    assert not marker.exists()
    assert_refusal_words(str(info.value), PAYLOADS[payload][1])
    assert "whatever --trust says" in info.value.problem


@pytest.mark.parametrize("trust", [False, True])
def test_weights_file_named_like_torchvisions_own_never_runs_code(tmp_path, marker, trust):
    # A file with the basename of a torchvision weights file goes through the builder.
    evil = hostile(tmp_path / "resnet18-f37072fd.pth", marker)
    with pytest.raises(ModelLoadError) as info:
        load_model("resnet18", weights=str(evil), trust=trust)
    assert not marker.exists()
    assert_refusal_words(str(info.value), "posix.system")


@pytest.mark.parametrize("fmt", FORMATS)
def test_factory_weights_file_never_runs_code_even_with_trust(tmp_path, marker, factory, fmt):
    evil = hostile(tmp_path / "evil.pth", marker, fmt=fmt, key="0.weight")
    with pytest.raises(ModelLoadError) as info:
        load_model(factory, weights=str(evil), trust=True)
    assert not isinstance(info.value, TrustRequired)
    assert not marker.exists()
    assert_refusal_words(str(info.value), "posix.system")
    assert "malicious" in info.value.problem


def test_factory_weights_without_trust_refuses_the_factory_first(tmp_path, marker, factory):
    evil = hostile(tmp_path / "evil.pth", marker, key="0.weight")
    with pytest.raises(TrustRequired):
        load_model(factory, weights=str(evil))
    assert not marker.exists()


def test_factory_still_loads_plain_weights_with_trust(tmp_path, factory):
    model = nn.Sequential(nn.Linear(4, 3))
    torch.save(model.state_dict(), tmp_path / "good.pth")
    loaded = load_model(factory, weights=str(tmp_path / "good.pth"), trust=True)
    assert torch.equal(loaded.module[0].weight, model[0].weight)


def test_a_whole_model_given_as_weights_says_to_load_it_as_the_model(tmp_path):
    torch.save(nn.Sequential(nn.Linear(4, 3)), tmp_path / "whole.pt")
    with pytest.raises(ModelLoadError) as info:
        load_model("resnet18", weights=str(tmp_path / "whole.pt"), trust=True)
    assert "whole pickled model" in info.value.problem
    assert "--model FILE --trust" in info.value.fix
    assert TORCH_ADVICE not in str(info.value)


# --- the model file: exactly what --trust is for -------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_model_file_runs_code_only_with_trust(tmp_path, marker, fmt):
    evil = hostile(tmp_path / "model.pt", marker, fmt=fmt)
    with pytest.raises(TrustRequired) as info:
        load_model(str(evil))
    assert not marker.exists()
    assert_refusal_words(str(info.value), "posix.system")
    assert "malicious" in info.value.problem
    assert info.value.subject == f"the model file '{evil.resolve()}'"
    # With trust the file is unpickled (and turns out not to be a model).
    with pytest.raises(ModelLoadError):
        load_model(str(evil), trust=True)
    assert marker.exists()
    marker.unlink()


def test_state_dict_model_file_with_arch_runs_no_code_either_way(tmp_path):
    model = nn.Linear(2, 2)
    torch.save({"weight": model.weight}, tmp_path / "plain.pt")
    for trust in (False, True):
        with pytest.raises(ModelLoadError, match="do not fit"):
            load_model(str(tmp_path / "plain.pt"), arch="resnet18", trust=trust)


# --- input tensors and capture files: never unpickled ---------------------------------------


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_input_tensor_file_never_runs_code(tmp_path, marker, fmt, payload):
    evil = hostile(tmp_path / "input.pt", marker, payload=payload, fmt=fmt, key="input")
    for load in (lambda: load_tensor_file(evil), lambda: load_batch([str(evil)])):
        with pytest.raises(BatchError) as info:
            load()
        assert not marker.exists()
        assert_refusal_words(str(info.value), PAYLOADS[payload][1])


def test_capture_file_never_runs_code(tmp_path, marker):
    evil = hostile(tmp_path / "capture.pt", marker, key="format")
    with pytest.raises(CaptureFileError) as info:
        load_capture(evil)
    assert not marker.exists()
    assert_refusal_words(str(info.value), "posix.system")


# --- the CLI routes -------------------------------------------------------------------------


def _cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_cli_trust_does_not_reach_the_weights_file(tmp_path, marker, capsys):
    evil = hostile(tmp_path / "evil.pth", marker)
    code, err = _cli(capsys, "capture", "--model", "resnet18", "--trust", "--weights", evil,
                     "--random", "1x3x32x32", "--out", tmp_path / "out.pt", "-q")
    assert code == 1 and not marker.exists()
    assert_refusal_words(err, "posix.system")
    assert not (tmp_path / "out.pt").exists()


def test_cli_trusted_factory_does_not_reach_its_weights_file(tmp_path, marker, factory, capsys):
    evil = hostile(tmp_path / "evil.pth", marker, key="0.weight")
    code, err = _cli(capsys, "capture", "--model", factory, "--trust", "--weights", evil,
                     "--random", "2x4", "--out", tmp_path / "out.pt", "-q")
    assert code == 1 and not marker.exists()
    assert_refusal_words(err, "posix.system")


def test_cli_trust_does_not_reach_the_input_file(tmp_path, marker, factory, capsys):
    evil = hostile(tmp_path / "input.pt", marker, key="input")
    code, err = _cli(capsys, "capture", "--model", factory, "--trust", "--input", evil,
                     "--out", tmp_path / "out.pt", "-q")
    assert code == 1 and not marker.exists()
    assert_refusal_words(err, "posix.system")


def test_cli_inspect_never_runs_a_capture_file(tmp_path, marker, capsys):
    evil = hostile(tmp_path / "capture.pt", marker, key="format")
    code, err = _cli(capsys, "inspect", evil)
    assert code == 1 and not marker.exists()
    assert_refusal_words(err, "posix.system")


# --- what the trust dialog names, and what a refused file seems to be -----------------------


def test_trust_subject_names_the_code_that_runs(tmp_path, factory):
    nets = (tmp_path / "nets.py").resolve()
    assert trust_subject(factory) == f"the Python file '{nets}', then its build()"
    assert trust_subject(str(tmp_path / "m.pt")) == f"the model file '{(tmp_path / 'm.pt').resolve()}'"
    assert trust_subject(str(tmp_path / "m.pt2")).startswith("the torch.export archive ")
    assert trust_subject("json:loads").startswith("the Python module json (from ")
    assert "not found" in trust_subject("no_such_module_here.sub:build")


def test_factory_trust_refusal_carries_the_subject(factory):
    with pytest.raises(TrustRequired) as info:
        load_model(factory)
    assert info.value.subject == trust_subject(factory)


def test_file_kind_reads_the_globals_without_running_them(tmp_path, marker):
    evil = hostile(tmp_path / "evil.pt", marker)
    assert unsafe_globals(evil) == ["posix.system"]
    assert "malicious" in file_kind(["posix.system"])
    assert file_kind(["nets.Net", "torch.nn.modules.linear.Linear"]) == "a whole pickled model (nets.Net)"
    assert file_kind(["pytorch_lightning.utilities.parsing.AttributeDict"]).startswith("a Lightning checkpoint")
    assert not marker.exists()
