"""``python -m app``: the same as the ``gradexplorer`` command."""

import sys

from app.cli import main

sys.exit(main())
