"""Runs the C++ unit test programs (cpp/tests/*_tests.cc: queue ordering, codec, slicer, float16, virtual stream,
and any new one), built once per change of the C++ code by tests/cpp_build.py, and checks that the whole core
compiles warnings-clean with -Wall -Wextra -Werror."""

import os
import re

import cpp_build
import pytest

pytestmark = pytest.mark.unit

# Programs whose own test module states what they cover and how many tests they hold.
OWN_MODULE = {"sender_tests": "test_cpp_sender.py", "aggregator_tests": "test_cpp_server_parts.py",
              "request_tracker_tests": "test_cpp_worker_parts.py", "frame_builder_tests": "test_cpp_worker_parts.py",
              "node_tests": "test_cpp_worker_parts.py"}
# How many tests a program holds, where it is known here (a test dropped from a program's list fails).
TESTS = {"unit_tests": 18, "refusal_log_tests": 3, "torch_optimizer_tests": 8}


@pytest.mark.parametrize("program", [p for p in cpp_build.programs() if p not in OWN_MODULE])
def test_cpp_test_program_passes(program):
    result = cpp_build.run(program, timeout=60)
    assert result.returncode == 0, result.stdout
    expected = TESTS.get(program)
    if expected is None:
        assert re.search(r"^[1-9]\d* passed, 0 failed$", result.stdout, re.MULTILINE), result.stdout
    else:
        assert f"{expected} passed, 0 failed" in result.stdout, result.stdout


def test_programs_with_their_own_module_exist():
    assert set(OWN_MODULE) <= set(cpp_build.programs()), cpp_build.programs()


def test_core_compiles_without_warnings():
    # Every cpp/src/*.cc with -Werror: any warning fails the library's build (a BuildError naming the file).
    assert os.path.getsize(cpp_build.library()) > 0
