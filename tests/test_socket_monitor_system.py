"""The socket monitor on real links (root, namespaces, tc): two hosts sending to a third share its ingress, which
runs at its rate, so their waiting data is not "unsaturated"; a receiver that reads slowly holds its sender back by
its window, the link idles with data waiting, and the monitor says so (rwnd-limited, unsaturated)."""

import sys
import time

import pytest
from link_traffic import SENDER, require_namespaces

from benchmarks.emulation import emulated_cluster, socket_monitor

pytestmark = pytest.mark.system

RATE = 100e6
RECEIVER = """
import socket, sys, time
slow = sys.argv[1] == "slow"
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if slow:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
s.bind(("0.0.0.0", 5001)); s.listen()
peers = [s.accept()[0] for _ in range(int(sys.argv[2]))]
for p in peers:
    p.setblocking(False)
while peers:
    for p in list(peers):
        try:
            if not p.recv(16384 if slow else 1 << 20):
                peers.remove(p)
        except BlockingIOError:
            pass
    time.sleep(0.01 if slow else 0.0005)
"""


def _transfer(cluster, senders: list[int], to: int, seconds: float, mode: str) -> tuple[float, float]:
    receiver = cluster.popen(to, [sys.executable, "-c", RECEIVER, mode, str(len(senders))])
    try:
        time.sleep(0.5)
        start = time.time()
        procs = [cluster.popen(i, [sys.executable, "-c", SENDER, cluster.address(to), str(seconds)])
                 for i in senders]
        for p in procs:
            assert p.wait(timeout=seconds + 60) == 0
        end = time.time()
        receiver.wait(timeout=60)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    return start, end


def test_incast_keeps_the_shared_ingress_at_its_rate_and_a_slow_reader_leaves_data_waiting_on_an_idle_link():
    require_namespaces()
    with emulated_cluster.EmulatedCluster(3, "100mbit") as cluster:
        addresses = [cluster.address(i) for i in range(3)]
        monitor = socket_monitor.SocketMonitor(cluster.namespaces, addresses).start()
        try:
            start, end = _transfer(cluster, [0, 1], 2, 3.0, "fast")
            slow_start, slow_end = _transfer(cluster, [0], 1, 3.0, "slow")
        finally:
            intervals = monitor.stop()
    assert monitor.error is None and monitor.cpu_s > 0
    # The steady part of the incast (TCP's first and last half second left out).
    incast = socket_monitor.analyse(intervals, 3, RATE, start + 0.5, end - 0.5)
    window = end - start - 1.0
    assert incast.flows == 2 and incast.intervals > 20
    assert incast.backlogged_by_host[2] == 0 and min(incast.backlogged_by_host[:2]) > 0.5 * window, incast
    # Host 2's ingress carried the two flows at the link's payload rate.
    assert incast.sent_bytes / incast.window_s == pytest.approx(
        RATE / 8 * socket_monitor.PAYLOAD_SHARE, rel=0.15)
    assert incast.unsaturated_share < 0.25, incast
    # The slow reader: its window, not a link, holds the sender back.
    slow = socket_monitor.analyse(intervals, 3, RATE, slow_start + 0.5, slow_end - 0.5)
    assert slow.flows == 1 and slow.backlogged_by_host[0] > 0.5 * (slow_end - slow_start - 1.0), slow
    assert slow.unsaturated_share > 0.9 and slow.rwnd_limited_us > 0.5 * slow.busy_us, slow
    # ... and the split of its unsaturated time says so.
    assert slow.unsaturated_by_limit[socket_monitor.LIMITS.index("rwnd")] > 0.5 * slow.unsaturated_s, slow
