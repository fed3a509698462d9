"""What a node of the model graph can be coloured by, in words.

Torch-free on purpose: the command line offers these as ``gradexplorer graph --color-by``
choices when it builds its parser, before any command runs, and ``gradexplorer --help``
should not import the engine to print them.
"""

from __future__ import annotations

#: Statistics of a comparison that colour the graph, with their labels.
DIVERGENCE_BY = {
    "div_grad": "gradient rel. L2 difference B vs A",
    "div_activation": "activation rel. L2 difference B vs A",
    "grad_ratio": "gradient norm ratio B / A",
}
#: Of those, the ratios: drawn on a diverging scale around 1.
RATIOS = frozenset({"grad_ratio"})
#: Statistics a node can be coloured by, with their labels.
COLOR_BY = {
    "grad_l2": "gradient L2 norm",
    "grad_mean_abs": "mean |gradient|",
    "grad_rms": "gradient RMS",
    "activation_std": "activation std",
    "flags": "flags",
}
#: Every statistic a node can be coloured by: its own, and a comparison's.
STATISTIC_LABELS = {**COLOR_BY, **DIVERGENCE_BY}
