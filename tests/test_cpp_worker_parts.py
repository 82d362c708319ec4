"""Builds and runs the C++ unit tests of the node state machines beside the aggregator: the worker's request
tracker (cpp/tests/request_tracker_tests.cc), the frame builder through the codec (frame_builder_tests.cc) and
the Node base's failure fan-out over socketpairs (node_tests.cc)."""

import os
import subprocess

import pytest
from conftest import ROOT
from test_cpp_unit import FLAGS, compiler  # noqa: F401  (pytest fixture)

CPP = os.path.join(ROOT, "cpp")
PROGRAMS = {
    "request_tracker_tests": (("request_tracker.cc", "dtype.cc", "frame_builder.cc", "codec.cc", "slicer.cc"), 11),
    "frame_builder_tests": (("frame_builder.cc", "codec.cc", "dtype.cc"), 6),
    "node_tests": (("node.cc", "frame_builder.cc", "codec.cc", "dtype.cc", "connection.cc", "socket.cc",
                    "handshake.cc", "scheduler_client.cc", "trace.cc", "log.cc"), 3),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_worker_parts_unit_tests_pass(tmp_path, compiler, name):  # noqa: F811
    units, count = PROGRAMS[name]
    binary = str(tmp_path / name)
    sources = [os.path.join(CPP, "src", f) for f in units]
    subprocess.run([compiler, *FLAGS, *sources, os.path.join(CPP, "tests", name + ".cc"), "-o", binary, "-lcrypto"],
                   check=True, timeout=300)
    result = subprocess.run([binary], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert result.returncode == 0, result.stdout
    assert f"{count} passed, 0 failed" in result.stdout, result.stdout
