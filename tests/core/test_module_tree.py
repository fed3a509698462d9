
import pytest
import torch
import torchvision
from torch import nn

from gradexplorer.base.errors import CaptureError
from gradexplorer.capturing.module_tree import ModuleTree
from tests.conftest import assert_no_hooks


def test_tree_counts_match_torch():
    model = torchvision.models.resnet18()
    model.layer1.requires_grad_(False)
    tree = ModuleTree.build(model)
    assert len(tree) == len(list(model.named_modules()))
    for name, module in model.named_modules():
        node = tree[name]
        assert node.type == type(module).__name__
        assert node.total_params == sum(p.numel() for p in module.parameters())
        assert node.own_params == sum(p.numel() for p in module.parameters(recurse=False))
    assert tree["layer1"].trainable is False
    assert tree["layer2"].trainable is True
    assert tree[""].trainable is False  # partly frozen
    assert tree["relu"].trainable is None
    assert tree["layer1.0"].children == ["layer1.0.conv1", "layer1.0.bn1", "layer1.0.relu",
                                         "layer1.0.conv2", "layer1.0.bn2"]
    assert set(tree.leaves()) == {n for n, m in model.named_modules() if n and not list(m.children())}
    assert tree.descendants("layer1.0") == tree["layer1.0"].children
    assert "layer4.1.conv2" in tree.of_type("Conv2d")


class _AddsOneInPlace(nn.Module):
    def forward(self, x):
        return x.add_(1)


def test_handing_the_input_back_unchanged_is_not_in_place():
    """Eval-mode Dropout and Identity return their input object unchanged: not in-place.
    ReLU(inplace=True) and a module that writes into its input are."""
    model = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5), nn.Identity(), nn.ReLU(inplace=True),
                          _AddsOneInPlace(), nn.Linear(3, 2))
    tree = ModuleTree.build(model).probe(model, torch.randn(2, 4))
    assert not tree["1"].inplace and not tree["2"].inplace
    assert tree["3"].inplace and tree["4"].inplace


def test_probe_calls_shapes_inplace_and_reuse():
    model = torchvision.models.resnet18()
    model.train()
    tree = ModuleTree.build(model).probe(model, torch.randn(2, 3, 64, 64))
    assert model.training  # mode restored
    assert_no_hooks(model)
    relu = tree["layer1.0.relu"]
    assert relu.calls == 2 and relu.reused and relu.inplace
    assert relu.output_shapes == [(2, 64, 16, 16)] * 2
    assert tree["layer1.0.conv1"].calls == 1 and not tree["layer1.0.conv1"].inplace
    assert tree["fc"].output_shapes == [(2, 1000)]
    assert tree["fc"].output_dtype == "float32"
    assert tree["fc"].output_bytes == 2 * 1000 * 4
    # Every module's calls, counted by hand with hooks.
    counts = {}
    hs = [m.register_forward_pre_hook(lambda m, a, n=n: counts.__setitem__(n, counts.get(n, 0) + 1))
          for n, m in model.named_modules()]
    with torch.no_grad():
        model(torch.randn(2, 3, 64, 64))
    for h in hs:
        h.remove()
    assert {n: tree[n].calls for n in counts} == counts
    assert tree.expected_calls() == sum(counts.values())


def test_shared_parameters_counted_once():
    lin = nn.Linear(3, 3)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    tree = ModuleTree.build(model)
    assert tree[""].total_params == 12
    assert len(tree) == 3  # named_modules drops the duplicate


def test_probe_failure_names_module():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(5, 1))
    with pytest.raises(CaptureError, match="'1'"):
        ModuleTree.build(model).probe(model, torch.randn(1, 4))
    assert_no_hooks(model)


@pytest.mark.slow
def test_build_is_fast_on_a_big_net():
    model = torchvision.models.efficientnet_b7()
    tree = ModuleTree.build(model)  # its speed: benchmarks/tree_build.py
    assert len(tree) == len(list(model.named_modules())) > 1000
    assert tree[""].total_params == sum(p.numel() for p in model.parameters())
