"""Models of several inputs: a .pt file holding a tuple, list or dict of tensors is passed
as positional or keyword arguments, through the probe and the capture, with gradients
checked against torch.autograd.grad on the same graph."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from gradexplorer.batches import load_batch, load_tensor_file
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer_app.cli.main import main


class TwoFrames(nn.Module):
    """Like optical flow: two images in, one map out."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 5)

    def forward(self, frame1, frame2, *, scale=None):
        y = torch.relu(self.a(frame1) + self.b(frame2)).mean((2, 3))
        y = self.head(y)
        return y * scale if scale is not None else y


def _frames(n=2):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randn(n, 3, 8, 8, generator=g)


@pytest.mark.parametrize("form", ["tuple", "list", "under_input"])
def test_positional_inputs_from_a_file(tmp_path, form):
    f1, f2 = _frames()
    labelled = {"input": (f1, f2), "labels": torch.tensor([1, 2])}
    obj = {"tuple": (f1, f2), "list": [f1, f2], "under_input": labelled}[form]
    torch.save(obj, tmp_path / "pair.pt")
    batch = load_tensor_file(tmp_path / "pair.pt")
    assert torch.equal(batch.tensor, f1) and len(batch) == 2
    assert len(batch.inputs.args) == 2 and torch.equal(batch.inputs.args[1], f2)
    assert "2 inputs" in batch.source
    if form == "under_input":
        assert batch.labels.tolist() == [1, 2]


def test_keyword_inputs_and_labels_from_a_dict(tmp_path):
    f1, f2 = _frames()
    torch.save({"frame1": f1, "frame2": f2, "labels": torch.tensor([0, 3])}, tmp_path / "kw.pt")
    batch = load_batch([str(tmp_path / "kw.pt")])
    assert set(batch.inputs.kwargs) == {"frame1", "frame2"} and batch.labels.tolist() == [0, 3]
    model = TwoFrames().eval()
    torch.testing.assert_close(batch.inputs.call(model), model(frame1=f1, frame2=f2))
    # the capture file keeps the keyword inputs, and they run the model again
    from gradexplorer.files.capture_file import load_capture, save_capture

    cap = capture(model, batch.model_input, target="sum", mode="stats")
    loaded = load_capture(save_capture(cap, tmp_path / "kw_cap.pt"))
    kept = loaded.model_inputs
    assert kept is not None and kept["args"] == [] and set(kept["kwargs"]) == {"frame1", "frame2"}
    assert torch.equal(kept["kwargs"]["frame2"], f2)
    torch.testing.assert_close(model(*kept["args"], **kept["kwargs"]), loaded.output)
    # one input: nothing more than "input"
    single = capture(nn.Sequential(nn.Flatten(), nn.Linear(192, 2)), f1, target="sum", mode="stats")
    assert single.model_inputs is None


def test_probe_and_capture_match_autograd(tmp_path):
    torch.manual_seed(0)
    model = TwoFrames().eval()
    f1, f2 = _frames()
    torch.save((f1, f2), tmp_path / "pair.pt")
    batch = load_tensor_file(tmp_path / "pair.pt")

    tree = ModuleTree.build(model).probe(model, batch.model_input[:1])
    assert tree.nodes["a"].calls == 1 and tree.nodes["b"].calls == 1

    cap = capture(model, batch.model_input, layers=["a", "b", "head"], target="sum", input_grad=True)
    # Ground truth on the same graph, by hand.
    x1 = f1.clone().requires_grad_(True)
    out = model(x1, f2)
    a_out = model.a(x1)
    grads = torch.autograd.grad(out.sum(), [model.head.weight, x1])
    torch.testing.assert_close(cap.layers["head"].param_grads["weight"], grads[0])
    torch.testing.assert_close(cap.input_grad, grads[1])
    torch.testing.assert_close(cap.layers["a"].calls[0].activation, a_out.detach())
    assert torch.equal(cap.input, f1)
    assert all(p.grad is None for p in model.parameters())


