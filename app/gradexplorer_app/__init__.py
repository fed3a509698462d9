"""The two front ends over the engine: the command line (``cli``) and the desktop window
(``window``, ``views``).

Modules
-------
cli
    The ``gradexplorer`` command; imports no Qt.
window
    The desktop window: panels, the compare and timeline windows, settings.
views
    The views of a capture, drawn with pyqtgraph; they never import the window.
dialogs
    File pickers and questions, in one replaceable place (the window's and the views').
run_worker
    Long work off the GUI thread (the window's and the views').
explore
    ``gradexplorer.explore``, the window on a live model in the caller's process.
"""

__all__ = ["cli", "window", "views", "dialogs", "run_worker", "explore"]
