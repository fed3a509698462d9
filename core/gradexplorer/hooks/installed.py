"""The one way the engine puts hooks on a model and takes them off again.

A tool that reads gradients must leave the user's model exactly as it found it: no hook
left behind on any module or tensor, every module's ``training`` flag as it was, and the
BatchNorm running statistics (``running_mean``, ``running_var``, ``num_batches_tracked``)
that a train-mode forward updates put back. :func:`hooks_installed` does all of it in
``finally``, so a forward or backward that raises (or a Ctrl+C, ``KeyboardInterrupt``)
leaves nothing behind either; torchinfo's ``apply_hooks`` with its ``finally`` and
TransformerLens's registry of hook handles work the same way.

Inside the ``with`` block hooks are registered through the :class:`Hooks` it yields
(``call_hooks``, ``forward_pre``, ``forward``, ``tensor``, ``gradient``, ``post_accumulate``,
``optimizer_step_pre``), which keeps every handle. Blocks nest: each removes only the hooks registered through its own
:class:`Hooks`, and each puts back the model state it found.

Module backward hooks are not offered: the legacy one reports the wrong tensors and the
full one breaks on in-place operations and dict outputs. A forward hook that puts a
tensor hook on the output (:meth:`Hooks.gradient`) receives the gradient instead.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


class Hooks:
    """The hooks of one :func:`hooks_installed` block, with their handles.

    Each method registers one kind of hook and keeps its handle; :meth:`remove` takes them
    all off. ``len(hooks)`` is the number of hooks held (a handle each, or a place in a
    module's hook dictionary: :meth:`call_hooks`).
    """

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []
        # Shared call hooks (call_hooks): (modules, pre-hook id or None, forward hook id).
        self._shared: list[tuple[list[nn.Module], int | None, int]] = []

    def __len__(self) -> int:
        return len(self._handles) + sum(len(ms) * (1 + (pre is not None)) for ms, pre, _ in self._shared)

    def call_hooks(self, modules: Iterable[nn.Module], post: Callable[[nn.Module, tuple, Any], Any],
                   pre: Callable[[nn.Module, tuple, dict], Any] | None = None) -> None:
        """The same two functions as every module's forward pre-hook (``pre(module, args,
        kwargs)``, as ``register_forward_pre_hook(pre, with_kwargs=True)``) and forward hook
        (``post(module, args, output)``), kept for removal.

        What ``register_forward_pre_hook`` and ``register_forward_hook`` would do, without a
        closure and a ``RemovableHandle`` per module and hook (a capture of a 200-layer MLP
        paid them at every module): each function goes into every module's hook dictionary
        under one id, drawn from the counter torch's own handles draw from (so no other
        hook has it), and :meth:`remove` takes the id out of the same dictionaries. The
        hooks tell modules apart by their argument (``id(module)``). A module whose class
        registers hooks its own way (a ``ScriptModule`` refuses them) gets them through the
        ordinary registration, which raises as it would.
        """
        plain = []
        pre_id = _new_hook_id() if pre is not None else None
        post_id = _new_hook_id()
        for m in modules:
            cls = type(m)
            if (cls.register_forward_hook is not _REGISTER_FORWARD
                    or cls.register_forward_pre_hook is not _REGISTER_FORWARD_PRE):
                if pre is not None:
                    self.forward_pre(m, pre, with_kwargs=True)
                self.forward(m, post)
                continue
            # As register_forward_pre_hook(pre, with_kwargs=True), register_forward_hook(post).
            if pre is not None and pre_id is not None:
                m._forward_pre_hooks[pre_id] = pre
                m._forward_pre_hooks_with_kwargs[pre_id] = True
            m._forward_hooks[post_id] = post
            plain.append(m)
        self._shared.append((plain, pre_id, post_id))

    def forward_pre(self, module: nn.Module, fn: Callable[..., Any], *,
                    with_kwargs: bool = False) -> RemovableHandle:
        """``module.register_forward_pre_hook(fn, with_kwargs=...)``, kept for removal."""
        handle = module.register_forward_pre_hook(fn, with_kwargs=with_kwargs)
        self._handles.append(handle)
        return handle

    def forward(self, module: nn.Module, fn: Callable[..., Any], *,
                with_kwargs: bool = False) -> RemovableHandle:
        """``module.register_forward_hook(fn, with_kwargs=...)``, kept for removal.

        The hook runs only when forward returns (not ``always_call``): a forward that
        raised has no output to record.
        """
        handle = module.register_forward_hook(fn, with_kwargs=with_kwargs)
        self._handles.append(handle)
        return handle

    def tensor(self, t: torch.Tensor, fn: Callable[[torch.Tensor], Any]) -> RemovableHandle:
        """``t.register_hook(fn)``: ``fn(grad)`` when the gradient with respect to ``t``
        is computed; kept for removal."""
        handle = t.register_hook(fn)
        self._handles.append(handle)
        return handle

    def node_prehook(self, node: torch.autograd.graph.Node,
                     fn: Callable[[tuple[torch.Tensor | None, ...]], Any]) -> RemovableHandle:
        """``node.register_prehook(fn)``: ``fn(grad_outputs)`` just before the autograd node
        runs, with the gradients with respect to each of its outputs (``None`` for one the
        backward gave none); kept for removal."""
        handle = node.register_prehook(fn)
        self._handles.append(handle)
        return handle

    def post_accumulate(self, param: torch.Tensor, fn: Callable[[torch.Tensor], Any]) -> RemovableHandle:
        """``param.register_post_accumulate_grad_hook(fn)``: ``fn(param)`` after
        ``param.grad`` is written (leaf tensors only; frozen parameters never fire)."""
        handle = param.register_post_accumulate_grad_hook(fn)
        self._handles.append(handle)
        return handle

    def optimizer_step_pre(self, optimizer: torch.optim.Optimizer,
                           fn: Callable[[torch.optim.Optimizer, tuple, dict], Any]) -> RemovableHandle:
        """``optimizer.register_step_pre_hook(fn)``: ``fn(optimizer, args, kwargs)`` just
        before ``optimizer.step()`` updates the parameters, with the gradients it steps with
        (after a trainer's unscaling and clipping); kept for removal."""
        handle = optimizer.register_step_pre_hook(fn)
        self._handles.append(handle)
        return handle

    def gradient(self, t: torch.Tensor, on_grad: Callable[[torch.Tensor | None], None], *,
                 when: Callable[[], bool] | None = None) -> None:
        """Call ``on_grad`` once with the gradient with respect to ``t``, the value it has now.

        A tensor hook registered before a later in-place change of ``t`` receives the
        gradient with respect to the value before the change. But an in-place operation on
        a *view* (a Linear on a (B, H, W, C) input, then ``ReLU(inplace=True)``) rebases the
        view's history and its own hooks never fire. The base's hook still does, before the
        change: when the view's hook has not fired, the view's part is cut out of the
        base's gradient and handed to ``on_grad``.

        A tensor hook fires in every backward through its tensor, also in one that the
        model's own forward runs (``torch.autograd.grad(energy, pos, create_graph=True)``
        in a force field, a gradient penalty, a PINN). With ``when``, only the backwards
        during which ``when()`` is true count: the hooks do nothing in the others.

        ``on_grad`` receives ``None`` where autograd computed the tensor's node but gave no
        gradient for it (one output of several that the target does not use).
        """
        base = t._base if t._is_view() else None
        if base is None or not base.requires_grad or not base.is_contiguous():
            # No base to fall back on (most tensors): one hook, one closure at most, as a
            # capture registers one for every module's output.
            if when is None:
                self.tensor(t, on_grad)
            else:
                def checked(grad: torch.Tensor | None) -> None:
                    if when():
                        on_grad(grad)

                self.tensor(t, checked)
            return
        fired = [False]

        def own(grad: torch.Tensor | None) -> None:
            if when is not None and not when():
                return
            fired[0] = True
            on_grad(grad)

        self.tensor(t, own)
        size, stride = t.size(), t.stride()
        offset = t.storage_offset() - base.storage_offset()

        def from_base(grad: torch.Tensor | None) -> None:
            if fired[0] or (when is not None and not when()):
                return
            on_grad(None if grad is None else grad.contiguous().as_strided(size, stride, offset))

        self.tensor(base, from_base)

    def remove(self) -> None:
        """Take every hook registered through this object off; it may be used again."""
        handles, self._handles = self._handles, []
        shared, self._shared = self._shared, []
        for modules, pre_id, post_id in shared:
            for m in modules:  # what RemovableHandle.remove does for each, in the dictionaries call_hooks wrote
                if pre_id is not None:
                    m._forward_pre_hooks.pop(pre_id, None)
                    m._forward_pre_hooks_with_kwargs.pop(pre_id, None)
                m._forward_hooks.pop(post_id, None)
        for handle in handles:
            handle.remove()


_REGISTER_FORWARD = nn.Module.register_forward_hook
_REGISTER_FORWARD_PRE = nn.Module.register_forward_pre_hook


def _new_hook_id() -> int:
    """A hook id no other hook has: the next of the counter torch's handles take theirs from
    (a handle on a dictionary of its own draws it)."""
    return RemovableHandle(OrderedDict()).id


def model_device(model: nn.Module) -> torch.device | None:
    """The device of the model's first parameter (or buffer); ``None`` when it has neither."""
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return None


#: (module, buffer name) -> (the tensor the module held, a copy of its values).
_SavedBuffers = dict[tuple[nn.Module, str], tuple[torch.Tensor, torch.Tensor]]


def _buffers_saved(modules: Iterable[nn.Module]) -> _SavedBuffers:
    saved: _SavedBuffers = {}
    for module in modules:
        for name, b in module._buffers.items():
            if b is not None:
                saved[(module, name)] = (b, b.detach().clone())
    return saved


def _buffers_restored(saved: _SavedBuffers) -> None:
    """Every buffer of ``saved`` back in its module, holding its saved values (on the
    device it is on now: the model may still be on the run's device)."""
    with torch.no_grad():
        for (module, name), (original, values) in saved.items():
            if module._buffers.get(name) is not original:
                module._buffers[name] = original
            if original.shape != values.shape:
                original.resize_(values.shape)
            original.copy_(values.to(original.device))


_MODULE_TRAIN = nn.Module.train


def _modes_agree(modules: Sequence[nn.Module], modes: dict[nn.Module, bool], train: bool) -> bool:
    """Whether ``model.train(train)`` would change nothing: every module is in that mode
    already and none has a ``train`` of its own (which may do more than set the flag).
    ``train()`` walks the tree and sets the flag on every module through
    ``Module.__setattr__``: on a 200-layer model, a few microseconds per layer."""
    return (isinstance(train, bool) and all(mode is train for mode in modes.values())
            and all(type(m).train is _MODULE_TRAIN for m in modules))


@contextmanager
def model_state_preserved(model: nn.Module, train: bool | None = None,
                          device: torch.device | None = None,
                          modules: Sequence[nn.Module] | None = None) -> Iterator[None]:
    """Put ``model`` in a run's mode (and on its device) and put it back afterwards.

    Parameters
    ----------
    model : nn.Module
    train : bool, optional
        The mode to run in (``model.train(train)``); ``None`` leaves the mode as it is.
    device : torch.device, optional
        Where to run: the model moves there on entry and back on exit.
    modules : sequence of nn.Module, optional
        ``list(model.modules())`` when the caller knows it without a walk
        (``gradexplorer.capturing.structure``).

    The ``training`` flag of every module is restored on exit, whatever happened inside,
    also when ``train`` is ``None`` (a forward may change modes). So is every buffer, in
    either mode: a train-mode forward updates BatchNorm's running statistics, and an
    eval-mode one still updates what does not follow ``training`` (the observers of a
    quantization-aware model: ``scale``, ``zero_point``, ``min_val``, ``max_val``). Each
    buffer is copied on entry and written back on exit into the tensor the module held
    (put back in place if forward replaced it, resized if forward resized it): version
    counters would not tell a write through ``.data`` apart from no write at all.
    """
    if modules is None:
        modules = list(model.modules())
    modes = {m: m.training for m in modules}
    saved_buffers = _buffers_saved(modules)
    original_device = model_device(model)
    moved = device is not None and original_device is not None and original_device != device
    try:
        if moved:
            model.to(device)
        if train is not None and not _modes_agree(modules, modes, train):
            model.train(train)
        yield
    finally:
        _buffers_restored(saved_buffers)
        for m, mode in modes.items():
            if m.training != mode:  # Module.__setattr__ is slow: 1,400 modules add up
                m.training = mode
        if moved:
            model.to(original_device)


@contextmanager
def hooks_installed(model: nn.Module | None = None, *, train: bool | None = None,
                    device: torch.device | None = None,
                    modules: Sequence[nn.Module] | None = None) -> Iterator[Hooks]:
    """Hooks for the length of a ``with`` block, and the model as it was afterwards.

    Parameters
    ----------
    model : nn.Module, optional
        The model the block runs: its modes, its buffers (in train mode) and its device are
        preserved as :func:`model_state_preserved` does. Without it only the hooks are
        managed (a block nested in another that preserves the model).
    train : bool, optional
        The mode to run in; ``None`` leaves it as it is.
    device : torch.device, optional
        Where to run; ``None`` runs where the model is.
    modules : sequence of nn.Module, optional
        As in :func:`model_state_preserved`.

    Yields
    ------
    Hooks
        Register every hook through it. On exit, normal or not (an exception in forward or
        backward, ``KeyboardInterrupt``), every handle it holds is removed, then the
        model's buffers, modes and device are put back.

    Raises
    ------
    TypeError
        ``train`` or ``device`` without a ``model``.
    """
    if model is None and (train is not None or device is not None):
        raise TypeError("hooks_installed: train and device need the model.")
    hooks = Hooks()
    with model_state_preserved(model, train, device, modules) if model is not None else nullcontext():
        try:
            yield hooks
        finally:
            hooks.remove()
