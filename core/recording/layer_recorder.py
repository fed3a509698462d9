"""Hooks that record mergeable statistics of selected modules for one forward and backward.

Shared by the watch (``gradexplorer.recording.watch``, one training step) and the dataset capture
(``gradexplorer.recording.dataset``, one batch). Per selected module and per call it records the
activation, the gradient with respect to it and the per-sample norms of that gradient, as
``gradexplorer.stats.merge.MergeStats`` keyed ``(module name, call index, kind)``.

Why it is built this way (docs/ARCHITECTURE.md, "Facts the code relies on"): a forward
hook summarises the output at once (a later in-place op would change it) and registers a
*tensor* hook on it (module backward hooks break on in-place ReLUs and dict outputs); the
hooks return nothing, so the values and gradients flowing through are not changed. The
hooks are those of one ``gradexplorer.hooks.hooks_installed`` block, opened by
``install()`` and closed by ``remove()``, which takes every handle off.

An output (or its gradient) that is a ``DTensor`` (tensor parallelism with
``use_local_output=False``) is summarised by the part this rank holds, as a plain local
output would be; one whose reduction is still pending (``Partial``: each rank holds a
summand) has no statistics of its own and is listed in ``unrecorded`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from gradexplorer.base.errors import CaptureCancelled
from gradexplorer.capturing import recomputation
from gradexplorer.capturing.capture import primary_tensor
from gradexplorer.capturing.sharded_params import is_dtensor
from gradexplorer.hooks.installed import Hooks, hooks_installed
from gradexplorer.stats.merge import MergeStats, per_sample_norms

#: Row key: (layer or parameter name, call index, kind).
RowKey = tuple[str, int, str]


class LayerRecorder:
    """Record statistics of ``layers`` of ``model`` while installed.

    Parameters
    ----------
    model : nn.Module
    layers : iterable of str
        Qualified module names to hook.
    grad_norms : bool
        Also record the per-sample L2 norms of each output gradient (``grad_norm`` rows).
    grad_scale : callable, optional
        Returns the factor the output gradients are scaled by (an AMP GradScaler's scale);
        asked once per backward, the gradients are divided by it.
    cancel : object with ``is_set()``, optional
        Checked at every hooked call and gradient: raises ``CaptureCancelled``.
    """

    def __init__(self, model: nn.Module, layers: Iterable[str], *, grad_norms: bool = True,
                 grad_scale: Callable[[], float] | None = None, cancel: Any = None) -> None:
        modules = dict(model.named_modules())
        self.modules = {name: modules[name] for name in layers}
        self.grad_norms = grad_norms
        self.grad_scale = grad_scale
        self.cancel = cancel
        self.rows: dict[RowKey, MergeStats] = {}
        self.calls: dict[str, int] = {}
        #: (module, what) whose output or output gradient could not be summarised, and why.
        self.unrecorded: dict[tuple[str, str], str] = {}
        self._scale: float | None = None
        self._installed = ExitStack()  # the open hooks_installed block, while installed
        self._hooks: Hooks | None = None

    def install(self) -> None:
        """Start a fresh recording: forward hooks on every selected module."""
        self.remove()
        self.rows = {}
        self.calls = {}
        self.unrecorded = {}
        self._scale = None
        hooks = self._hooks = self._installed.enter_context(hooks_installed())
        for name, module in self.modules.items():
            hooks.forward(module, lambda m, a, o, _n=name: self._on_forward(_n, o))

    def remove(self) -> None:
        """Take every hook off (forward and tensor hooks); the rows stay."""
        self._hooks = None
        self._installed.close()

    def __enter__(self) -> LayerRecorder:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def not_called(self) -> list[str]:
        """Selected modules that ran no call since ``install``."""
        return [n for n in self.modules if self.calls.get(n, 0) == 0]

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise CaptureCancelled()

    def _on_forward(self, name: str, output: Any) -> None:
        if recomputation.recomputing():
            return  # activation checkpointing re-running forward in backward: not a call
        self._check_cancel()
        call = self.calls.get(name, 0)
        self.calls[name] = call + 1
        _key, y = primary_tensor(output)
        if y is None:
            return
        values = self._local(name, y, "activation")
        if values is not None:
            with torch.no_grad():
                self.rows[(name, call, "activation")] = MergeStats.of_tensor(values)
        if y.requires_grad and self._hooks is not None:
            def on_grad(g: torch.Tensor, _n: str = name, _c: int = call) -> None:
                self._on_grad(_n, _c, g)

            self._hooks.gradient(y, on_grad)

    def _local(self, name: str, t: torch.Tensor, what: str) -> torch.Tensor | None:
        """``t``, or this rank's part of a DTensor; None for a pending reduction (noted)."""
        if not is_dtensor(t):
            return t
        placements = tuple(t.placements)  # type: ignore[attr-defined]
        if any(p.is_partial() for p in placements):
            self.unrecorded.setdefault((name, what), (
                f"its {what} is not recorded: a DTensor with a pending reduction ({', '.join(map(repr, placements))}), "
                "of which each rank holds a summand, not values with statistics of their own"))
            return None
        return t.to_local()  # type: ignore[attr-defined]

    def _on_grad(self, name: str, call: int, grad: torch.Tensor) -> None:
        self._check_cancel()
        local = self._local(name, grad, "output gradient")
        if local is None:
            return
        grad = local
        with torch.no_grad():
            if self.grad_scale is not None and self._scale is None:
                self._scale = float(self.grad_scale())
            g = grad
            if self._scale not in (None, 1.0):
                g = grad.float() / self._scale
            self.rows[(name, call, "grad_output")] = MergeStats.of_tensor(g)
            if self.grad_norms and g.dim() >= 1:
                self.rows[(name, call, "grad_norm")] = MergeStats.of_tensor(per_sample_norms(g))
        return None
