"""Builds and runs the C++ sender tests (cpp/tests/sender_tests.cc): over loopback TCP, one peer that stops
reading stalls no other, frames leave in (priority, arrival) order per destination and most urgent first across
destinations, large frames written in pieces arrive intact, Drain/Abort and write errors behave."""

import os
import subprocess

from conftest import ROOT
from test_cpp_unit import FLAGS, compiler  # noqa: F401  (pytest fixture)

CPP = os.path.join(ROOT, "cpp")
UNITS = ("sender.cc", "connection.cc", "socket.cc", "codec.cc", "dtype.cc", "handshake.cc", "trace.cc", "log.cc")


def test_cpp_sender_tests_pass(tmp_path, compiler):  # noqa: F811
    binary = str(tmp_path / "sender_tests")
    sources = [os.path.join(CPP, "src", f) for f in UNITS]
    subprocess.run([compiler, *FLAGS, *sources, os.path.join(CPP, "tests", "sender_tests.cc"), "-o", binary,
                    "-lcrypto"], check=True, timeout=300)
    result = subprocess.run([binary], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert result.returncode == 0, result.stdout
    assert "9 passed, 0 failed" in result.stdout, result.stdout
