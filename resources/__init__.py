"""Data shipped with gradexplorer: the demos' weights and sample pictures.

This folder is the package ``gradexplorer.resources`` (setup.py maps it, in a wheel and in
an editable install); ``gradexplorer.models.demos`` finds it with ``importlib.resources``.
"""
