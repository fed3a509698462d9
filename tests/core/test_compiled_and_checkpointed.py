"""Models under torch.compile and models with activation checkpointing: every call counted
once, every number equal to plain autograd's on the same model."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.capture import capture
from tests.conftest import assert_no_hooks
from tests.core.test_capture import check_against_reference


def small_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_a_compiled_model_that_has_run_is_captured_through_its_eager_module():
    net = small_net()
    compiled = torch.compile(net, backend="eager")
    x = torch.randn(3, 8)
    compiled(x)  # after a run, hooks added to the compiled model never fire
    cap = capture(compiled, x)
    assert {name: len(rec.calls) for name, rec in cap.layers.items()} == {"0": 1, "1": 1, "2": 1}
    assert_no_hooks(net)
    check_against_reference(net, x)
    # The wrapper's names are understood too.
    assert list(capture(compiled, x, layers=["_orig_mod.2"]).layers) == ["2"]


def test_layers_inside_a_compiled_submodule_are_refused_in_words():
    net = small_net()
    net[2] = torch.compile(net[2], backend="eager")
    x = torch.randn(3, 8)
    net(x)
    with pytest.raises(GradExplorerError, match="torch.compile"):
        capture(net, x, layers=["0", "2._orig_mod"])
    assert_no_hooks(net)
    assert len(capture(net, x, layers=["0"])["0"].calls) == 1
