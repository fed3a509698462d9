"""The model graph coloured by how two captures differ (``gradexplorer.comparison.compare``'s per-call figures).

``attach_comparison`` puts, on the module node of each matched layer and call, the numbers
``gradexplorer.comparison.compare.compare`` computed for it: the relative L2 difference of the output gradient
and of the activation (``KindDiff.divergence``: by tensors in full captures, its statistics
lower bound otherwise) and the ratio of the gradient norms B / A. ``gradexplorer.model_graph.render``
colours them like any node statistic: the differences on a log scale where exactly 0
(identical) is the low end, the ratio on a diverging scale symmetric around 1.
"""

from __future__ import annotations

import math
from typing import Any

from gradexplorer.model_graph.graph import ModelGraph, NodeStats


def _norm_ratio(kind_diff: Any) -> float | None:
    if kind_diff is None or kind_diff.note:
        return None
    if kind_diff.tensor is not None:
        return float(kind_diff.tensor.norm_ratio)
    return float(kind_diff.stats.norm_ratio) if kind_diff.stats is not None else None


def _divergence(kind_diff: Any) -> float | None:
    if kind_diff is None:
        return None
    v = float(kind_diff.divergence)
    return None if math.isnan(v) else v


def divergence_values(call_diff: Any) -> NodeStats:
    """The graph's divergence statistics of one ``gradexplorer.comparison.compare.CallDiff``.

    Returns
    -------
    NodeStats
        ``div_grad``, ``div_activation`` (relative L2 differences, ``inf`` when not
        comparable, None when neither capture has that tensor) and ``grad_ratio``
        (``||g_B|| / ||g_A||``, None when not comparable).
    """
    if call_diff.note:
        return {"div_grad": math.inf, "div_activation": math.inf, "grad_ratio": None}
    grad = call_diff.kinds.get("grad_output")
    return {
        "div_grad": _divergence(grad),
        "div_activation": _divergence(call_diff.kinds.get("activation")),
        "grad_ratio": _norm_ratio(grad),
    }


def attach_comparison(graph: ModelGraph, result: Any, side: str = "a") -> int:
    """Put a comparison's per-call divergences on the module nodes of the same layer and call.

    Parameters
    ----------
    graph : ModelGraph
        A's graph, or B's with ``side="b"`` (layers are then matched by B's names, which a
        renaming may make differ). Other statistics on its nodes stay.
    result : gradexplorer.comparison.compare.Comparison
    side : {"a", "b"}

    Returns
    -------
    int
        How many nodes got divergences.
    """
    n = 0
    for call_diff in result.calls:
        node = graph.module_node(call_diff.layer if side == "a" else call_diff.layer_b, call_diff.call)
        if node is None:
            continue
        node.stats = {**(node.stats or {}), **divergence_values(call_diff)}
        n += 1
    return n
