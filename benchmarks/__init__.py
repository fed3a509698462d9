"""Benchmarks: each prints figures (speed targets live here, never in timed tests).

Importing the package applies the program's process settings (``app``: torch's 2 MiB
pages on Linux) before torch is imported, so that what is measured, the bare pass
included, is what the ``gradexplorer`` command runs.
"""

import app  # noqa: F401
