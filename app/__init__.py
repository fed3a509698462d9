"""The two front ends over the engine: the command line (``cli``) and the desktop window
(``window``, ``views``).

Modules
-------
cli
    The ``gradexplorer`` command; imports no Qt.
window
    The desktop window: panels, dialogs, workers.
views
    The views of a capture, drawn with pyqtgraph.
explore
    ``gradexplorer.explore``, the window on a live model.
"""

__all__ = ["cli", "window", "views", "explore"]
