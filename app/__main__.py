"""``python -m app``: the same as the ``gradexplorer`` command."""

from app.cli import run

run()
