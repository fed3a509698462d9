"""The model graph: the network's data flow from one probe forward, its gradients, layout and
pictures.

Modules
-------
graph
    Extraction: nodes, edges, containers, from one forward.
grads
    The gradient norm of every edge, from one forward and backward.
layout
    Layered layout of a graph view.
render
    Colours, widths, and the pictures written without Qt (DOT, SVG).
compare
    The graph coloured by how two captures differ.
"""

__all__ = ["graph", "grads", "layout", "render", "compare"]
