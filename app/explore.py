"""``gradexplorer.explore``: the window on a model that lives in the user's notebook.

Not available yet: the window opens models by name, file or factory
(``gradexplorer --model ...``). This module holds the public name so that notebooks get
a clear message instead of an ``AttributeError``.
"""

from __future__ import annotations

from typing import Any

from gradexplorer.base.errors import GradExplorerError


def explore(model: Any = None, inputs: Any = None, **options: Any) -> None:
    """Open the window on ``model`` and ``inputs``.

    Raises
    ------
    GradExplorerError
        Always, in this version: the window cannot yet take a live model.
    """
    raise GradExplorerError(
        "gradexplorer.explore (the window on a live model) is not available in this version.",
        "Capture in the notebook with gradexplorer.capture(model, x), save it with "
        "gradexplorer.save_capture(cap, 'cap.pt') and open the file with `gradexplorer cap.pt`; "
        "or open the model in the window from a factory: `gradexplorer --model mymodule:build --trust`.",
    )
