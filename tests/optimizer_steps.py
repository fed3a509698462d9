"""What every optimizer step of a training stepped with, read independently of gradexplorer.

Global optimizer hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook`` and
``..._post_hook``) see every ``optimizer.step()`` in the process, whoever calls it. The
pre-hook runs before ``step()`` does anything: where a trainer passes a closure (Lightning
without a GradScaler), the closure's backward and clipping run *after* it, inside the step,
so ``.grad`` at the pre-hook is not yet what the step uses. The post-hook runs after the
update, when ``.grad`` is what the update used (plain SGD reads ``.grad`` without writing
it). Two truths per step and parameter, then:

* ``grad``: the L2 norm of ``.grad`` at the post-hook, in float64;
* ``update``: ``||w_before - w_after|| / lr`` for SGD without momentum or weight decay: the
  gradient the update was made of, whatever hook order the trainer has.

Parameters sharded with FSDP2 are gathered whole (``DTensor.full_tensor``) on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook


def _whole(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (a DTensor: gathered from every rank, which all
    step their optimizers together), else the tensor."""
    full = getattr(t, "full_tensor", None)
    return full() if full is not None else t


@dataclass
class OptimizerSteps:
    """Use as ``with OptimizerSteps(model) as steps: trainer.fit(...)``; then
    ``steps.grad[i][name]`` and ``steps.update[i][name]`` for the i-th optimizer step
    (``name`` as in ``model.named_parameters()``, looked up at each step: a strategy may
    replace the parameters, as FSDP2 does)."""

    model: torch.nn.Module
    grad: list[dict[str, float]] = field(default_factory=list)
    update: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._names: dict[int, str] = {}
        self._before: dict[str, torch.Tensor] = {}
        self._handles: list = []

    def _pre(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not isinstance(optimizer, torch.optim.SGD):
            return  # a wrapper (accelerate's AcceleratedOptimizer) around the SGD that steps
        self._names = {id(p): n for n, p in self.model.named_parameters()}
        self._before = {self._names[id(p)]: _whole(p.detach()).double().clone()
                        for group in optimizer.param_groups for p in group["params"] if id(p) in self._names}

    def _post(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not isinstance(optimizer, torch.optim.SGD):
            return
        grads, updates = {}, {}
        for group in optimizer.param_groups:
            assert group["momentum"] == 0 and group["weight_decay"] == 0, "plain SGD: the update is -lr * grad"
            for p in group["params"]:
                name = self._names.get(id(p))
                if name is None or p.grad is None:
                    continue
                grads[name] = float(torch.linalg.vector_norm(_whole(p.grad).double()))
                after = _whole(p.detach()).double()
                updates[name] = float(torch.linalg.vector_norm(self._before[name] - after)) / group["lr"]
        self.grad.append(grads)
        self.update.append(updates)

    def __enter__(self) -> OptimizerSteps:
        self._handles = [register_optimizer_step_pre_hook(self._pre), register_optimizer_step_post_hook(self._post)]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
