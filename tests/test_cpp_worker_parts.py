"""Runs the C++ unit tests of the node state machines beside the aggregator: the worker's request tracker
(cpp/tests/request_tracker_tests.cc), the frame builder through the codec (frame_builder_tests.cc) and the Node
base's failure fan-out over socketpairs (node_tests.cc), built once per change by tests/cpp_build.py."""

import cpp_build
import pytest

pytestmark = pytest.mark.unit

# Each program and how many tests it holds (a test dropped from a program's list fails).
PROGRAMS = {"request_tracker_tests": 15, "frame_builder_tests": 6, "node_tests": 3}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_worker_parts_unit_tests_pass(name):
    result = cpp_build.run(name, timeout=60)
    assert result.returncode == 0, result.stdout
    assert f"{PROGRAMS[name]} passed, 0 failed" in result.stdout, result.stdout
