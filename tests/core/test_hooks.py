"""gradexplorer.hooks: every hook goes on through one context manager and comes off in its
``finally``, with the model's modes and BatchNorm statistics put back; every installer of
the engine uses it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from gradexplorer.hooks import Hooks, hooks_installed
from tests.conftest import assert_no_hooks, assert_unchanged, snapshot

ROOT = Path(__file__).resolve().parents[2]


class Boom(nn.Module):
    """Raises ``error`` in forward while ``error`` is set, else hands its input on."""

    def __init__(self) -> None:
        super().__init__()
        self.error: BaseException | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.error is not None:
            raise self.error
        return x


class FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("no gradient here")


class Net(nn.Module):
    """Conv, BatchNorm, ReLU, a module that can raise, pooling and a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.boom = Boom()
        self.fc = nn.Linear(4, 3)
        self.fail_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.boom(self.relu(self.bn(self.conv(x))))
        if self.fail_backward:
            y = FailingBackward.apply(y)
        return self.fc(y.mean(dim=(2, 3)))


def tensor_hooks(*tensors: torch.Tensor) -> int:
    return sum(len(t._backward_hooks or {}) + len(getattr(t, "_post_accumulate_grad_hooks", None) or {})
               for t in tensors)


def install_every_kind(hooks: Hooks, model: Net, x: torch.Tensor, seen: list[str]) -> None:
    hooks.forward_pre(model.conv, lambda m, a: seen.append("pre"))
    hooks.forward_pre(model.bn, lambda m, a, k: seen.append("pre kwargs"), with_kwargs=True)
    hooks.forward(model.relu, lambda m, a, o: hooks.gradient(o, lambda g: seen.append("gradient")))
    hooks.forward(model.fc, lambda m, a, k, o: seen.append("forward kwargs"), with_kwargs=True)
    hooks.tensor(x, lambda g: seen.append("tensor"))
    hooks.post_accumulate(model.fc.weight, lambda p: seen.append("accumulated"))


def test_hooks_are_removed_after_a_normal_run_and_each_kind_fired():
    model = Net()
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    seen: list[str] = []
    with hooks_installed(model) as hooks:
        install_every_kind(hooks, model, x, seen)
        model(x).sum().backward()
        assert len(hooks) > 6  # the gradient hook on relu's output too
    assert set(seen) == {"pre", "pre kwargs", "gradient", "forward kwargs", "tensor", "accumulated"}
    assert_no_hooks(model)
    assert tensor_hooks(x, *model.parameters()) == 0
    assert len(hooks) == 0


def test_hooks_are_removed_when_forward_raises():
    model = Net()
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    model.boom.error = ValueError("forward broke")
    with pytest.raises(ValueError, match="forward broke"), hooks_installed(model) as hooks:
        install_every_kind(hooks, model, x, [])
        model(x)
    assert_no_hooks(model)
    assert tensor_hooks(x, *model.parameters()) == 0


def test_hooks_are_removed_when_backward_raises():
    model = Net()
    model.fail_backward = True
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    seen: list[str] = []
    with pytest.raises(RuntimeError, match="no gradient here"), hooks_installed(model) as hooks:
        install_every_kind(hooks, model, x, seen)
        out = model(x)
        hooks.gradient(out, lambda g: seen.append("output gradient"))
        out.sum().backward()
    assert "output gradient" in seen  # backward had begun
    assert_no_hooks(model)
    assert tensor_hooks(x, out, *model.parameters()) == 0


def test_keyboard_interrupt_in_forward_leaves_the_model_as_it_was():
    model = Net().train()
    model.relu.eval()
    before = snapshot(model)
    x = torch.randn(4, 3, 5, 5)
    model.boom.error = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt), hooks_installed(model, train=True) as hooks:
        install_every_kind(hooks, model, x.requires_grad_(), [])
        model(x)  # BatchNorm's statistics move before the interrupt
    assert_unchanged(model, before)
    assert tensor_hooks(x, *model.parameters()) == 0


