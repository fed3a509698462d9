"""gradexplorer: see the gradients inside a PyTorch model.

The public API, for notebooks and scripts::

    import gradexplorer as gx

    cap = gx.capture(model, x, layers="layer4.*")       # one forward and backward, hooked
    cap["layer4.1.conv2"].calls[0].grad_output          # the gradient at that layer's output
    gx.save_capture(cap, "r18.pt"); gx.load_capture("r18.pt")

    with gx.watch(model, "run.gxw", every=10) as w:      # inside your training loop
        ...; w.step(loss=loss)
    gx.read_timeline("run.gxw")                          # layers × steps, as arrays

Names
-----
capture, Capture
    Record activations, gradients and their statistics at the selected modules
    (``gradexplorer.capturing``).
save_capture, load_capture
    The ``.pt`` capture file (``gradexplorer.files``).
capture_dataset
    Statistics over many batches, merged exactly (``gradexplorer.recording.dataset_capture``).
watch, read_timeline
    Watch a training loop into a ``.gxw`` log, and read it back over steps
    (``gradexplorer.recording``).
compare
    Where two captures diverge, layer by layer and call by call (``gradexplorer.comparison``).
graph
    The model's data-flow graph from one probe forward (``gradexplorer.model_graph``).
load_model
    A torchvision name, demo, checkpoint or factory, loaded for inspection
    (``gradexplorer.models``).
GradExplorerError
    Every failure the user can cause: ``problem`` and ``fix`` say what happened and what
    to do.
explore
    The window on a live model and its batch (or on a capture), in the same process
    (``gradexplorer_app.explore``).

Importing ``gradexplorer`` loads none of these: each is imported on first use, so the
package imports without Qt and without compiling the statistics kernels.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

from gradexplorer.base.lazy import attach

try:
    __version__ = metadata.version("gradexplorer")
except metadata.PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"

#: Each public name and the module that defines it (with the name it has there).
_EXPORTS = {
    "capture": "gradexplorer.capturing.capture",
    "Capture": "gradexplorer.capturing.data",
    "save_capture": "gradexplorer.files.capture_file",
    "load_capture": "gradexplorer.files.capture_file",
    "capture_dataset": "gradexplorer.recording.dataset_capture",
    "watch": "gradexplorer.recording.watch",
    "read_timeline": "gradexplorer.recording.timeline",
    "compare": "gradexplorer.comparison.compare",
    "graph": "gradexplorer.model_graph.graph:extract_graph",
    "load_model": "gradexplorer.models",
    "GradExplorerError": "gradexplorer.base.errors",
    "explore": "gradexplorer_app.explore",
}

__all__ = [
    "capture", "Capture", "save_capture", "load_capture", "capture_dataset", "watch", "read_timeline",
    "compare", "graph", "load_model", "GradExplorerError", "explore", "__version__",
]

if TYPE_CHECKING:
    from gradexplorer.base.errors import GradExplorerError
    from gradexplorer.capturing.capture import capture
    from gradexplorer.capturing.data import Capture
    from gradexplorer.comparison.compare import compare
    from gradexplorer.files.capture_file import load_capture, save_capture
    from gradexplorer.model_graph.graph import extract_graph as graph
    from gradexplorer.models import load_model
    from gradexplorer.recording.dataset_capture import capture_dataset
    from gradexplorer.recording.timeline import read_timeline
    from gradexplorer.recording.watch import watch
    from gradexplorer_app.explore import explore

__getattr__, __dir__ = attach(__name__, _EXPORTS)
