"""The memory one forward pass holds at its peak, told from shapes before anything runs.

The probe forward (``ModuleTree.probe``) runs the model on one real sample, before any
estimate of the capture's memory can be made: a sample that is large enough (a picture of
12,000 × 12,000 pixels, a million tokens) takes gigabytes there, whatever the memory budget.
:func:`forward_peak` runs the same forward first on fake tensors (PyTorch's
``FakeTensorMode``: every operation computes its output's shape and dtype, and allocates
nothing), and follows each storage an operation creates until it is freed: the largest sum
of storages alive at one time is the forward's peak, beyond the model's own parameters and
buffers, which are already in memory.

A forward that cannot run on fake tensors (a value read back into Python with ``.item()``,
shapes that depend on the data, an operation without a shape rule, a model that leaves
them somewhere) gives ``None``: the caller then falls back on a rule of thumb. The model is
left as it was: its modes, its parameters, buffers and every attribute the forward set.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gradexplorer.capturing.inputs import ModelInputs, call_model
from gradexplorer.hooks.installed import hooks_installed

__all__ = ["ForwardMemory", "forward_peak"]


@dataclass(frozen=True)
class ForwardMemory:
    """What one forward holds (:func:`forward_peak`).

    Attributes
    ----------
    peak : int
        Bytes alive at the peak: the inputs and every tensor the forward made, not the
        model's parameters and buffers.
    operations : int
        Operations the forward ran.
    """

    peak: int
    operations: int


def _storage_key(t: torch.Tensor) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(t.untyped_storage())


class _ModuleState:
    """Every module's attributes, parameters and buffers as they are, to put back: a forward
    that caches a tensor on its module (rotary tables, masks) would otherwise leave a fake
    one there."""

    def __init__(self, model: nn.Module) -> None:
        self.saved = [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers)) for m in model.modules()]

    def restore(self) -> None:
        for module, attrs, params, buffers in self.saved:
            for key in [k for k in module.__dict__ if k not in attrs]:
                del module.__dict__[key]
            for key, value in attrs.items():
                if module.__dict__.get(key, _MISSING) is not value:
                    module.__dict__[key] = value
            _put_back(module._parameters, params)
            _put_back(module._buffers, buffers)


def _put_back(table: dict[str, Any], before: dict[str, Any]) -> None:
    if table.keys() != before.keys() or any(table[k] is not v for k, v in before.items()):
        table.clear()
        table.update(before)


_MISSING = object()


def forward_peak(model: nn.Module, inputs: torch.Tensor | ModelInputs) -> ForwardMemory | None:
    """The peak memory of ``model``'s forward on ``inputs`` (eval mode, no gradients), told
    on fake tensors: nothing of the inputs' size is allocated.

    Parameters
    ----------
    model : nn.Module
        Its parameters and buffers are read for their shapes only.
    inputs : Tensor or ModelInputs
        Real tensors (only their shapes, dtypes and devices are used).

    Returns
    -------
    ForwardMemory or None
        None when the forward cannot run on fake tensors (see the module docstring).
    """
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves
    except ImportError:  # a torch without fake tensors
        return None

    class _Peak(TorchDispatchMode):
        """Each storage an operation returns, counted while it lives."""

        def __init__(self, resident: set) -> None:
            super().__init__()
            self.resident = resident
            self.live: dict[Any, tuple[Any, int]] = {}
            self.now = self.peak = self.operations = 0
            self.failed = False

        def see(self, value: Any) -> None:
            for t in tree_leaves(value):
                if not isinstance(t, torch.Tensor):
                    continue
                ref = _storage_key(t)
                if ref.cdata in self.resident or ref.cdata in self.live:
                    continue
                size = int(t.untyped_storage().nbytes())
                self.live[ref.cdata] = (ref, size)
                self.now += size
            self.peak = max(self.peak, self.now)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            # Some calls come from C++ (a device query returns a torch.device): an exception
            # raised here would end the process, so the counting never raises.
            try:
                self.operations += 1
                for key in [k for k, (ref, _n) in self.live.items() if ref.expired()]:
                    self.now -= self.live.pop(key)[1]
                self.see(out)
            except Exception:  # noqa: BLE001 - see above: the count is then unknown
                self.failed = True
            return out

    state = _ModuleState(model)
    try:
        with warnings.catch_warnings(), hooks_installed(model, train=False), torch.no_grad():
            warnings.simplefilter("ignore")
            fake = FakeTensorMode(allow_non_fake_inputs=True)
            # The parameters and buffers as the fake mode will see them: resident already. The
            # fakes are held for the forward (the mode's memo of them is weak: freed, they
            # would be made anew, with other storages).
            held = [fake.from_tensor(t) for t in (*model.parameters(), *model.buffers())]
            resident = {_storage_key(t).cdata for t in held}
            x = (inputs.map(fake.from_tensor) if isinstance(inputs, ModelInputs)
                 else fake.from_tensor(inputs))
            with fake:
                peak = _Peak(resident)
                peak.see(x.args + tuple(x.kwargs.values()) if isinstance(x, ModelInputs) else x)
                with peak:
                    out = call_model(model, x)
                del out
        return None if peak.failed else ForwardMemory(peak.peak, peak.operations)
    except Exception:  # noqa: BLE001 - any failure on fake tensors means "cannot tell": the caller falls back
        return None
    finally:
        state.restore()