@pytest.mark.parametrize("train", [False, True, None])
def test_training_flags_are_restored_per_module(train):
    model = Net()
    model.train()
    model.bn.eval()
    model.boom.eval()
    flags = {n: m.training for n, m in model.named_modules()}
    with hooks_installed(model, train=train):
        if train is not None:
            assert all(m.training == train for m in model.modules())
        else:
            assert {n: m.training for n, m in model.named_modules()} == flags
        model.fc.train(not model.fc.training)  # a forward may change modes itself
        model.conv.eval()
    assert {n: m.training for n, m in model.named_modules()} == flags


@pytest.mark.parametrize("train", [False, True])
def test_the_mode_is_set_only_where_it_would_change_or_a_module_has_its_own_train(train, monkeypatch):
    calls: list[bool] = []
    model = Net().train(train)
    original = model.train

    def counted(mode=True):
        calls.append(mode)
        return original(mode)

    monkeypatch.setattr(model, "train", counted)  # the model's train(), which sets every module's
    with hooks_installed(model, train=train):  # every flag agrees already: nothing to set
        assert all(m.training == train for m in model.modules())
    assert calls == []
    model.bn.train(not train)
    calls.clear()
    with hooks_installed(model, train=train):  # one flag differs
        assert all(m.training == train for m in model.modules())
    assert calls[0] is train
    assert model.bn.training is (not train)

    class OwnTrain(nn.Linear):
        """Does more than set its flag when its mode is set (and ran only if asked)."""

        def train(self, mode=True):
            self.asked = mode
            return super().train(mode)

    model.fc = OwnTrain(4, 3).train(train)
    model.bn.train(train)
    with hooks_installed(model, train=train):
        pass
    assert model.fc.asked is train  # the flags agreed, and its own train() still ran


def test_batchnorm_statistics_are_restored_after_a_train_mode_run():
    model = Net().eval()
    model.bn.running_mean.fill_(0.25)
    model.bn.running_var.fill_(2.0)
    model.bn.num_batches_tracked.fill_(7)
    saved = {n: b.clone() for n, b in model.bn.named_buffers()}
    assert set(saved) == {"running_mean", "running_var", "num_batches_tracked"}
    with hooks_installed(model, train=True):
        model(torch.randn(4, 3, 5, 5) * 3 + 1).sum().backward()
        assert not torch.equal(model.bn.running_mean, saved["running_mean"])  # the run moved them
        assert int(model.bn.num_batches_tracked) == 8
    for name, b in model.bn.named_buffers():
        assert torch.equal(b, saved[name]), name
        assert b.dtype == saved[name].dtype
    assert not model.training


def test_nested_blocks_remove_only_their_own_hooks_and_restore_the_state_they_found():
    model = Net().train()
    before = snapshot(model)
    outer_calls: list[str] = []
    inner_calls: list[str] = []
    with hooks_installed(model, train=True) as outer:
        outer.forward(model.fc, lambda m, a, o: outer_calls.append("outer"))
        with hooks_installed(model, train=False) as inner:
            inner.forward(model.fc, lambda m, a, o: inner_calls.append("inner"))
            assert not any(m.training for m in model.modules())
            model(torch.randn(2, 3, 5, 5))
        assert all(m.training for m in model.modules())  # the outer block's mode is back
        assert len(inner) == 0 and len(outer) == 1
        model(torch.randn(2, 3, 5, 5))
        assert outer_calls == ["outer", "outer"] and inner_calls == ["inner"]
    assert_unchanged(model, before)


def _hook_dicts(model: nn.Module) -> dict:
    """Every module's forward hook dictionaries, as (key, hook) lists."""
    return {(n, attr): list(getattr(m, attr).items()) for n, m in model.named_modules()
            for attr in ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
                         "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")}


def _shared_hooks(hooks: Hooks, model: nn.Module, seen: list) -> None:
    names = {id(m): n for n, m in model.named_modules()}
    hooks.call_hooks(model.modules(),
                     lambda m, a, o: seen.append(("post", names[id(m)], isinstance(o, torch.Tensor))),
                     pre=lambda m, a, k: seen.append(("pre", names[id(m)], isinstance(k, dict))))


