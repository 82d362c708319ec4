"""`python -m benchmarks.report [--check]`: rewrite (or check) the generated benchmark blocks."""

import sys

from benchmarks.report.readme import main

sys.exit(main())
