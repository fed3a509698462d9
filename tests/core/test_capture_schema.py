"""Malformed capture files (loadable with weights_only=True, but not captures): one message
naming the field, from the one schema walk in gradexplorer.files.schema, before anything reads it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from gradexplorer.base.errors import CaptureFileError
from gradexplorer.files.capture_file import load_capture
from tests.capture_mutations import deep, save, valid_capture_dict

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def valid() -> dict:
    return valid_capture_dict()


def refused(tmp_path, data, *needles: str) -> str:
    path = save(data, tmp_path / "capture.pt")
    with pytest.raises(CaptureFileError) as info:
        load_capture(path)
    text = str(info.value)
    assert text.startswith("'capture.pt': field ") or "capture.pt" in text, text
    for needle in needles:
        assert needle in text, text
    assert "not a valid gradexplorer capture" in text or "newer gradexplorer" in text, text
    return text


def first_layer(data: dict) -> str:
    return next(iter(data["layers"]))


def test_the_valid_capture_and_the_version_1_files_pass(tmp_path, valid):
    cap = load_capture(save(valid, tmp_path / "ok.pt"))
    assert cap.graph == valid["graph"] and cap.nonfinite_onset == valid["nonfinite_onset"]
    for name in ("capture_v1_cli.pt", "capture_v1_window.pt"):
        assert len(load_capture(DATA / name)) > 0


def test_a_string_where_a_number_belongs(tmp_path, valid):
    data = copy.deepcopy(valid)
    name = first_layer(data)
    data["layers"][name]["calls"][0]["stats"]["grad_output"]["mean"] = "0.5"
    refused(tmp_path, data, f"field layers['{name}'].calls[0].stats.grad_output.mean is a str, expected a number")


def test_a_string_where_a_tensor_belongs(tmp_path, valid):
    data = copy.deepcopy(valid)
    name = first_layer(data)
    data["layers"][name]["calls"][0]["activation"] = "tensor"
    refused(tmp_path, data, f"field layers['{name}'].calls[0].activation is a str, expected a tensor")
    data = copy.deepcopy(valid)
    data["input"] = [1.0, 2.0]
    refused(tmp_path, data, "field input is a list, expected a tensor")


def test_a_list_where_a_dict_belongs(tmp_path, valid):
    data = copy.deepcopy(valid)
    data["meta"] = [1, 2]
    refused(tmp_path, data, "field meta is a list, expected a dict of metadata")
    data = copy.deepcopy(valid)
    data["layers"] = list(data["layers"].values())
    refused(tmp_path, data, "field layers is a list, expected a dict of names")


def test_metadata_nested_2000_deep(tmp_path, valid):
    data = copy.deepcopy(valid)
    data["meta"]["notes"] = deep(2000)
    text = refused(tmp_path, data, "field meta.notes[0][0]", "nested deeper than 16 levels")
    assert len(text) < 600
    data = copy.deepcopy(valid)
    data["meta"]["categories"] = deep(2000)
    refused(tmp_path, data, "field meta.categories[0] is a list, expected a string")


@pytest.mark.parametrize(("version", "needle"), [
    ("2", "field version is a str, expected an integer"),
    (True, "field version is a bool, expected an integer"),
    (2.0, "field version is a float, expected an integer"),
    (None, "field version is None, expected an integer"),
    (0, "field version is 0, not a capture format version"),
    (-3, "field version is -3, not a capture format version"),
])
def test_a_version_that_is_not_a_version(tmp_path, valid, version, needle):
    data = copy.deepcopy(valid)
    data["version"] = version
    refused(tmp_path, data, needle)


def test_missing_keys(tmp_path, valid):
    data = copy.deepcopy(valid)
    del data["layers"]
    refused(tmp_path, data, "field layers is missing")
    data = copy.deepcopy(valid)
    name = first_layer(data)
    del data["layers"][name]["calls"][0]["stats"]["activation"]["numel"]
    refused(tmp_path, data, f"field layers['{name}'].calls[0].stats.activation.numel is missing")


def test_wrong_shapes(tmp_path, valid):
    data = copy.deepcopy(valid)
    name = first_layer(data)
    call = data["layers"][name]["calls"][0]
    call["activation"] = call["activation"].reshape(-1)
    refused(tmp_path, data, f"field layers['{name}'].calls[0].activation has shape", "but the call's shape is")
    data = copy.deepcopy(valid)
    data["layers"][name]["calls"][0]["stats"]["activation"]["hist"] = torch.zeros(2, 32)
    refused(tmp_path, data, "stats.activation.hist has shape (2, 32), expected a 1-D tensor")
    data = copy.deepcopy(valid)
    data["input_grad"] = data["input_grad"][:1]
    refused(tmp_path, data, "field input_grad has shape (1, 10), but the input has shape (3, 10)")


@pytest.mark.parametrize(("value", "needle"), [
    (float("nan"), "nan_count is a float (nan), expected a count"),
    (-1, "nan_count is -1, expected a count"),
    (10**9, "nan_count is 1000000000, more than numel"),
    (True, "nan_count is a bool, expected a count"),
])
def test_a_count_that_is_not_a_count(tmp_path, valid, value, needle):
    data = copy.deepcopy(valid)
    name = first_layer(data)
    data["layers"][name]["calls"][0]["stats"]["activation"]["nan_count"] = value
    refused(tmp_path, data, needle)


def test_the_graph_and_the_onset_are_checked(tmp_path, valid):
    data = copy.deepcopy(valid)
    data["graph"]["edges"][0]["src"] = "nowhere"
    refused(tmp_path, data, "field graph.edges[0].src is 'nowhere', a node the graph does not have")
    data = copy.deepcopy(valid)
    data["graph"]["nodes"][0]["kind"] = "planet"
    refused(tmp_path, data, "field graph.nodes[0].kind is 'planet', expected one of")
    data = copy.deepcopy(valid)
    data["nonfinite_onset"]["backward"]["tensor"] = "param"
    refused(tmp_path, data, "field nonfinite_onset.backward.tensor is 'param', expected activation, grad_output")
    data = copy.deepcopy(valid)
    del data["nonfinite_onset"]["forward"]["call"]  # the readers name the call: inspect raised KeyError
    refused(tmp_path, data, "field nonfinite_onset.forward.call is missing")
    data = copy.deepcopy(valid)
    data["model_inputs"] = {"args": "frames", "kwargs": {}}
    refused(tmp_path, data, "field model_inputs.args is a str")


def test_unknown_keys_holding_plain_data_still_open(tmp_path, valid):
    """A newer minor release may add keys: they open, as long as they hold plain data."""
    data = copy.deepcopy(valid)
    data["meta"]["new_key"] = {"a": [1, 2.0, "x", None, torch.zeros(2)]}
    data["extra"] = "something new"
    node = next(n for n in data["graph"]["nodes"] if n.get("stats"))
    node["stats"]["onset_here"] = True  # a statistic a newer graph may add
    # A layer with no finite value (a dataset capture's merge) has no histogram range.
    stats = data["layers"][first_layer(data)]["calls"][0]["stats"]["activation"]
    stats.update(nan_count=stats["numel"], hist_range=[float("nan"), float("nan")])
    assert len(load_capture(save(data, tmp_path / "newer.pt"))) == len(valid["layers"])