def test_call_hooks_fire_on_every_module_as_registered_hooks_and_leave_the_dicts_as_they_were():
    model = Net()
    user: list[str] = []
    # The user's own hooks stay, before and after ours, in their order.
    model.bn.register_forward_pre_hook(lambda m, a: user.append("user pre"))
    model.fc.register_forward_hook(lambda m, a, k, o: user.append("user post"), with_kwargs=True,
                                   always_call=True)
    before = _hook_dicts(model)
    seen: list = []
    with hooks_installed(model) as hooks:
        _shared_hooks(hooks, model, seen)
        assert len(hooks) == 2 * len(list(model.modules()))
        model(torch.randn(2, 3, 5, 5)).sum().backward()
    expected_names = ["", "conv", "bn", "relu", "boom", "fc"]
    assert [n for kind, n, _ in seen if kind == "pre"] == expected_names
    assert [n for kind, n, _ in seen if kind == "post"] == ["conv", "bn", "relu", "boom", "fc", ""]
    assert all(flag for _, _, flag in seen)  # kwargs a dict; every output a tensor
    assert user == ["user pre", "user post"]
    assert _hook_dicts(model) == before
    assert len(hooks) == 0


def test_call_hooks_are_taken_off_when_forward_raises_and_on_keyboard_interrupt():
    for error in (ValueError("forward broke"), KeyboardInterrupt()):
        model = Net()
        before = _hook_dicts(model)
        model.boom.error = error
        with pytest.raises(type(error)), hooks_installed(model) as hooks:
            _shared_hooks(hooks, model, [])
            model(torch.randn(2, 3, 5, 5))
        assert _hook_dicts(model) == before
        assert_no_hooks(model)


def test_call_hooks_of_nested_blocks_come_off_with_their_own_block():
    model = Net()
    outer_seen: list = []
    inner_seen: list = []
    with hooks_installed(model) as outer:
        _shared_hooks(outer, model, outer_seen)
        after_outer = _hook_dicts(model)
        with hooks_installed() as inner:
            _shared_hooks(inner, model, inner_seen)
            model(torch.randn(2, 3, 5, 5))
        assert _hook_dicts(model) == after_outer
        model(torch.randn(2, 3, 5, 5))
    assert len(outer_seen) == 2 * len(inner_seen) == 4 * len(list(model.modules()))
    assert_no_hooks(model)


def test_call_hooks_on_a_scripted_module_are_refused_as_registration_refuses_them():
    scripted = torch.jit.script(nn.Linear(3, 2))
    with pytest.raises(Exception) as direct:
        scripted.register_forward_hook(lambda m, a, o: None)
    with pytest.raises(type(direct.value)), hooks_installed() as hooks:
        hooks.call_hooks([scripted], lambda m, a, o: None, pre=lambda m, a, k: None)


def test_hooks_without_a_model_manage_hooks_only():
    model = Net().train()
    with hooks_installed() as hooks:
        hooks.forward(model.fc, lambda m, a, o: None)
        model.eval()
    assert not model.training  # no state was taken, so none is put back
    assert_no_hooks(model)
    with pytest.raises(TypeError, match="need the model"), hooks_installed(train=True):
        pass


def test_a_node_prehook_sees_each_output_gradient_and_comes_off_with_its_block():
    """``Hooks.node_prehook``: the hook receives the gradients at the node's outputs (``None``
    for the one the loss does not use) as ``torch.autograd.grad`` computes them, and a
    backward after the block calls it no more."""
    x = torch.randn(5, 3, requires_grad=True)
    var, mean = torch.var_mean(x * 2.0, dim=1)
    node = var.grad_fn
    seen: list[tuple] = []
    with hooks_installed() as hooks:
        hooks.node_prehook(node, lambda grads: seen.append(grads))
        assert len(hooks) == 1
        loss = (mean * torch.arange(5.0)).sum()
        (g_mean,) = torch.autograd.grad(loss, mean, retain_graph=True)
        assert seen == []  # asked for the gradient at mean: the node itself never ran
        torch.autograd.grad(loss, x, retain_graph=True)
    assert len(seen) == 1 and seen[0][0] is None
    torch.testing.assert_close(seen[0][1], g_mean)
    torch.autograd.grad(loss, x)
    assert len(seen) == 1 and len(hooks) == 0


