"""The trace anatomy (benchmarks/analysis/trace_anatomy.py): how far a worker's progress to its servers drifts
apart, the more urgent slices sent after less urgent ones, and the skew of a slice's pushes at its server, from
traces written as p3kv.core.node.write_trace writes them."""

import pytest

from benchmarks.analysis import trace_anatomy
from p3kv.core import node

pytestmark = pytest.mark.unit


def _job(tmp_path, drifting: bool) -> str:
    """Two workers, two servers, two iterations of four slices (priorities 3..0, slice s on server s % 2): in
    order, or (drifting) worker 1 serving server 1 first, its server-0 slices 2 s late."""
    prefix = str(tmp_path / ("drift" if drifting else "even"))
    servers = {0: [], 1: []}
    for w in range(2):
        events = []
        for it in range(2):
            t0 = 10.0 * it
            for s in range(4):
                events.append((int((t0 + 0.1 * s) * 1e9), "enqueue", s, 0, 3 - s, it, s % 2))
            order = [(s, t0 + 1 + s) for s in range(4)]
            if drifting and w == 1:
                order = [(1, t0 + 1), (3, t0 + 2), (0, t0 + 3), (2, t0 + 4)]
            for s, t in order:
                events.append((int(t * 1e9), "send", s, 0, 3 - s, it, s % 2))
                servers[s % 2].append((int((t + 0.01) * 1e9), "server_receive", s, 0, 3 - s, it, w))
        node.write_trace(prefix, "worker", w, events)
    for rank, events in servers.items():
        node.write_trace(prefix, "server", rank, events)
    return prefix


def test_workers_that_serve_every_server_in_priority_order_do_not_drift(tmp_path):
    workers = trace_anatomy._nodes(_job(tmp_path, False), "worker")
    servers = trace_anatomy._nodes(_job(tmp_path, False), "server")
    a = trace_anatomy.anatomy(workers, servers)
    assert a["iterations"] == 2 and a["order_breaks"] == 0 and a["push_skew_median"] == pytest.approx(0.0)
    assert a["drift_max"] == pytest.approx(1.0)  # the last slice to server 0 at +3 s, to server 1 at +4 s


def test_a_worker_that_serves_one_server_first_drifts_and_breaks_the_order(tmp_path):
    prefix = _job(tmp_path, True)
    a = trace_anatomy.anatomy(trace_anatomy._nodes(prefix, "worker"), trace_anatomy._nodes(prefix, "server"))
    assert a["order_breaks"] == 2  # per iteration: slice 0 (priority 3) after slice 3 (priority 0)
    assert a["drift_max"] == pytest.approx(2.0)  # worker 1: server 1 done at +2 s, server 0 at +4 s
    assert a["push_skew_median"] > 0.5
    text = trace_anatomy.table([("drift", a)])
    assert "| drift | 2 | 1.50 / 2.00 | 2 of 16 |" in text, text


def test_the_command_names_a_prefix_without_traces(tmp_path, capsys):
    assert trace_anatomy.main([str(tmp_path / "nothing")]) == 1
    assert "no worker traces" in capsys.readouterr().err
