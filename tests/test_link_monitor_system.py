"""The link monitor on real links (root, namespaces, tc): it reads the same counters `tc -s qdisc` shows, sees a
link that a bulk TCP transfer keeps queued sending at its rate, and catches a link that sends slower than the rate
it promises (here: its token bucket turned down behind the monitor's back) as starved, which fails the run."""

import sys
import time

import pytest
from link_traffic import SENDER, require_namespaces

from benchmarks.emulation import emulated_cluster, fidelity, link_monitor, net_counters, qdisc_stats

pytestmark = pytest.mark.system

RATE = 100e6
RECEIVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 5001)); s.listen()
c, _ = s.accept()
while c.recv(1 << 20):
    pass
"""


def _sent_by_tc(cluster, i: int) -> int:
    text = cluster.run(i, ["tc", "-s", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True).stdout
    return int(net_counters._SENT.search(text).group(1))


def _transfer(cluster, seconds: float) -> tuple[float, float]:
    """Host 0 sends to host 1 for `seconds`; the (start, end) of the transfer on time.time()'s clock."""
    receiver = cluster.popen(1, [sys.executable, "-c", RECEIVER])
    try:
        time.sleep(0.5)
        start = time.time()
        cluster.run(0, [sys.executable, "-c", SENDER, cluster.address(1), str(seconds)], check=True,
                    timeout=seconds + 30)
        end = time.time()
        receiver.wait(timeout=30)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    return start, end


def test_a_link_queued_by_a_bulk_transfer_sends_at_its_rate_and_one_that_does_not_is_caught():
    require_namespaces()
    with emulated_cluster.EmulatedCluster(2, "100mbit") as cluster:
        monitor = link_monitor.LinkMonitor(cluster.namespaces, cluster.bridge_ns).start()
        try:
            start, end = _transfer(cluster, 2.0)
            # The token bucket behind the monitor's back: 10 Mbit/s while the link promises 100.
            cluster.run(0, ["tc", "qdisc", "change", "dev", "eth0", "root",
                            *emulated_cluster.tbf_args(RATE / 10)], check=True)
            slow_start, slow_end = _transfer(cluster, 2.0)
        finally:
            series = monitor.stop()
        # The netlink reader reads what tc shows (between two readings of tc; equal while nothing moves).
        before = _sent_by_tc(cluster, 0)
        reader = qdisc_stats.NamespaceQdiscs(cluster.netns(0), ["eth0"])
        try:
            direct = reader.read()["eth0"]
        finally:
            reader.close()
        after = _sent_by_tc(cluster, 0)
        assert before <= direct.bytes <= after and direct.kind == "tbf"
        assert series[0]["egress"][-1].sent <= direct.bytes
    assert monitor.error is None and monitor.cpu_s > 0
    # Steady part of the healthy transfer (its first and last 0.3 s are TCP's start and end): host 0's egress was
    # queued in most intervals, sent at the rate, and never starved for more than the verdict's share.
    [healthy, _] = link_monitor.analyse(series, RATE, start + 0.3, end - 0.3)
    assert healthy.egress.backlogged_share > 0.5, healthy
    assert healthy.egress.sent_bytes * 8 / healthy.egress.window_s == pytest.approx(RATE, rel=0.1)
    assert healthy.egress.starved_share <= fidelity.MAX_LINK_STARVED_SHARE, healthy
    assert fidelity.link_notes([healthy])[0]
    [slow, _] = link_monitor.analyse(series, RATE, slow_start + 0.3, slow_end - 0.3)
    assert slow.egress.backlogged > 10 and slow.egress.starved_share > 0.8, slow
    passed, [note] = fidelity.link_notes([slow])
    assert not passed and note.startswith("link: host 0's egress sent under 90% of its rate"), note
    # Host 1 sent only ACKs: its egress never had data queued.
    [_, acks] = link_monitor.analyse(series, RATE, start, slow_end)
    assert acks.egress.intervals > 100 and acks.egress.backlogged == 0
