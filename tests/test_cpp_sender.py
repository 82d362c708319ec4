"""Builds and runs the C++ sender tests (cpp/tests/sender_tests.cc): over loopback TCP, one peer that stops
reading stalls no other, frames leave in (priority, arrival) order per destination and most urgent first across
destinations, large frames written in pieces arrive intact, Drain/Abort and write errors behave."""

import os
import shutil
import subprocess

import pytest
from conftest import ROOT

CPP = os.path.join(ROOT, "cpp")
FLAGS = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread", "-I", os.path.join(CPP, "include")]
UNITS = ("sender.cc", "connection.cc", "socket.cc", "codec.cc", "dtype.cc", "handshake.cc", "trace.cc", "log.cc")


@pytest.fixture(scope="module")
def compiler():
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.fail("no C++ compiler found: apt-get install g++")
    return cxx


def test_cpp_sender_tests_pass(tmp_path, compiler):
    binary = str(tmp_path / "sender_tests")
    sources = [os.path.join(CPP, "src", f) for f in UNITS]
    subprocess.run([compiler, *FLAGS, *sources, os.path.join(CPP, "tests", "sender_tests.cc"), "-o", binary,
                    "-lcrypto"], check=True, timeout=300)
    result = subprocess.run([binary], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert result.returncode == 0, result.stdout
    assert "9 passed, 0 failed" in result.stdout, result.stdout