def test_gradient_of_a_view_rebased_by_an_in_place_op_comes_from_its_base():
    """A Linear on a (B, H, W, C) input gives a view; ReLU(inplace) on it rebases the view's
    history, so its own hook never fires: the base's gradient, cut to the view, is handed
    on, and it equals autograd's gradient with respect to the view's value."""
    lin = nn.Linear(4, 5)
    x = torch.randn(2, 3, 3, 4, requires_grad=True)
    w = torch.randn(2, 3, 3, 5)
    got: list[torch.Tensor] = []
    own: list[torch.Tensor] = []
    with hooks_installed() as hooks:
        y = lin(x)
        assert y._is_view()
        hooks.gradient(y, got.append)
        hooks.tensor(y, own.append)
        y.relu_()
        (y * w).sum().backward()
    assert own == []  # the view's own hook never fired
    y_ref = lin(x.detach())
    y_ref.requires_grad_(True)
    (ref,) = torch.autograd.grad((y_ref.relu() * w).sum(), y_ref)
    assert len(got) == 1 and torch.equal(got[0], ref)
    assert tensor_hooks(y, y._base if y._base is not None else y) == 0


# -- every installer of the engine goes through gradexplorer.hooks -----------------------------

INSTALLERS = ("capturing/capture.py", "capturing/module_tree.py", "recording/layer_recorder.py",
              "model_graph/graph.py", "model_graph/grads.py", "pipeline/job.py", "recording/dataset_capture.py",
              "recording/sharded_dataset.py", "integrations/trainer_watch.py", "integrations/transformers.py")
#: The ``.remove()`` calls that are LayerRecorder.remove, which closes its hooks_installed
#: block: (file, receiver).
RECORDER_REMOVES = {("recording/dataset_capture.py", "recorder"), ("recording/sharded_dataset.py", "recorder"),
                    ("recording/watch.py", "self._recorder"), ("recording/layer_recorder.py", "self")}
ENGINE = ROOT / "core" / "gradexplorer"


def _calls(path: Path) -> list[tuple[int, str, str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.lineno, node.func.attr, ast.unparse(node.func.value), len(node.args) + len(node.keywords))
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)]


def test_no_hook_is_registered_or_removed_outside_gradexplorer_hooks():
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE).as_posix()
        if rel.startswith("hooks/"):
            continue
        for line, attr, receiver, n_args in _calls(path):
            if attr.startswith("register_") and attr.endswith("hook"):
                found.append(f"{rel}:{line}: {receiver}.{attr}(...)")
            elif attr == "remove" and n_args == 0 and (rel, receiver) not in RECORDER_REMOVES:
                found.append(f"{rel}:{line}: {receiver}.remove()")
    assert not found, "hooks outside gradexplorer.hooks:\n" + "\n".join(found)


@pytest.mark.parametrize("installer", INSTALLERS)
def test_each_installer_uses_gradexplorer_hooks(installer):
    tree = ast.parse((ENGINE / installer).read_text(encoding="utf-8"))
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "gradexplorer.hooks.installed" for a in node.names}
    assert imported & {"hooks_installed", "model_state_preserved"}, installer


# -- the installers leave the model as it was when forward is interrupted -----------------------


def _interrupted(run) -> None:
    model = Net().eval()
    before = snapshot(model)
    model.boom.error = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        run(model, torch.randn(4, 3, 5, 5))
    model.boom.error = None
    assert_unchanged(model, before)


def test_capture_interrupted_in_train_mode_leaves_the_model_as_it_was():
    from gradexplorer.capturing.capture import capture

    _interrupted(lambda model, x: capture(model, x, train=True))


def test_graph_gradients_interrupted_in_train_mode_leave_the_model_as_it_was():
    from gradexplorer.model_graph.grads import graph_gradients

    _interrupted(lambda model, x: graph_gradients(model, x, train=True))


def test_graph_and_probe_interrupted_leave_the_model_as_they_were():
    from gradexplorer.capturing.module_tree import ModuleTree
    from gradexplorer.model_graph.graph import extract_graph

    _interrupted(extract_graph)
    _interrupted(lambda model, x: ModuleTree.build(model).probe(model, x))


def test_layer_recorder_interrupted_leaves_no_hook():
    from gradexplorer.recording.layer_recorder import LayerRecorder

    def run(model, x):
        with LayerRecorder(model, ["conv", "bn", "relu", "fc"]):
            model(x)

    _interrupted(run)
