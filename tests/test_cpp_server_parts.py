"""Runs the C++ unit tests of the server's pure parts (cpp/tests/aggregator_tests.cc): the
aggregation state machine, admission against the memory bound, the buffer pool and SliceOptimizer's per-key
step cache."""

import cpp_build
import pytest

pytestmark = pytest.mark.unit


def test_server_parts_unit_tests_pass():
    result = cpp_build.run("aggregator_tests", timeout=60)
    assert result.returncode == 0, result.stdout
    assert "23 passed, 0 failed" in result.stdout, result.stdout
