"""Where the benchmarks' files are, and how a benchmark process is started: every other module asks here, so a
module can move between folders without its paths changing."""

from __future__ import annotations

import pathlib
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent  # the repository: what every job's PYTHONPATH starts with
RESULTS = BENCHMARKS / "results"  # committed result CSVs and summaries
SHAPES_DIR = BENCHMARKS / "workloads" / "shapes"  # per-model parameter shapes and layer profiles (make_shapes.py)


def python_module(module: str) -> list[str]:
    """The argv prefix that runs `module` (e.g. "benchmarks.workloads.cluster_worker") with this interpreter; the
    process needs ROOT on its PYTHONPATH or as its working directory (workloads/job_env.py sets both)."""
    return [sys.executable, "-m", module]
