"""Hooks on the user's model, installed in one place.

Every forward pre-hook, forward hook, tensor hook and post-accumulate hook the engine puts
on a model goes through :func:`~gradexplorer.hooks.installed.hooks_installed`: it keeps
the handles and removes every one of them in ``finally`` (also when forward or backward
raises, also on ``KeyboardInterrupt``), and puts the model back as it found it (the
``training`` flag of every module, the buffers a train-mode forward updates, the device).
Capture, the probe, the graph and its gradients, the layer recorder of the watch and the
dataset capture, and the job's output probe all install their hooks this way.
"""

from gradexplorer.hooks.installed import Hooks, hooks_installed, model_device, model_state_preserved

__all__ = ["Hooks", "hooks_installed", "model_device", "model_state_preserved"]
