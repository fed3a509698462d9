"""Comparing two captures: where two runs diverge, layer by layer and call by call.

Modules
-------
compare
    ``compare()``, the divergence figures, CSV, heatmap triples, flow comparison.
"""

__all__ = ["compare"]
