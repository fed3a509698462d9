"""Data shipped with gradexplorer: the demos' weights and sample pictures.

Installed from a wheel, this folder is the package ``core.resources`` (see setup.py);
``core.demos`` finds it with ``importlib.resources``, and falls back to this folder of a
checkout when gradexplorer runs from the source tree without being installed.
"""
