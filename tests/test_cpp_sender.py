"""Runs the C++ sender tests (cpp/tests/sender_tests.cc): over loopback TCP, one peer that stops
reading stalls no other and fails after its send timeout unless it declared a pause (then the count restarts
when it resumes), frames leave in (priority, arrival) order per destination and most urgent first across
destinations, a part-written frame inherits the priority of the most urgent frame queued behind it, large frames
written in pieces arrive intact, a broadcast waits for the write of its own slice's push to end (and for no other
frame's: a request carries its id where a push has its iteration), Drain/Abort and write errors behave, and small
socket buffers get segments of a quarter of the buffer on both ends."""

import cpp_build
import pytest

pytestmark = pytest.mark.unit


def test_cpp_sender_tests_pass():
    result = cpp_build.run("sender_tests", timeout=120)
    assert result.returncode == 0, result.stdout
    assert "17 passed, 0 failed" in result.stdout, result.stdout
