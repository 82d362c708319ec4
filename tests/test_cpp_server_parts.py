"""Builds and runs the C++ unit tests of the server's pure parts (cpp/tests/aggregator_tests.cc): the
aggregation state machine, admission against the memory bound, the buffer pool and SliceOptimizer's per-key
step cache."""

import os
import subprocess

from conftest import ROOT
from test_cpp_unit import FLAGS, compiler  # noqa: F401  (pytest fixture)

CPP = os.path.join(ROOT, "cpp")
UNITS = ("aggregator.cc", "admission.cc", "buffer_pool.cc", "slice_optimizer.cc", "optimizer.cc", "dtype.cc",
         "frame_builder.cc", "codec.cc")


def test_server_parts_unit_tests_pass(tmp_path, compiler):  # noqa: F811
    binary = str(tmp_path / "aggregator_tests")
    sources = [os.path.join(CPP, "src", f) for f in UNITS]
    subprocess.run([compiler, *FLAGS, *sources, os.path.join(CPP, "tests", "aggregator_tests.cc"), "-o", binary],
                   check=True, timeout=300)
    result = subprocess.run([binary], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert result.returncode == 0, result.stdout
    assert "20 passed, 0 failed" in result.stdout, result.stdout
