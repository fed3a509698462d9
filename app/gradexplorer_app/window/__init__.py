"""The desktop window: the main window and its panels, the compare and timeline windows, the
error dialog and the settings. It asks its questions through ``gradexplorer_app.dialogs``
and runs long work through ``gradexplorer_app.run_worker``.

Modules
-------
launch
    Starting the app: ``launch()``, what ``gradexplorer`` without a subcommand calls.
application
    The QApplication with gradexplorer's look, for every window.
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
error_dialog
    A failure shown to the user.
settings
    The one place QSettings is read and written.
signal_wait
    Blocking until a Qt signal fires (scripts, benchmarks).
"""

__all__ = [
    "launch", "application", "main_window", "controller", "model_panel", "batch_panel", "run_panel",
    "module_tree_view", "compare_window", "dataset_run", "timeline_window", "onset_link", "error_dialog",
    "settings", "signal_wait",
]
