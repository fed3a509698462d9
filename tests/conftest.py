import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def assert_no_hooks(model: torch.nn.Module) -> None:
    """No hook of any kind is left on any module."""
    for name, m in model.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                     "_backward_pre_hooks", "_forward_hooks_with_kwargs",
                     "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called"):
            d = getattr(m, attr, None)
            assert not d, f"{attr} left on module '{name}': {d}"


def snapshot(model: torch.nn.Module) -> dict:
    """Everything about a model that a capture must leave as it was."""
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "grads": {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()},
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
        "training": {n: m.training for n, m in model.named_modules()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
    }


def assert_unchanged(model: torch.nn.Module, before: dict) -> None:
    after = snapshot(model)
    assert after["training"] == before["training"]
    assert after["requires_grad"] == before["requires_grad"]
    for kind in ("params", "buffers"):
        for n, t in before[kind].items():
            assert torch.equal(after[kind][n], t), f"{kind} {n} changed"
    for n, g in before["grads"].items():
        h = after["grads"][n]
        assert (g is None) == (h is None), f".grad of {n} changed"
        if g is not None:
            assert torch.equal(g, h), f".grad of {n} changed"
    assert_no_hooks(model)


def pytest_configure(config):
    """Compile the numba kernels once, in one process, before any test runs.

    Under xdist each worker would otherwise compile the kernels it meets first and load the
    others from the cache another worker wrote; the two kinds can order a block's float64
    sums differently (``gradexplorer.stats.cpu.prepare``), and the tests that demand the
    batched statistics equal each tensor's own to the last bit would then depend on which
    worker compiled what. A separate process, so that this one (or a worker) starts as a
    user's would, with the kernels in numba's on-disk cache.
    """
    if hasattr(config, "workerinput"):  # an xdist worker: the controller has done it
        return
    import subprocess

    code = ("import torch\nfrom gradexplorer.stats import cpu\n"
            "cpu.prepare([torch.float32, torch.float64, torch.float16, torch.bfloat16])\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False, timeout=900)
