"""Priority is real: when the server's consumer or the link is the bottleneck, slices are processed and sent
in priority order, and an urgent small key pushed after a large non-urgent key completes first.

Evidence comes from the core's per-slice trace (P3_TRACE / trace=), not from sleeps and timings."""

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
from harness import SCRIPTS, run_job, run_launcher

BULK, URGENT = 1, 0
BULK_SLICES = 40


def _events(trace, event, iteration=1):
    return [e for e in sorted(trace, key=lambda e: e[0]) if e[1] == event and e[5] == iteration]


def _completion_order(trace):
    return [e[2] for e in _events(trace, "complete")]


@pytest.mark.integration
def test_server_consumer_processes_most_urgent_slice_first(tmp_path):
    # Each slice's update takes 20 ms, so the bulk key's slices queue up in the server's priority queue
    # while the urgent slice arrives; it must be taken next, ahead of everything queued.
    env = {"P3_TEST_OUT": str(tmp_path), "P3_SLICE_SIZE": "1000", "P3_TEST_BULK_SLICES": str(BULK_SLICES),
           "P3_TEST_UPDATER": "slow:0.02", "P3_TRACE": str(tmp_path / "trace")}
    result = run_job(1, 1, [os.path.join(SCRIPTS, "priority_worker.py")], env=env, server_script="test_server.py")
    assert result.returncode == 0, result.stdout
    server = json.load(open(tmp_path / "server0.json"))
    processed = [e[2] for e in _events(server["trace"], "aggregate")]
    assert processed.count(BULK) == BULK_SLICES and processed.count(URGENT) == 1
    position = processed.index(URGENT)
    # Only bulk slices the consumer had already taken before the urgent one arrived may precede it.
    assert position <= 3, processed
    # And the bulk slices keep their FIFO order among themselves.
    bulk_slices = [e[3] for e in _events(server["trace"], "aggregate") if e[2] == BULK]
    assert bulk_slices == sorted(bulk_slices)

    worker = json.load(open(tmp_path / "worker0.json"))
    assert _completion_order(worker["trace"]) == [URGENT, BULK]
    # Chrome-trace files were written for both nodes.
    assert json.load(open(tmp_path / "trace.server0.json"))["traceEvents"]
    assert json.load(open(tmp_path / "trace.worker0.json"))["traceEvents"]


def _require_netns():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace with a capped link (CI runs as root)")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.fail("iproute2 (ip, tc) is missing: apt-get install iproute2")


@pytest.mark.system
def test_link_bottleneck_sends_urgent_slice_first(tmp_path):
    # The whole job runs in a fresh network namespace whose loopback is capped at 20 Mbit/s: the worker's
    # socket fills, its send queue builds up, and the urgent slice must overtake the queued bulk slices.
    _require_netns()
    ns = f"p3test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
    try:
        def in_ns(*cmd):
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, timeout=10)

        in_ns("ip", "link", "set", "lo", "mtu", "1500")  # tbf needs bursts >= one packet
        in_ns("ip", "link", "set", "lo", "up")
        in_ns("tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "20mbit", "burst", "16kb", "latency", "100ms")
        env = dict(os.environ, P3_TEST_OUT=str(tmp_path), P3_SLICE_SIZE="10000",
                   P3_TEST_BULK_SLICES=str(BULK_SLICES), P3_SOCKET_BUFFER="16384",
                   P3_TRACE=str(tmp_path / "trace"))
        result = run_launcher("-n", "1", "-s", "1", "--", sys.executable, os.path.join(SCRIPTS, "priority_worker.py"),
                              env=env, timeout=120, merge_output=True, wrap=("ip", "netns", "exec", ns))
        assert result.returncode == 0, result.stdout
    finally:
        subprocess.run(["ip", "netns", "delete", ns], timeout=10)
    trace = json.load(open(tmp_path / "worker0.json"))["trace"]
    sent = [e[2] for e in _events(trace, "send")]
    assert sent.count(BULK) == BULK_SLICES and sent.count(URGENT) == 1
    # The sender had popped at most a couple of bulk slices (one in the socket, one blocked in write)
    # before the urgent push was queued; every other bulk slice waited behind it.
    assert sent.index(URGENT) <= 3, sent
    assert _completion_order(trace) == [URGENT, BULK]
