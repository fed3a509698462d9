"""Gradients on the model graph: one forward and backward that measures, for every tensor
the graph draws as an edge, the norm of the target's gradient with respect to it.

The graph extraction (``gradexplorer.model_graph.graph``) runs with gradients enabled, and each value a node
produces gets a *tensor* hook (module backward hooks break on in-place ops and dict
outputs; see docs/ARCHITECTURE.md). A hook registered before an in-place change receives the
gradient with respect to the value before the change, which is the value the edge
carries. Hooks keep a few numbers per tensor, never the tensor: memory is bounded by the
number of edges. Backward is ``torch.autograd.grad`` with respect to the parameters and
the input, so the user's ``.grad`` is untouched; hooks are installed by
``gradexplorer.hooks.hooks_installed``, which removes them in ``finally``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from gradexplorer.base.errors import CaptureError, GradExplorerError
from gradexplorer.capturing.inputs import ModelInputs
from gradexplorer.capturing.targets import Target, target_scalar
from gradexplorer.hooks.installed import hooks_installed
from gradexplorer.model_graph.graph import (
    GraphRecorder,
    ModelGraph,
    NodeStats,
    flag_by_neighbours,
    record_forward,
    tensors_in,
)


def _grad_summary(g: torch.Tensor) -> NodeStats:
    """L2 norm (float64), mean |g|, RMS, and whether it is all zero or has NaN/Inf."""
    with torch.no_grad():
        x = g.detach()
        if x.is_complex():
            x = x.abs()
        n = x.numel()
        l2 = float(torch.linalg.vector_norm(x, dtype=torch.float64)) if n else 0.0
        l1 = float(x.abs().sum(dtype=torch.float64)) if n else 0.0
        finite = math.isfinite(l2) and math.isfinite(l1)
        return {
            "grad_l2": l2,
            "grad_mean_abs": l1 / n if n else 0.0,
            "grad_rms": l2 / math.sqrt(n) if n else 0.0,
            "nonfinite": not finite,
            "zero": finite and l2 == 0.0,
        }


def _activation_summary(t: torch.Tensor) -> tuple[float | None, bool]:
    """Standard deviation (float64, over finite values) and whether NaN/Inf is present."""
    with torch.no_grad():
        if t.numel() < 2 or not (t.is_floating_point() or t.is_complex()):
            return None, False
        x = (t.detach().abs() if t.is_complex() else t.detach()).to(torch.float64).reshape(-1)
        finite = torch.isfinite(x)
        if bool(finite.all()):
            return float(x.std()), False
        x = x[finite]
        return (float(x.std()) if x.numel() > 1 else None), True


def graph_gradients(
    model: nn.Module,
    inputs: Any,
    *,
    target: Target | str = "top1",
    labels: torch.Tensor | None = None,
    train: bool = False,
    on_edge_grad: Callable[[int, torch.Tensor], None] | None = None,
) -> ModelGraph:
    """The model graph with gradient norms on every edge and statistics on every node.

    Parameters
    ----------
    model : nn.Module
        Left as it was: hooks removed, modes restored, BatchNorm statistics restored in
        train mode, ``.grad`` untouched.
    inputs : Tensor, tuple/list of tensors, or dict
        As for :func:`gradexplorer.model_graph.graph.extract_graph`. Floating-point inputs are given
        ``requires_grad`` (on a detached copy) so that their edges get a gradient too.
    target : str or Target
        The scalar to differentiate (``gradexplorer.capturing.targets.parse_target``).
    labels : Tensor, optional
        For ``cross_entropy``.
    train : bool
        Run in train mode.
    on_edge_grad : callable, optional
        ``on_edge_grad(value_id, grad)`` for each gradient as it arrives (tests compare
        against ``torch.autograd.grad``); the gradient must not be kept.

    Returns
    -------
    ModelGraph
        Edges have ``grad_l2`` (``None`` where no gradient reached the tensor); nodes have
        ``stats`` with ``grad_l2``, ``grad_mean_abs``, ``grad_rms``, ``activation_std``,
        ``nonfinite``, ``zero`` and ``flags`` for the value they produced (vanishing and
        exploding by :func:`~gradexplorer.model_graph.graph.flag_by_neighbours`, on module and op nodes alike).

    Raises
    ------
    GradExplorerError
        A bad target; ``CaptureError`` when forward or backward fails.
    """
    grads: dict[int, NodeStats] = {}
    act_stats: dict[int, tuple[float | None, bool]] = {}

    # The hooks record only in this function's own backward, not in one that the model's
    # forward runs itself (a force field's forces: gradexplorer.capturing.capture's docstring).
    own_backward = [False]
    # Leaf tensors made inside forward (a force field's positions): their hooks fire only
    # if the backward is asked for their gradient.
    made_leaves: list[torch.Tensor] = []

    def on_value(vid: int, t: torch.Tensor, node_id: str) -> None:
        act_stats[vid] = _activation_summary(t)
        if not t.requires_grad:
            return
        if t.grad_fn is None:
            made_leaves.append(t)

        def hook(g: torch.Tensor | None, vid: int = vid) -> None:
            if g is None or not own_backward[0]:  # None: an output the target does not use
                return
            if on_edge_grad is not None:
                on_edge_grad(vid, g)
            if vid not in grads:
                grads[vid] = _grad_summary(g)

        hooks.tensor(t, hook)

    def prepared(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach().requires_grad_(True) if x.is_floating_point() else x
        if isinstance(x, ModelInputs):
            return ModelInputs(prepared(x.args), prepared(x.kwargs))
        if isinstance(x, Mapping):
            return {k: prepared(v) for k, v in x.items()}
        if isinstance(x, (tuple, list)):
            return type(x)(prepared(v) for v in x) if not hasattr(x, "_fields") else type(x)(*map(prepared, x))
        return x

    recorder = GraphRecorder(on_value=on_value)
    with hooks_installed(model, train=train) as hooks:
        xs = prepared(inputs)
        with torch.enable_grad():
            output = record_forward(model, xs, recorder)
            scalar = target_scalar(output, target, labels)
        if not scalar.requires_grad:
            raise CaptureError("The target does not depend on anything that requires a gradient.",
                               "Check that the model has trainable parameters.")
        leaves: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        leaves += [t for t in tensors_in(xs, []) if t.requires_grad]
        asked = {id(t) for t in leaves}
        leaves += [t for t in made_leaves if id(t) not in asked]
        own_backward[0] = True
        try:
            torch.autograd.grad(scalar, leaves, allow_unused=True)
        except GradExplorerError:
            raise
        except Exception as exc:
            raise CaptureError(f"Backward failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                               "This model may use operations without gradients.") from exc
    graph = recorder.graph({"model": type(model).__name__, "target": str(target)})
    for e in graph.edges:
        s = grads.get(e.tensor)
        e.grad_l2 = s["grad_l2"] if s else None
    for nid, vid in graph.meta["node_values"].items():
        s = grads.get(vid)
        stats: NodeStats = s.copy() if s else {"grad_l2": None, "grad_mean_abs": None, "grad_rms": None,
                                                "nonfinite": False, "zero": False}
        stats["activation_std"], act_bad = act_stats.get(vid, (None, False))
        stats["nonfinite"] = bool(stats["nonfinite"] or act_bad)
        stats["flags"] = ((["no gradient"] if not s else [])
                          + (["nan/inf"] if stats["nonfinite"] else [])
                          + (["zero"] if stats["zero"] else []))
        graph.nodes[nid].stats = stats
    flag_by_neighbours(graph)
    return graph
