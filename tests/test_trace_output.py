"""The trace file a node writes (p3kv.core.node.write_trace): its events as Chrome-trace JSON, and how many older
events the node's bounded trace ring dropped (cpp/tests/trace_tests.cc tests the ring itself)."""

import json
import logging

import pytest

from p3kv.core import node

pytestmark = pytest.mark.unit

EVENTS = [(1_000, "send", 3, 0, 5, 1, 2), (2_000, "enqueue", 4, 1, 0, 1, -1)]


def test_trace_file_holds_events_and_no_drops(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="p3kv"):
        path = node.write_trace(str(tmp_path / "t"), "worker", 0, EVENTS)
    with open(path) as f:
        data = json.load(f)
    assert [e["args"]["key"] for e in data["traceEvents"]] == [3, 4]
    assert data["otherData"]["dropped_records"] == 0
    assert "dropped" not in caplog.text


def test_trace_file_reports_dropped_records(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="p3kv"):
        path = node.write_trace(str(tmp_path / "t"), "server", 1, EVENTS, dropped=1234)
    with open(path) as f:
        data = json.load(f)
    assert data["otherData"]["dropped_records"] == 1234
    assert "1234 older ones were dropped" in caplog.text
