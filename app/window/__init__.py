"""The desktop window: the main window and its panels, dialogs, the workers that keep long work
off the UI thread, and the settings.

Modules
-------
launch
    Starting the app: ``launch()``, what ``gradexplorer`` without a subcommand calls.
main_window
    The main window: layout, menus, shortcuts, status bar.
controller
    The window's decisions: what to load, when to run, which view to open.
model_panel
    Choosing a model.
batch_panel
    The input batch.
run_panel
    Run settings and the Run button.
module_tree_view
    The checkable, filterable module tree.
compare_window
    Compare with…, or two capture files side by side.
dataset_run
    Run ▸ Run over folder….
timeline_window
    The timeline view in a window of its own.
onset_link
    Where NaN/Inf began, as a status-bar link.
run_worker
    Long work off the GUI thread.
dialogs
    File pickers and questions, in one replaceable place.
error_dialog
    A failure shown to the user.
settings
    The one place QSettings is read and written.
signal_wait
    Blocking until a Qt signal fires (scripts, benchmarks).
"""

__all__ = [
    "launch", "main_window", "controller", "model_panel", "batch_panel", "run_panel", "module_tree_view",
    "compare_window", "dataset_run", "timeline_window", "onset_link", "run_worker", "dialogs", "error_dialog",
    "settings", "signal_wait",
]
