"""The ``gradexplorer`` command: headless subcommands, or the desktop app. Imports no Qt (an
import-linter contract), except inside the two commands that open a window.

One module per command; each registers its parser (``register(sub)``) and runs it
(``cmd_<name>(args, ui)``). ``main`` imports the commands, the commands import ``common``,
and nothing imports ``main``. The engine is imported inside each command's
function, so that a command pays at start only for what it runs.

Modules
-------
main
    The entry point :func:`main.main`: the parser assembled from the commands, the
    dispatch, the exit codes of errors.
common
    What the commands share: exit codes, ``UsageError``, ``UI``, the common arguments,
    ``capture_options`` (also for the window's flags).
capture, capture_over_dataset
    ``capture``: one forward and backward to a .pt file; ``capture --batch-size N``:
    statistics over a whole dataset.
models, layers, devices
    ``models``: torchvision's models and cached weights; ``layers``: a model's module tree;
    ``devices``: where a capture can run.
inspect, inspect_log
    ``inspect``: a capture file; a watch log (.gxw) summarised.
diff
    ``diff A.pt B.pt``: where two captures diverge, and a regression check.
graph
    ``graph``: the data-flow graph as JSON, DOT, SVG or PNG.
timeline, gui
    ``timeline``: a log over steps in a window; no subcommand: the desktop app.
format
    Text output: tables, sizes, numbers, the progress bar.
"""

__all__ = ["main", "common", "capture", "capture_over_dataset", "models", "layers", "devices", "inspect", "inspect_log",
           "diff", "graph", "timeline", "gui", "format"]
