"""``python -m gradexplorer``: the same as the ``gradexplorer`` command."""

import sys

from gradexplorer_app.cli.main import main

sys.exit(main())
