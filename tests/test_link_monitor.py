"""The link monitor without a cluster: rtnetlink's qdisc messages as the kernel writes them (built here byte by
byte from linux/rtnetlink.h and gen_stats.h), the backlogged and starved intervals of a sampled link, and the
verdict they give."""

import socket
import struct

import pytest

from benchmarks.emulation import fidelity, link_monitor, netlink, qdisc_stats
from benchmarks.emulation.link_monitor import MAX_PACKET, DirectionStats, HostLink, Sample

pytestmark = pytest.mark.unit


def _attr(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def _qdisc_message(seq: int, ifindex: int, parent: int, kind: str, sent: int, packets: int, backlog: int,
                   qlen: int, drops: int, stats2: bool = True) -> bytes:
    body = struct.pack("=BxxxiIII", socket.AF_UNSPEC, ifindex, 0x80010000, parent, 2)
    body += _attr(qdisc_stats.TCA_KIND, kind.encode() + b"\0")
    if stats2:
        nested = (_attr(qdisc_stats.TCA_STATS_BASIC, struct.pack("=QIxxxx", sent, packets))
                  + _attr(qdisc_stats.TCA_STATS_QUEUE, struct.pack("=IIIII", qlen, backlog, drops, 0, 7)))
        body += _attr(qdisc_stats.TCA_STATS2 | 0x8000, nested)  # NLA_F_NESTED, as the kernel sets it
    else:
        body += _attr(qdisc_stats.TCA_STATS, struct.pack("=QIIIIIIIxxxx", sent, packets, drops, 7, 0, 0, qlen,
                                                         backlog))
    return struct.pack("=IHHII", 16 + len(body), qdisc_stats.RTM_NEWQDISC, 2, seq, 0) + body


def _done(seq: int) -> bytes:
    return struct.pack("=IHHIIi", 20, netlink.NLMSG_DONE, 2, seq, 0, 0)


def test_a_dump_request_asks_for_every_qdisc():
    length, kind, flags, seq, pid = struct.unpack_from("=IHHII", qdisc_stats.request(7))
    assert (length, kind, flags, seq, pid) == (36, qdisc_stats.RTM_GETQDISC, 0x301, 7, 0)


def test_qdisc_answers_give_bytes_sent_and_backlog_from_either_statistics_attribute():
    data = (_qdisc_message(3, 2, qdisc_stats.TC_H_ROOT, "tbf", 48213340, 8021, 131072, 2, 17)
            + _qdisc_message(3, 5, qdisc_stats.TC_H_ROOT, "tbf", 1000, 10, 0, 0, 4, stats2=False)
            + _qdisc_message(2, 9, qdisc_stats.TC_H_ROOT, "tbf", 1, 1, 1, 1, 1))  # an older request's answer
    found, done = qdisc_stats.parse_messages(data, 3)
    assert not done
    assert found == [(2, qdisc_stats.TC_H_ROOT, qdisc_stats.QdiscStats("tbf", 48213340, 8021, 131072, 2, 17)),
                     (5, qdisc_stats.TC_H_ROOT, qdisc_stats.QdiscStats("tbf", 1000, 10, 0, 0, 4))]
    assert qdisc_stats.parse_messages(_done(3), 3) == ([], True)


def test_a_netlink_error_is_raised_with_its_reason():
    error = struct.pack("=IHHIIi", 20, netlink.NLMSG_ERROR, 0, 4, 0, -1)
    with pytest.raises(qdisc_stats.QdiscError, match="Operation not permitted"):
        qdisc_stats.parse_messages(error, 4)


RATE = 8e8  # 100 MB/s: a 20 ms interval owes 2 MB when that much is queued


def _series(steps):
    """Samples every 20 ms from (bytes sent in the step before, backlog at the sample)."""
    samples, sent = [Sample(100.0, 0, steps[0][1])], 0
    for k, (moved, backlog) in enumerate(steps[1:], start=1):
        sent += moved
        samples.append(Sample(100.0 + 0.02 * k, sent, backlog))
    return samples


def test_a_link_that_sends_at_its_rate_while_queued_is_never_starved():
    full = int(RATE / 8 * 0.02)
    stats = link_monitor.direction_stats(_series([(0, 3 * full)] + [(full, 3 * full)] * 9), RATE, 0, 1e9)
    assert (stats.intervals, stats.backlogged, stats.starved, stats.sent_bytes) == (9, 9, 0, 9 * full)
    assert stats.window_s == pytest.approx(0.18)


def test_a_link_that_idles_with_data_queued_is_starved_and_a_draining_queue_owes_only_itself():
    full = int(RATE / 8 * 0.02)
    # (bytes sent in the interval ending at a sample, backlog at that sample)
    steps = [(0, 3 * full),
             (full, 3 * full),  # queued throughout, sent at its rate: fine
             (full // 2, 3 * full),  # queued throughout, half its rate: starved
             (0, 200_000),  # queued at both ends, sent nothing: starved
             (150_000, 0),  # owed the 200 kB queued at its start, sent 150 kB > 0.9 x 200 kB - a packet: fine
             (0, 4 * MAX_PACKET),  # nothing queued at its start: owed nothing, not counted
             (3 * MAX_PACKET, 0),  # owed the 4 packets queued, sent 3 > 0.9 x 4 - 1: fine
             (0, 1000),  # nothing queued at its start: not counted
             (1000, 500)]  # under a frame at both ends (ACKs, a message's tail): owed 1000 bytes, not counted
    stats = link_monitor.direction_stats(_series(steps), RATE, 0, 1e9)
    assert (stats.intervals, stats.backlogged, stats.starved) == (8, 5, 2)
    assert stats.starved_share == pytest.approx(0.4) and stats.backlogged_share == pytest.approx(5 / 8)
    two_short = _series([(0, 4 * MAX_PACKET), (2 * MAX_PACKET, 0)])  # owed 4 packets, sent 2 < 2.6: starved
    assert link_monitor.direction_stats(two_short, RATE, 0, 1e9).starved == 1


def test_only_the_timed_window_counts_and_a_replaced_qdisc_restarts_its_counter():
    full = int(RATE / 8 * 0.02)
    samples = _series([(0, 3 * full)] + [(0, 3 * full)] * 4 + [(full, 3 * full)] * 5)  # starved at first
    assert link_monitor.direction_stats(samples, RATE, 0, 1e9).starved == 4
    assert link_monitor.direction_stats(samples, RATE, 100.07, 1e9).starved == 0  # the window starts later
    reset = [Sample(1.0, 5_000_000, 3 * full), Sample(1.02, 10, 3 * full), Sample(1.04, 10 + full, 0)]
    stats = link_monitor.direction_stats(reset, RATE, 0, 1e9)
    assert (stats.intervals, stats.starved) == (1, 0)


def test_analyse_gives_each_host_both_directions():
    full = int(RATE / 8 * 0.02)
    good, bad = _series([(0, 3 * full), (full, 3 * full)]), _series([(0, 3 * full), (0, 3 * full)])
    [host] = link_monitor.analyse([{"egress": good, "ingress": bad}], RATE, 0, 1e9)
    assert (host.egress.starved, host.ingress.starved, host.starved_share) == (0, 1, 1.0)
    assert host.worst()[0] == "ingress"


def _direction(backlogged, starved, intervals=100):
    return DirectionStats(intervals, backlogged, starved, 0, 2.0)


def _judge(links):
    return fidelity.judge(cpu_window=None, window_s=10.0, limited=False, ranks=[], median_iter_s=0.5, net=None,
                          sampling_cpu_s=None, wall_s=0.0, headroom_cores=None, links=links)


def test_a_link_starved_beyond_the_share_fails_the_run_with_its_numbers():
    fine = HostLink(_direction(80, 4), _direction(60, 0))  # 5.0% exactly: within
    assert fidelity.link_notes([fine]) == (True, [])
    starved = HostLink(_direction(80, 1), _direction(50, 3))
    passed, notes = fidelity.link_notes([fine, starved])
    assert not passed
    assert notes == ["link: host 1's ingress sent under 90% of its rate with data queued in 6.0% of its backlogged "
                     "intervals (3 of 50, limit 5%)"]
    assert "link: host 1's ingress" in _judge([fine, starved]).text()
    assert fidelity.link_notes(None) == (True, ["link: not measured"])
    assert fidelity.link_notes([HostLink(_direction(0, 0, 0), _direction(0, 0, 0))]) == (True, ["link: not measured"])


def test_a_direction_with_too_few_backlogged_intervals_is_noted_not_judged():
    # Horovod's ingress under --link-rx napi in the dilation pilot: 1 backlogged interval, starved, read as 100%.
    one = HostLink(_direction(80, 0), _direction(1, 1))
    assert fidelity.link_notes([one]) == (True, ["link: host 0's ingress not judged: 1 of only 1 backlogged "
                                                 "intervals starved (under 20)"])
    enough = HostLink(_direction(80, 0), _direction(fidelity.MIN_BACKLOGGED_INTERVALS, 2))  # 10%: judged, fails
    passed, notes = fidelity.link_notes([one, enough])
    assert not passed and notes[0].startswith("link: host 1's ingress sent under 90%") and len(notes) == 2
