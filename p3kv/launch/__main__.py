"""``python -m p3kv.launch``: see p3kv.launch.cli."""

import sys

from p3kv.launch.cli import main

sys.exit(main())
