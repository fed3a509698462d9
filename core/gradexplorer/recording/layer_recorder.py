"""Hooks that record mergeable statistics of selected modules for one forward and backward.

Shared by the watch (``gradexplorer.recording.watch``, one training step) and the dataset capture
(``gradexplorer.recording.dataset_capture``, one batch). Per selected module and per call it records the
activation, the gradient with respect to it and the per-sample norms of that gradient, as
``gradexplorer.stats.merge.MergeStats`` keyed ``(module name, call index, kind)``.

Why it is built this way (docs/ARCHITECTURE.md, "Facts the code relies on"): a forward
hook summarises the output at once (a later in-place op would change it) and registers a
*tensor* hook on it (module backward hooks break on in-place ReLUs and dict outputs); the
hooks return nothing, so the values and gradients flowing through are not changed. The
hooks are those of one ``gradexplorer.hooks.hooks_installed`` block, opened by
``install()`` and closed by ``remove()``, which takes every handle off. One forward hook
serves every selected module, as the capture's do (``Hooks.call_hooks``): it looks the
module's name up by ``id(module)``, with no closure nor handle per module to make at every
watched step.

Small float32 CPU tensors (``gradexplorer.stats.merge.TOGETHER_VALUES``) are not summarised in their hook:
an activation is copied, a gradient (which autograd does not change while it is held)
kept, and they are summarised together (``MergeStats.of_tensors``: one compiled call)
when the hooks come off, or whenever ``SMALL_BATCH_BYTES`` of them are held. Alone, such a
tensor costs microseconds of calls around nanoseconds of arithmetic; the numbers are the
same either way.

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
from gradexplorer.stats.merge import TOGETHER_VALUES, MergeStats, per_sample_norms, per_sample_norms_many

#: Row key: (layer or parameter name, call index, kind).
RowKey = tuple[str, int, str]

#: Bytes of small tensors held before they are summarised: what bounds the memory they take.
SMALL_BATCH_BYTES = 16 << 20


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
    when : callable, optional
        Gradients are recorded only in the backwards during which ``when()`` is true (the
        recorder's own, not one that the model's forward runs itself:
        ``gradexplorer.hooks.installed.Hooks.gradient``); ``None``: in every backward.
    """

    def __init__(self, model: nn.Module, layers: Iterable[str], *, grad_norms: bool = True,
                 grad_scale: Callable[[], float] | None = None, cancel: Any = None,
                 when: Callable[[], bool] | None = None) -> None:
        modules = dict(model.named_modules())
        self.modules = {name: modules[name] for name in layers}
        # What the shared forward hook looks a call's module up in (ids of living modules).
        self._name_by_id = {id(m): name for name, m in self.modules.items()}
        self.grad_norms = grad_norms
        self.grad_scale = grad_scale
        self.cancel = cancel
        self.when = when
        self.rows: dict[RowKey, MergeStats] = {}
        self.calls: dict[str, int] = {}
        #: (module, what) whose output or output gradient could not be summarised, and why.
        self.unrecorded: dict[tuple[str, str], str] = {}
        self._scale: float | None = None
        self._installed = ExitStack()  # the open hooks_installed block, while installed
        self._hooks: Hooks | None = None
        # Small tensors to summarise together: (row key, tensor, whether it stands for its
        # per-sample norms), and their bytes.
        self._held: list[tuple[RowKey, torch.Tensor, bool]] = []
        self._held_bytes = 0

    def install(self) -> None:
        """Start a fresh recording: forward hooks on every selected module."""
        self.remove()
        self.rows = {}
        self.calls = {}
        self._held, self._held_bytes = [], 0
        self.unrecorded = {}
        self._scale = None
        hooks = self._hooks = self._installed.enter_context(hooks_installed())
        name_by_id, on_forward = self._name_by_id, self._on_forward

        # A function, not a bound method: ``copy.deepcopy`` of the model during a step (an
        # EMA or teacher copy) copies the hook dictionaries, and a function is copied as
        # itself where a bound method would deep-copy this recorder. The copy's modules are
        # not the selected ones: its calls are not recorded.
        def forward_hook(module: nn.Module, args: tuple, output: Any) -> None:
            name = name_by_id.get(id(module))
            if name is not None:
                on_forward(name, output)

        hooks.call_hooks(self.modules.values(), forward_hook)

    def remove(self) -> None:
        """Take every hook off (forward and tensor hooks) and summarise what is held; the
        rows stay."""
        self._hooks = None
        self._installed.close()
        self.flush()

    def flush(self) -> None:
        """Summarise the small tensors held so far, together, into ``rows``."""
        if not self._held:
            return
        held, self._held, self._held_bytes = self._held, [], 0
        with torch.no_grad():
            values = [t for _key, t, _norms in held]
            at = [i for i, (_key, _t, norms) in enumerate(held) if norms]
            for i, n in zip(at, per_sample_norms_many([values[i] for i in at])):
                values[i] = n
            for (key, _t, _norms), stats in zip(held, MergeStats.of_tensors(values)):
                self.rows[key] = stats

    def _summarise(self, key: RowKey, t: torch.Tensor, copy: bool, norms: bool = False) -> None:
        """``rows[key]`` of ``t`` (of its per-sample norms, with ``norms``): at once, or for
        a small float32 CPU tensor when the hooks come off (copied now with ``copy``)."""
        n = t.numel()
        if t.dtype == torch.float32 and t.is_cpu and 0 < n <= TOGETHER_VALUES:
            if copy:
                t = t.detach().clone()
            self._held.append((key, t, norms))
            self._held_bytes += n * 4
            if self._held_bytes >= SMALL_BATCH_BYTES:
                self.flush()
            return
        with torch.no_grad():
            self.rows[key] = MergeStats.of_tensor(per_sample_norms(t) if norms else t)

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
            # A copy of a small one: a later in-place op (ReLU(inplace), +=) would change it.
            self._summarise((name, call, "activation"), values, copy=True)
        if y.requires_grad and self._hooks is not None:
            def on_grad(g: torch.Tensor | None, _n: str = name, _c: int = call) -> None:
                if g is not None:  # None: autograd gave none (an output the target does not use)
                    self._on_grad(_n, _c, g)

            self._hooks.gradient(y, on_grad, when=self.when)

    def _local(self, name: str, t: torch.Tensor, what: str) -> torch.Tensor | None:
        """``t``, or this rank's part of a DTensor; None for a pending reduction (noted)."""
        if not is_dtensor(t):
            return t
        placements = tuple(t.placements)
        if any(p.is_partial() for p in placements):
            self.unrecorded.setdefault((name, what), (
                f"its {what} is not recorded: a DTensor with a pending reduction ({', '.join(map(repr, placements))}), "
                "of which each rank holds a summand, not values with statistics of their own"))
            return None
        return t.to_local()

    def _on_grad(self, name: str, call: int, grad: torch.Tensor) -> None:
        self._check_cancel()
        local = self._local(name, grad, "output gradient")
        if local is None:
            return
        g = local
        if self.grad_scale is not None:  # (no grad-mode switch per gradient without a scaler)
            with torch.no_grad():
                if self._scale is None:
                    self._scale = float(self.grad_scale())
                if self._scale != 1.0:
                    g = local.float() / self._scale
        # Autograd does not change a gradient it handed to a hook while it is held: no copy.
        self._summarise((name, call, "grad_output"), g, copy=False)
        if self.grad_norms and g.dim() >= 1:
            self._summarise((name, call, "grad_norm"), g, copy=False, norms=True)
        return None
