"""Builds and runs the C++ unit tests (queue ordering, codec, slicer, float16, virtual stream), and checks that
the whole core compiles warnings-clean with -Wall -Wextra -Werror."""

import glob
import os
import shutil
import subprocess

import pytest
from conftest import ROOT

CPP = os.path.join(ROOT, "cpp")
# The public API (cpp/include) and the internal headers beside the sources (cpp/src), which the tests drive.
FLAGS = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread", "-I", os.path.join(CPP, "include"),
         "-I", os.path.join(CPP, "src")]


@pytest.fixture(scope="module")
def compiler():
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.fail("no C++ compiler found: apt-get install g++")
    return cxx


def test_cpp_unit_tests_pass(tmp_path, compiler):
    binary = str(tmp_path / "unit_tests")
    units = ("dtype.cc", "codec.cc", "frame_builder.cc", "slicer.cc", "socket.cc", "handshake.cc", "virtual_stream.cc",
             "log.cc")
    sources = [os.path.join(CPP, "src", f) for f in units]
    subprocess.run([compiler, *FLAGS, *sources, os.path.join(CPP, "tests", "unit_tests.cc"), "-o", binary, "-lcrypto"],
                   check=True, timeout=300)
    result = subprocess.run([binary], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert result.returncode == 0, result.stdout
    assert "16 passed, 0 failed" in result.stdout, result.stdout


def test_core_compiles_without_warnings(tmp_path, compiler):
    procs = [subprocess.Popen([compiler, *FLAGS, "-fsyntax-only", src])
             for src in sorted(glob.glob(os.path.join(CPP, "src", "*.cc")))]
    assert all(p.wait(timeout=300) == 0 for p in procs)
