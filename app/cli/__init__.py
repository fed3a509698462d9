"""The ``gradexplorer`` command: headless subcommands, or the desktop app. Imports no Qt (an
import-linter contract).

Modules
-------
main
    The parser, the capture, models, layers, inspect and devices commands, and the entry
    point.
dataset
    ``capture --batch-size N``: statistics over a whole dataset.
diff
    ``diff A.pt B.pt``: where two captures diverge, and a regression check.
graph
    ``graph``: the data-flow graph as JSON, DOT, SVG or PNG.
watch
    ``inspect RUN.gxw``: a watch log summarised.
format
    Text output: tables, sizes, numbers, the progress bar.
"""

__all__ = ["main", "dataset", "diff", "graph", "watch", "format"]
