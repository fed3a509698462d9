"""The ``gradexplorer`` command line: captures that match plain autograd, readable errors.

Most cases run ``main([...])`` in this process; two run real subprocesses to prove the
entry point works and that the CLI never imports Qt.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from gradexplorer_app.cli import common, main as cli
from gradexplorer_app.cli.format import ProgressBar, fmt_num, human_size, table
from gradexplorer_app.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
QT_MODULES = ("PySide6", "PySide2", "PyQt5", "PyQt6", "shiboken6", "pyqtgraph", "superqt", "qtpy")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code: int, err: str, *needles: str) -> str:
    """A user error: non-zero, exactly one line on stderr, no traceback; returns the line."""
    assert code == common.EXIT_USER, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: ")
    for needle in needles:
        assert needle in line, line
    return line


def subprocess_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["QT_QPA_PLATFORM"] = "offscreen"
    return env


# ---------------------------------------------------------------------------
# Factories whose models the test can rebuild exactly (ground truth must not come from core)
# ---------------------------------------------------------------------------

FACTORY_SOURCE = textwrap.dedent(
    """
    import torch
    import torchvision


    def make_resnet18():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1234)
            model = torchvision.models.resnet18(weights=None, num_classes=10)
        return model.eval()
    """
)


@pytest.fixture
def factory_file(tmp_path) -> Path:
    path = tmp_path / "factory.py"
    path.write_text(FACTORY_SOURCE)
    return path


def rebuild_resnet18() -> torch.nn.Module:
    namespace: dict = {}
    exec(FACTORY_SOURCE, namespace)  # the same code the CLI ran, run again independently
    return namespace["make_resnet18"]()


def reference_grads(model: torch.nn.Module, x: torch.Tensor, names: list[str]):
    """Activations and output gradients per call by plain autograd.

    A forward hook keeps each call's output and hands a clone downstream, so later
    in-place ops (ReLU(inplace), ``out += identity``) act on the clone; the gradient
    with respect to the kept original is the gradient at that call's output.
    """
    kept: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    handles = []
    for name in names:
        def hook(module, args, output, _name=name):
            kept[_name].append(output)
            return output.clone()

        handles.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        y = model(x)
    finally:
        for h in handles:
            h.remove()
    scalar = y.max(dim=1).values.sum()  # top1
    flat = [t for n in names for t in kept[n]]
    params = list(model.parameters())
    grads = torch.autograd.grad(scalar, flat + params)
    out, i = {}, 0
    for n in names:
        out[n] = []
        for t in kept[n]:
            out[n].append((t.detach().clone(), grads[i]))
            i += 1
    param_grads = {name: g for (name, _), g in zip(model.named_parameters(), grads[len(flat):])}
    return out, param_grads


# ---------------------------------------------------------------------------
# capture
# ---------------------------------------------------------------------------


def test_capture_seed_mlp_matches_autograd(tmp_path, capsys):
    out_file = tmp_path / "mlp.pt"
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--random", "4x10", "--out", out_file)
    assert code == 0, err
    assert out_file.is_file()
    assert "5 layers" in out and str(out_file.resolve()) in out
    assert "forward" in err and "saving" in err  # the progress stages, not on a TTY: plain lines

    data = torch.load(out_file, weights_only=True)
    # format version 2: one metadata schema (was 1)
    assert data["format"] == "gradexplorer.capture" and data["version"] == 2
    assert list(data["layers"]) == ["fc1", "relu1", "fc2", "relu2", "fc3"]
    assert data["meta"]["layer_order"] == ["fc1", "relu1", "fc2", "relu2", "fc3"]
    assert data["meta"]["model"] == "demo:seed-mlp" and data["meta"]["mode"] == "full"
    x = data["input"]
    assert x.shape == (4, 10)

    # Ground truth: the same seeded MLP, written out by hand, differentiated by autograd.
    from gradexplorer.models.demos import SeedMLP

    m = SeedMLP()
    h1 = m.fc1(x)
    a1 = torch.relu(h1)
    h2 = m.fc2(a1)
    a2 = torch.relu(h2)
    h3 = m.fc3(a2)
    scalar = h3.max(dim=1).values.sum()
    g = torch.autograd.grad(scalar, [h1, a1, h2, a2, h3, m.fc1.weight, m.fc2.bias])
    for name, act, grad in zip(["fc1", "relu1", "fc2", "relu2", "fc3"], [h1, a1, h2, a2, h3], g[:5]):
        (call,) = data["layers"][name]["calls"]
        torch.testing.assert_close(call["activation"], act.detach())
        torch.testing.assert_close(call["grad_output"], grad)
        assert call["stats"]["grad_output"]["l2"] == pytest.approx(float(grad.norm()), rel=1e-5)
    torch.testing.assert_close(data["layers"]["fc1"]["param_grads"]["weight"], g[5])
    torch.testing.assert_close(data["layers"]["fc2"]["param_grads"]["bias"], g[6])


@pytest.mark.slow
def test_capture_resnet18_layer4_matches_autograd(tmp_path, capsys, factory_file):
    out_file = tmp_path / "r18.pt"
    code, out, err = run(
        capsys, "capture", "--model", f"{factory_file}:make_resnet18", "--trust",
        "--random", "2x3x64x64", "--layers", "layer4.*", "--out", out_file,
    )
    assert code == 0, err
    data = torch.load(out_file, weights_only=True)
    names = list(data["layers"])
    assert names and all(n.startswith("layer4.") for n in names)
    assert {"layer4.0.conv1", "layer4.0.relu", "layer4.0.bn2", "layer4.1.conv2", "layer4.0.downsample.0"} <= set(names)
    assert len(data["layers"]["layer4.0.relu"]["calls"]) == 2  # BasicBlock.relu runs twice

    model = rebuild_resnet18()
    checked = ["layer4.0.relu", "layer4.0.bn2", "layer4.1.conv2", "layer4.1"]
    ref, ref_params = reference_grads(model, data["input"], checked)
    for name in checked:
        calls = data["layers"][name]["calls"]
        assert len(calls) == len(ref[name])
        for call, (act, grad) in zip(calls, ref[name]):
            torch.testing.assert_close(call["activation"], act, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(call["grad_output"], grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(
        data["layers"]["layer4.1.conv2"]["param_grads"]["weight"], ref_params["layer4.1.conv2.weight"],
        rtol=1e-4, atol=1e-6,
    )


@pytest.mark.slow
def test_capture_torchvision_resnet18_by_name(tmp_path, capsys):
    out_file = tmp_path / "r18.pt"
    code, out, err = run(
        capsys, "capture", "--model", "resnet18", "--random", "1x3x64x64", "--layers", "layer4.*",
        "--out", out_file, "--quiet",
    )
    assert code == 0, err
    assert err == ""  # --quiet
    data = torch.load(out_file, weights_only=True)
    assert next(iter(data["layers"])) == "layer4.0"
    assert "layer4.1.bn2" in data["layers"]
    assert data["meta"]["model"] == "resnet18"
    assert data["layers"]["layer4.0.conv1"]["calls"][0]["activation"].shape == (1, 512, 2, 2)


def test_capture_stats_only(tmp_path, capsys):
    out_file = tmp_path / "stats.pt"
    code, out, err = run(
        capsys, "capture", "--model", "demo:seed-mlp", "--random", "4x10", "--stats-only",
        "--input-grad", "--out", out_file,
    )
    assert code == 0, err
    data = torch.load(out_file, weights_only=True)
    assert data["meta"]["mode"] == "stats"
    for layer in data["layers"].values():
        for call in layer["calls"]:
            assert call["activation"] is None and call["grad_output"] is None
            act = call["stats"]["activation"]
            assert act["numel"] > 0 and act["hist"].shape == (64,)
            assert call["stats"]["grad_output"]["l2"] >= 0
        for pname, g in layer["param_grads"].items():
            assert g is None
            assert layer["param_stats"][pname]["numel"] > 0


def test_capture_demo_model_without_input_uses_its_batch(tmp_path, capsys):
    out_file = tmp_path / "demo.pt"
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--out", out_file, "-q")
    assert code == 0, err
    from gradexplorer.models.demos import demo_batch

    data = torch.load(out_file, weights_only=True)
    torch.testing.assert_close(data["input"], demo_batch("demo:seed-mlp").tensor)


def test_capture_random_without_shape_takes_the_model_input_shape(tmp_path, capsys):
    out_file = tmp_path / "r.pt"
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--random", "--out", out_file, "-q")
    assert code == 0, err
    assert torch.load(out_file, weights_only=True)["input"].shape[1:] == (10,)


def test_capture_refuses_a_full_capture_over_the_memory_budget(tmp_path, capsys, monkeypatch):
    import gradexplorer.base.devices

    monkeypatch.setattr(gradexplorer.base.devices, "free_memory", lambda device: 1000)
    out_file = tmp_path / "big.pt"
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--random", "4x10", "--out", out_file, "-q")
    # 500 B hold no statistics-only run either: the advice is a smaller batch, not --stats-only
    assert_user_error(code, err, "smaller batch", "free RAM", "--force")
    assert "--stats-only" not in err
    assert not out_file.exists()
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--random", "4x10", "--out", out_file,
                         "-q", "--force")
    assert code == 0, err
    assert out_file.is_file()


def test_the_estimate_and_the_budget_error_show_the_same_figure(tmp_path, capsys, monkeypatch):
    import re

    import gradexplorer.base.devices

    monkeypatch.setattr(gradexplorer.base.devices, "free_memory", lambda device: 40_000)
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--random", "64x10", "--out",
                         tmp_path / "b.pt")
    assert code == 1
    note = next(line for line in err.splitlines() if line.startswith("capturing "))
    error = next(line for line in err.splitlines() if line.startswith("error: "))
    figure = re.search(r": (≈ [\d.]+ \w+) \(", note).group(1)
    assert f"({figure} kept" in error, (note, error)


def test_one_layer_one_call_one_sample_read_in_the_singular(tmp_path, capsys):
    from gradexplorer.base.units import counted

    assert [counted(1, "layer"), counted(0, "call"), counted(2, "leaf", "leaves"), counted(1234, "call")] == \
        ["1 layer", "0 calls", "2 leaves", "1,234 calls"]
    out_file = tmp_path / "one.pt"
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--random", "1x10", "--layers", "fc1",
                         "--out", out_file)
    assert code == 0, err
    assert "capturing 1 layer (1 call) of" in err
    assert "(1 sample)" in out and "captured  1 layer, 1 call in" in out
    code, out, err = run(capsys, "inspect", out_file)
    assert "layers   1 (1 call)" in out


def test_a_memory_budget_below_the_estimate_refuses_before_the_forward(tmp_path, capsys, monkeypatch):
    import gradexplorer.capturing.capture
    from gradexplorer.base.units import format_bytes
    from gradexplorer.batches import random_batch
    from gradexplorer.capturing.memory_estimate import estimate_capture_memory
    from gradexplorer.capturing.module_tree import ModuleTree
    from gradexplorer.capturing.selection import resolve_layers
    from gradexplorer.models import load_model

    def no_forward(*args, **kwargs):
        raise AssertionError("the capture ran")

    real = gradexplorer.capturing.capture.capture
    monkeypatch.setattr(gradexplorer.capturing.capture, "capture", no_forward)
    out_file = tmp_path / "x.pt"
    argv = ["capture", "--model", "demo:seed-mlp", "--random", "4x10", "--out", out_file, "--memory-budget", "1KiB"]
    code, out, err = run(capsys, *argv)
    assert code == common.EXIT_USER and not out_file.exists() and "Traceback" not in err
    note = next(line for line in err.splitlines() if line.startswith("capturing "))
    error = err.splitlines()[-1]
    # Both figures as the estimate line prints them: what it keeps (≈), and the budget.
    loaded = load_model("demo:seed-mlp")
    x = random_batch("4x10", seed=0).tensor
    tree = ModuleTree.build(loaded.module).probe(loaded.module, x[:1])
    expected = estimate_capture_memory(tree, resolve_layers(loaded.module, None), "full", x, False, loaded.module)
    kept = f"≈ {format_bytes(expected.total)}"
    assert kept in note and f"({kept} kept" in error
    assert f"needs {format_bytes(expected.total + expected.transient)} of memory" in error
    assert f"the budget is {format_bytes(1024)} (set by --memory-budget)" in error
    assert "--memory-budget above" in error and "--force" in error and "smaller batch" in error
    assert "--stats-only" not in error  # 1 KiB holds no statistics-only run either
    assert_user_error(*run(capsys, *argv, "-q")[::2], "1.0 KiB", "--memory-budget", "--force")

    monkeypatch.setattr(gradexplorer.capturing.capture, "capture", real)
    code, out, err = run(capsys, *argv[:-1], "1GiB", "-q")
    assert code == 0, err
    assert out_file.is_file()


def test_capture_prints_the_same_estimate_as_core(tmp_path, capsys):
    from gradexplorer.batches import random_batch
    from gradexplorer.capturing.memory_estimate import estimate_capture_memory
    from gradexplorer.capturing.module_tree import ModuleTree
    from gradexplorer.capturing.selection import resolve_layers
    from gradexplorer.models import load_model

    out_file = tmp_path / "e.pt"
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--random", "4x10", "--out", out_file)
    assert code == 0, err
    loaded = load_model("demo:seed-mlp")
    x = random_batch("4x10", seed=0).tensor
    tree = ModuleTree.build(loaded.module).probe(loaded.module, x[:1])
    expected = estimate_capture_memory(tree, resolve_layers(loaded.module, None), "full", x, False, loaded.module)
    assert expected.describe() in err


# ---------------------------------------------------------------------------
# bad input: one line, the problem and the fix, no traceback
# ---------------------------------------------------------------------------


def test_unknown_model_suggests_near_names(tmp_path, capsys):
    code, out, err = run(capsys, "capture", "--model", "resnt18", "--random", "1x3x64x64",
                         "--out", tmp_path / "x.pt", "-q")
    assert_user_error(code, err, "resnt18", "resnet18")
    assert not (tmp_path / "x.pt").exists()


def test_user_error_without_quiet_ends_with_one_error_line(tmp_path, capsys):
    code, out, err = run(capsys, "capture", "--model", "resnt18", "--random", "1x3x64x64", "--out", tmp_path / "x.pt")
    assert code == common.EXIT_USER
    lines = err.splitlines()
    assert "Traceback" not in err
    assert lines[-1].startswith("error: ") and "resnet18" in lines[-1]
    assert sum(line.startswith("error:") for line in lines) == 1


def test_unreadable_image(tmp_path, capsys):
    bad = tmp_path / "cat.jpg"
    bad.write_text("this is not a JPEG")
    code, out, err = run(capsys, "capture", "--model", "resnet18", "--input", bad, "--out", tmp_path / "x.pt", "-q")
    assert_user_error(code, err, "cat.jpg", "PNG or JPEG")


def test_wrong_shape_tensor_names_the_expected_shape(tmp_path, capsys):
    wrong = tmp_path / "input.pt"
    torch.save(torch.zeros(4, 9), wrong)
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--input", wrong,
                         "--out", tmp_path / "x.pt", "-q")
    assert_user_error(code, err, "(B, 10)", "(4, 9)")


@pytest.mark.slow
def test_wrong_channel_count_for_resnet(tmp_path, capsys):
    wrong = tmp_path / "input.pt"
    torch.save(torch.zeros(2, 1, 32, 32), wrong)
    code, out, err = run(capsys, "capture", "--model", "resnet18", "--input", wrong, "--out", tmp_path / "x.pt", "-q")
    assert_user_error(code, err, "(B, 3, 224, 224)")


def test_unknown_layer_pattern(tmp_path, capsys):
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--random", "4x10", "--layers", "fc9*",
                         "--out", tmp_path / "x.pt", "-q")
    assert_user_error(code, err, "fc9*", "gradexplorer layers")


def test_target_class_out_of_range(tmp_path, capsys):
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--random", "4x10", "--target", "class:5",
                         "--out", tmp_path / "x.pt", "-q")
    assert_user_error(code, err, "out of range")
    assert not (tmp_path / "x.pt").exists()


def test_bad_target_and_device_fail_before_loading(tmp_path, capsys):
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--target", "top5", "--out", tmp_path / "x.pt")
    assert_user_error(code, err, "top5", "class:N")  # one line: nothing was loaded yet
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--device", "cuda:7",
                         "--out", tmp_path / "x.pt")
    assert_user_error(code, err, "cuda:7", "cpu")


def test_missing_input_for_a_model_of_unknown_shape(tmp_path, capsys):
    # A model whose input shape nothing tells (a torchvision one gets a random batch of its
    # shape: tests/app/test_default_batch_parity.py).
    factory = tmp_path / "opaque.py"
    factory.write_text("import torch\ndef build():\n    return torch.nn.Identity()\n")
    code, out, err = run(capsys, "capture", "--model", f"{factory}:build", "--trust", "--out", tmp_path / "x.pt", "-q")
    assert_user_error(code, err, "--input", "--random")


def test_out_folder_missing(tmp_path, capsys):
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--out", tmp_path / "nope" / "x.pt")
    assert_user_error(code, err, "does not exist")


def test_factory_needs_trust(tmp_path, capsys, factory_file):
    code, out, err = run(capsys, "capture", "--model", f"{factory_file}:make_resnet18", "--random", "1x3x32x32",
                         "--out", tmp_path / "x.pt", "-q")
    assert_user_error(code, err, "--trust")


def test_usage_error_is_one_line_exit_2(tmp_path, capsys):
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp")
    assert code == common.EXIT_USAGE
    assert err.splitlines() == [err.strip()] and "--out" in err and "Traceback" not in err


def test_internal_error_exit_70_traceback_only_with_debug(tmp_path, capsys, monkeypatch):
    import gradexplorer.capturing.capture

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(gradexplorer.capturing.capture, "capture", broken)
    argv = ["capture", "--model", "demo:seed-mlp", "--random", "4x10", "--out", tmp_path / "x.pt", "-q"]
    code, out, err = run(capsys, *argv)
    assert code == common.EXIT_INTERNAL
    assert err.splitlines() == [err.strip()]
    assert err.startswith("error: internal error: ZeroDivisionError: boom") and "Traceback" not in err
    code, out, err = run(capsys, *argv, "--debug")
    assert code == common.EXIT_INTERNAL
    assert "Traceback" in err and "ZeroDivisionError" in err


def test_keyboard_interrupt_exits_130_and_leaves_no_file(tmp_path, capsys, monkeypatch):
    import gradexplorer.capturing.capture

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gradexplorer.capturing.capture, "capture", interrupted)
    out_file = tmp_path / "x.pt"
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--random", "4x10", "--out", out_file, "-q")
    assert code == common.EXIT_INTERRUPTED
    assert err.strip() == "error: interrupted; nothing was saved."
    assert not out_file.exists() and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------


@pytest.fixture
def mlp_capture(tmp_path, capsys) -> Path:
    path = tmp_path / "mlp.pt"
    assert main(["capture", "--model", "demo:seed-mlp", "--random", "4x10", "--out", str(path), "-q"]) == 0
    capsys.readouterr()
    return path


def test_inspect_lists_layers_and_stats(mlp_capture, capsys):
    code, out, err = run(capsys, "inspect", mlp_capture)
    assert code == 0, err
    assert "demo:seed-mlp" in out and "top1" in out and "full" in out
    for name in ("fc1", "relu1", "fc2", "relu2", "fc3"):
        assert f"\n{name} " in out
    assert "GRAD L2" in out and "MAX|G|" in out
    data = torch.load(mlp_capture, weights_only=True)
    l2 = data["layers"]["fc3"]["calls"][0]["stats"]["grad_output"]["l2"]
    assert fmt_num(l2) in out


def test_inspect_one_layer_details(mlp_capture, capsys):
    code, out, err = run(capsys, "inspect", mlp_capture, "--layer", "fc2")
    assert code == 0, err
    assert "fc2 (Linear), call 0" in out and "grad_input" in out and "parameter gradients" in out
    assert "\nfc1 " not in out
    code, out, err = run(capsys, "inspect", mlp_capture, "--layer", "fc22")
    assert_user_error(code, err, "fc22", "fc2")


def test_inspect_refuses_a_foreign_file(tmp_path, capsys):
    foreign = tmp_path / "weights.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    code, out, err = run(capsys, "inspect", foreign)
    assert_user_error(code, err, "not a gradexplorer capture file")
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    code, out, err = run(capsys, "inspect", text)
    assert_user_error(code, err, "notes.pt")


def test_inspect_refuses_a_newer_version(mlp_capture, tmp_path, capsys):
    data = torch.load(mlp_capture, weights_only=True)
    data["version"] = 99
    newer = tmp_path / "newer.pt"
    torch.save(data, newer)
    code, out, err = run(capsys, "inspect", newer)
    assert_user_error(code, err, "version 99", "Update gradexplorer")


# ---------------------------------------------------------------------------
# models, layers, devices
# ---------------------------------------------------------------------------


def test_models_lists_resnet18(capsys):
    code, out, err = run(capsys, "models")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("resnet18 "))
    assert "classification" in row and "IMAGENET1K_V1*" in row
    code, out, err = run(capsys, "models", "--task", "segmentation")
    assert code == 0 and "fcn_resnet50" in out and "\nresnet18 " not in out
    code, out, err = run(capsys, "models", "--task", "segmentaton")
    assert_user_error(code, err, "segmentation")


def test_models_cached_only(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    import torchvision

    checkpoints = tmp_path / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    url = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url
    (checkpoints / os.path.basename(url)).write_bytes(b"placeholder")
    code, out, err = run(capsys, "models", "--cached")
    assert code == 0, err
    rows = [line for line in out.splitlines()[2:] if line and not line.startswith(("1 models", "\n"))]
    assert rows[0].startswith("resnet18 ") and "IMAGENET1K_V1" in rows[0].split("classification")[1]
    assert "1 models, 1 with cached weights" in out


def test_layers_shows_the_module_tree(capsys):
    code, out, err = run(capsys, "layers", "--model", "resnet18")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.strip().startswith("layer1.0.conv1 "))
    assert "Conv2d" in row and "36,864" in row
    assert "11,689,512 parameters" in out


def test_layers_depth_and_probe(capsys):
    code, out, err = run(capsys, "layers", "--model", "resnet18", "--depth", "2", "--probe")
    assert code == 0, err
    assert "layer1.0.conv1" not in out and "layer1.0 " in out
    relu = next(line for line in out.splitlines() if line.strip().startswith("relu "))
    assert "in-place" in relu and "1x64x112x112" in relu
    code, out, err = run(capsys, "layers", "--model", "resnet18", "--probe", "--random", "1x3x64x64")
    assert code == 0, err
    block_relu = next(line for line in out.splitlines() if line.strip().startswith("layer1.0.relu "))
    assert "reused x2" in block_relu and "1x64x16x16" in block_relu


def test_devices_lists_the_cpu(capsys):
    code, out, err = run(capsys, "devices")
    assert code == 0, err
    assert any(line.startswith("cpu") for line in out.splitlines())


# ---------------------------------------------------------------------------
# the desktop app path (gradexplorer_app.window.launch faked: the CLI's job is to hand over the flags)
# ---------------------------------------------------------------------------


@pytest.fixture
def fake_gui(monkeypatch):
    calls = []
    module = types.ModuleType("gradexplorer_app.window.launch")

    def launch(options=None, **kwargs):
        calls.append({"options": options, **kwargs})
        return 0

    module.launch = launch
    monkeypatch.setitem(sys.modules, "gradexplorer_app.window.launch", module)
    return calls


def test_no_subcommand_opens_the_gui_on_its_demo(fake_gui, capsys):
    from gradexplorer.pipeline.options import CaptureOptions

    assert main([]) == 0
    assert fake_gui == [{"options": CaptureOptions("demo:shapes"), "run": True, "screenshot": None,
                         "capture": None}]


def test_gui_flags_are_handed_to_launch_as_the_capture_commands_options(fake_gui, tmp_path, capsys):
    from gradexplorer.pipeline.options import BatchSpec

    shot = tmp_path / "out.png"
    settings = ["--model", "resnet18", "--weights", "DEFAULT", "--input", "cat.jpg", "dog.jpg",
                "--layers", "layer4.*", "--target", "class:281", "--device", "cpu", "--stats-only", "--trust",
                "--labels", "281", "--memory-budget", "2GiB"]
    assert main([*settings, "--run", "--screenshot", str(shot)]) == 0
    (call,) = fake_gui
    assert call["run"] is True and call["screenshot"] == str(shot)
    options = call["options"]
    # The capture command's options from the same words: one argument -> options function.
    assert options == common.capture_options(cli.build_parser().parse_args(["capture", *settings, "--out", "x.pt"]))
    assert (options.model, options.weights, options.trust) == ("resnet18", "DEFAULT", True)
    assert options.batch == BatchSpec(inputs=("cat.jpg", "dog.jpg")) and options.layers == ("layer4.*",)
    assert (options.target, options.device, options.mode, options.labels) == ("class:281", "cpu", "stats", "281")
    assert options.memory_budget == 2 * 2**30


def test_gui_flags_without_a_model_go_to_the_demo(fake_gui, capsys):
    assert main(["--target", "sum", "--stats-only"]) == 0
    (call,) = fake_gui
    assert call["options"].model == "demo:shapes" and call["run"] is True
    assert call["options"].target == "sum" and call["options"].mode == "stats"


def test_a_capture_file_as_the_only_argument_opens_in_the_window(fake_gui, mlp_capture, tmp_path, capsys):
    assert main([str(mlp_capture)]) == 0
    assert fake_gui[-1]["capture"] == str(mlp_capture) and fake_gui[-1]["options"] is None
    assert main([str(mlp_capture), "--screenshot", str(tmp_path / "s.png")]) == 0
    assert fake_gui[-1]["capture"] == str(mlp_capture) and fake_gui[-1]["screenshot"] == str(tmp_path / "s.png")
    assert main(["--open", str(mlp_capture)]) == 0 and fake_gui[-1]["capture"] == str(mlp_capture)
    calls = len(fake_gui)
    code, out, err = run(capsys, tmp_path / "missing.pt")
    assert_user_error(code, err, "there is no file", "missing.pt")
    code, out, err = run(capsys, "inspcet")
    assert_user_error(code, err, "did you mean the command 'inspect'")
    code, out, err = run(capsys, mlp_capture, "--model", "resnet18")
    assert code == 2 and "opens without a model" in err and "--model" in err
    assert len(fake_gui) == calls  # the window never opened for these


def test_gui_random_input_and_bad_screenshot_folder(fake_gui, tmp_path, capsys):
    from gradexplorer.pipeline.options import BatchSpec

    assert main(["--model", "demo:seed-mlp", "--random", "4x10"]) == 0
    assert fake_gui[-1]["options"].batch == BatchSpec(random="4x10") and fake_gui[-1]["run"] is False
    assert fake_gui[-1]["options"].batch.sources() == ["random:4x10"]
    code, out, err = run(capsys, "--screenshot", tmp_path / "missing" / "x.png")
    assert_user_error(code, err, "does not exist")


def test_gui_bad_settings_are_one_line_before_the_window_opens(fake_gui, capsys):
    code, out, err = run(capsys, "--model", "demo:seed-mlp", "--target", "top5")
    assert_user_error(code, err, "top5", "class:N")
    code, out, err = run(capsys, "--memory-budget", "lots")
    assert_user_error(code, err, "--memory-budget 'lots' is not a size", "GiB")
    assert fake_gui == []


# ---------------------------------------------------------------------------
# formatting helpers
# ---------------------------------------------------------------------------


def test_human_size_and_numbers():
    assert human_size(0) == "0 B"
    assert human_size(1023) == "1023 B"
    assert human_size(1536) == "1.5 KiB"
    assert human_size(12.3 * 2**20) == "12.3 MiB"
    assert human_size(None) == "?"
    assert fmt_num(None) == "-" and fmt_num(float("nan")) == "nan" and fmt_num(0.0) == "0"
    assert fmt_num(1.23456e-5) == "1.23e-05" and fmt_num(0.5) == "0.5"


def test_table_aligns_columns():
    text = table(["A", "NUM"], [["x", "1"], ["long", "1000"]], "lr")
    lines = text.splitlines()
    assert lines[0] == "A      NUM" and lines[2] == "x        1" and lines[3] == "long  1000"


class _Stream:
    def __init__(self, tty: bool):
        self.tty = tty
        self.parts: list[str] = []
        self.encoding = "utf-8"

    def isatty(self):
        return self.tty

    def write(self, text):
        self.parts.append(text)

    def flush(self):
        pass


def test_progress_bar_redraws_on_a_terminal_and_logs_lines_elsewhere():
    tty = _Stream(True)
    bar = ProgressBar(tty)
    bar.update("forward", 1, 10)
    bar.update("forward", 5, 10)
    bar.update("backward", 10, 10)
    bar.close()
    text = "".join(tty.parts)
    assert text.count("\r") >= 3 and "50.0%" in text and text.endswith("\n")

    log = _Stream(False)
    bar = ProgressBar(log, interval=3600)
    for i in range(100):
        bar.update("forward", i, 100)
    bar.update("saving")
    text = "".join(log.parts)
    assert "\r" not in text
    lines = text.splitlines()
    # A line when the stage starts, its last state when it ends: 99/100, not 0/100 only.
    assert len(lines) == 3 and "0/100" in lines[0] and "99/100" in lines[1] and lines[2] == "saving ..."
    bar.update("backward", 3, 10)
    bar.update("backward", 7, 10)
    bar.clear()  # before an error message: how far it got
    bar.close()
    assert "".join(log.parts).splitlines()[-1].split()[3] == "7/10"


# ---------------------------------------------------------------------------
# real processes: the entry point, and no Qt on the CLI path
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_python_dash_m_app_capture(tmp_path):
    out_file = tmp_path / "sub.pt"
    proc = subprocess.run(
        [sys.executable, "-m", "gradexplorer", "capture", "--model", "demo:seed-mlp", "--random", "4x10",
         "--out", str(out_file)],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert out_file.is_file() and "wrote" in proc.stdout
    assert list(torch.load(out_file, weights_only=True)["layers"]) == ["fc1", "relu1", "fc2", "relu2", "fc3"]

    proc = subprocess.run(
        [sys.executable, "-m", "gradexplorer", "capture", "--model", "resnt18", "--random", "1x3x8x8",
         "--out", str(tmp_path / "x.pt"), "--quiet"],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == common.EXIT_USER
    assert proc.stderr.count("\n") == 1 and "resnet18" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_cli_capture_imports_no_qt(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from gradexplorer_app.cli.main import main
        code = main(["capture", "--model", "demo:seed-mlp", "--random", "4x10",
                     "--out", {str(tmp_path / 'q.pt')!r}, "-q"])
        code = code or main(["inspect", {str(tmp_path / 'q.pt')!r}])
        code = code or main(["layers", "--model", "demo:seed-mlp", "--probe"])
        code = code or main(["devices"])
        qt = sorted(m for m in sys.modules if m.split(".")[0] in {QT_MODULES!r})
        print("QT:", qt)
        sys.exit(code)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=subprocess_env(),
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "QT: []" in proc.stdout, proc.stdout


def test_gui_refuses_pyside_release_that_crashes_on_old_python(monkeypatch, capsys):
    import sys as _sys
    from importlib import metadata

    from gradexplorer_app.cli import main as cli

    monkeypatch.setattr(metadata, "version", lambda name: "6.12.0")
    monkeypatch.setattr(_sys, "version_info", (3, 11, 7, "final", 0))
    code = cli.main(["--screenshot", "/tmp/never.png"])
    err = capsys.readouterr().err
    assert code != 0
    assert "PySide6 6.12.0" in err and "PySide6-Essentials!=6.12.0" in err


ONSET_FACTORY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Sqrt(nn.Module):
        def forward(self, x):
            return torch.sqrt(x)


    class Overflow(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), Sqrt())
            self.big = nn.Linear(4, 4)
            self.out = nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.big(self.head(x)))


    def make():
        torch.manual_seed(0)
        m = Overflow()
        with torch.no_grad():
            m.head[0].weight[:2].zero_()
            m.head[0].bias[:2].zero_()  # sqrt(0): an Inf gradient, a finite forward
            m.big.weight.fill_(1e38)
            m.big.bias.fill_(3e38)  # overflows whatever comes in
        return m.eval()
    """
)


def test_capture_and_inspect_say_where_nan_inf_began(tmp_path, capsys):
    """Not 'NaN/Inf in N layers: ...' leading with a layer whose only problem is its
    gradient: the forward onset (big overflowed), the backward onset, then the spread."""
    factory = tmp_path / "onset.py"
    factory.write_text(ONSET_FACTORY)
    out_file = tmp_path / "onset.pt"
    code, out, err = run(capsys, "capture", "--model", f"{factory}:make", "--trust", "--random", "3x4",
                         "--target", "sum", "--stats-only", "--out", out_file, "--quiet")
    assert code == 0, err
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("NaN/Inf"))
    assert "forward: first at 'big' (Linear), call 0" in lines[first] and "inputs were finite" in lines[first]
    assert "backward:" in lines[first + 1]
    assert "hold NaN/Inf in all" in lines[first + 2]
    code, out2, err = run(capsys, "inspect", out_file)
    assert code == 0, err
    assert "forward: first at 'big' (Linear), call 0" in out2