def test_cli_capture_with_a_pair_file(tmp_path, capsys):
    nets = tmp_path / "flow.py"
    nets.write_text(textwrap.dedent(
        """
        import torch
        from torch import nn

        class TwoFrames(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Conv2d(3, 4, 3, padding=1)
                self.b = nn.Conv2d(3, 4, 3, padding=1)

            def forward(self, frame1, frame2):
                return (self.a(frame1) + self.b(frame2)).mean((2, 3))

        def build():
            return TwoFrames()
        """
    ))
    torch.save(_frames(), tmp_path / "pair.pt")
    out = tmp_path / "cap.pt"
    code = main(["capture", "--model", f"{nets}:build", "--trust", "--input", str(tmp_path / "pair.pt"),
                 "--target", "sum", "--out", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    from gradexplorer.files.capture_file import load_capture

    cap = load_capture(out)
    assert set(cap.layers) >= {"a", "b"}
    # every input is in the file (only the first was), and runs the model again
    frames = _frames()
    frames = list(frames.values()) if isinstance(frames, dict) else list(frames)
    kept = cap.model_inputs
    assert kept is not None and len(kept["args"]) == 2 and kept["kwargs"] == {}
    for got, want in zip(kept["args"], frames):
        assert torch.equal(got, want)
    assert torch.equal(cap.input, frames[0])
    raw = torch.load(out, weights_only=True)
    assert torch.equal(raw["model_inputs"]["args"][1], frames[1])
    assert main(["inspect", str(out)]) == 0
    assert "(all inputs: 2 positional 2x3x8x8, 2x3x8x8)" in capsys.readouterr().out


def test_names_the_forward_does_not_take_are_refused_before_it_runs(tmp_path):
    from gradexplorer.base.errors import BatchError
    from gradexplorer.models.loaded_model import LoadedModel

    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "sd.pt")  # a state dict by mistake
    loaded = LoadedModel(module=TwoFrames(), spec="t", name="t")
    with pytest.raises(BatchError) as info:
        load_batch([str(tmp_path / "sd.pt")], loaded)
    assert "weight, bias" in info.value.problem and "frame1, frame2" in info.value.problem


def test_the_estimate_counts_every_input_while_forward_runs():
    from gradexplorer.capturing.inputs import ModelInputs
    from gradexplorer.capturing.memory_estimate import estimate_capture_memory
    from gradexplorer.capturing.selection import resolve_layers

    model = TwoFrames().eval()
    f1, f2 = _frames(4)
    both = ModelInputs((f1, f2))
    tree = ModuleTree.build(model).probe(model, both[:1])
    layers = resolve_layers(model, None)
    two = estimate_capture_memory(tree, layers, "full", both, False, model)
    one = estimate_capture_memory(tree, layers, "full", f1, False, model)
    # The capture keeps the primary input; forward holds both frames.
    assert two.io == one.io and two.activations == one.activations
    assert two.transient - one.transient == f2.numel() * f2.element_size()
    cap = capture(model, both)
    assert cap.input.shape == f1.shape


class Nested(nn.Module):
    """One argument holding several tensors: a pair of frames, and a dict of them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 5)

    def forward(self, pair, extra=None):
        first, second = pair
        y = self.a(first) + self.b(second)
        if extra is not None:
            y = y * extra["gain"]
        return self.head(torch.relu(y).mean((2, 3)))


@pytest.mark.parametrize("form", ["tuple", "list_and_dict"])
def test_an_argument_holding_several_tensors(form):
    from gradexplorer.capturing.inputs import ModelInputs
    from tests.ground_truth import assert_param_grads_equal, param_grads_by_autograd

    torch.manual_seed(0)
    model = Nested().eval()
    f1, f2 = _frames()
    gain = torch.rand(2, 1, 1, 1)
    inputs = (ModelInputs(((f1, f2),)) if form == "tuple"
              else ModelInputs(([f1, f2],), {"extra": {"gain": gain}}))
    assert inputs.primary is f1 and len(inputs) == 2
    cap = capture(model, inputs, target="top1", input_grad=True)
    x = f1.clone().requires_grad_(True)
    out = model((x, f2), extra={"gain": gain} if form != "tuple" else None)
    scalar = out.max(1).values.sum()
    want = param_grads_by_autograd(model, scalar, retain_graph=True)
    assert_param_grads_equal(cap, want, rtol=1e-6, atol=1e-8)
    (gx,) = torch.autograd.grad(scalar, x)
    torch.testing.assert_close(cap.input_grad, gx)
    torch.testing.assert_close(cap["a"].calls[0].grad_input, gx)
    # The capture keeps every argument, nested as given: they run the model again.
    again = cap.model_inputs
    torch.testing.assert_close(model(*again["args"], **again["kwargs"]), out)
    # Slicing a batch takes the same samples of every tensor inside the containers.
    half = inputs[:1]
    assert torch.equal(half.primary, f1[:1]) and torch.equal(half.args[0][1], f2[:1])


def test_inputs_without_any_tensor_are_refused_by_name():
    from gradexplorer.base.errors import GradExplorerError
    from gradexplorer.capturing.inputs import ModelInputs

    with pytest.raises(GradExplorerError, match=r"#1 tuple, scale=float"):
        capture(Nested(), ModelInputs(((1, 2),), {"scale": 2.0}))
