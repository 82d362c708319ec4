"""Did every emulated link send at its rate whenever data was queued to it? (The link monitor of the fidelity
verdict: a NIC with packets waiting never idles; an emulated one can, when the kernel runs its token bucket late.)

Each direction of a host's link is a tbf qdisc (emulated_cluster.py): the host's egress is eth0's in its
namespace, its ingress the bridge port h<i>'s. The qdisc is the emulated NIC's queue: what a sender handed to the
link and the link has not sent yet (what a socket has not handed over waits on TCP: its window, its pacing, its
small-queue limit). Every `interval` seconds a thread reads each
qdisc's bytes sent and backlog (qdisc_stats.py: one netlink socket per namespace); afterwards `analyse` cuts the
run's timed window and, per link direction, looks at every interval between two samples:
- what the link owed in it: its whole rate x the interval when the queue held at least a full-sized frame at
  both samples (TCP small queues keep a sending socket's share of the qdisc at a packet or two and the rest in
  the socket, so a queue seen non-empty at both ends means its senders had data waiting throughout, unless it
  emptied between the samples: a burst that ended and another that began), else what was queued at the start,
  up to the rate x the interval (a work-conserving link sends its queue in order, at its rate);
- the interval counts as *backlogged* when it owed at least MIN_OWED_PACKETS packets of MAX_PACKET bytes (below
  that, one packet's rounding decides);
- and as *starved* when it sent less than SENT_SHARE of what it owed, less one MAX_PACKET (the counter moves by
  whole packets, up to 64 KiB with GSO, and one can be half paid for at either end).
A direction's starved share is starved / backlogged intervals; the run's verdict (fidelity.py) takes the worst
over all hosts and directions.

The sampler runs on a thread of the runner, outside the hosts' CPU quotas: its CPU time is part of the run's
sampling_cpu_s (what the monitors cost, flagged against the headroom the quotas leave) and, alone, of
link_monitor_cpu_s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from benchmarks.emulation import periodic, qdisc_stats

INTERVAL_S = 0.02  # 20 ms: at the sweeps' slowest link (200 Mbit) an interval owes 500 KB, ~8 GSO packets
# A 64 KiB GSO packet as tbf meters it: the kernel's packet length adds the headers of each of its up to 46
# MSS-sized segments (qdisc_pkt_len_init), 66 bytes each (Ethernet, IPv4, TCP with timestamps).
MAX_PACKET = 65536 + 46 * 66
FRAME = 1514  # a full-sized Ethernet frame: a queue holding less at a sample holds ACKs or a message's tail
MIN_OWED_PACKETS = 2
SENT_SHARE = 0.9
DIRECTIONS = ("egress", "ingress")


@dataclasses.dataclass(frozen=True)
class Sample:
    time: float  # time.time(), the clock the timed window is cut with (result files' modification times)
    sent: int  # bytes the qdisc has sent so far
    backlog: int  # bytes queued in it


@dataclasses.dataclass(frozen=True)
class DirectionStats:
    intervals: int  # sampling intervals inside the window
    backlogged: int  # ... in which the link owed at least MIN_OWED_PACKETS packets
    starved: int  # ... and sent less than SENT_SHARE of that, less one packet
    sent_bytes: int  # over the window's intervals
    window_s: float

    @property
    def starved_share(self) -> float:
        return self.starved / self.backlogged if self.backlogged else 0.0

    @property
    def backlogged_share(self) -> float:
        return self.backlogged / self.intervals if self.intervals else 0.0


def direction_stats(samples: Sequence[Sample], rate_bps: float, start: float, end: float) -> DirectionStats:
    """One direction's intervals between consecutive samples that lie within [start, end]."""
    intervals = backlogged = starved = sent_total = 0
    covered = 0.0
    for a, b in zip(samples, samples[1:]):
        if a.time < start or b.time > end or b.time <= a.time:
            continue
        sent = b.sent - a.sent
        if sent < 0:  # the qdisc was replaced (a new rate) between the samples
            continue
        intervals += 1
        sent_total += sent
        covered += b.time - a.time
        capacity = rate_bps / 8 * (b.time - a.time)
        owed = capacity if min(a.backlog, b.backlog) >= FRAME else min(a.backlog, capacity)
        if owed >= MIN_OWED_PACKETS * MAX_PACKET:
            backlogged += 1
            if sent < SENT_SHARE * owed - MAX_PACKET:
                starved += 1
    return DirectionStats(intervals, backlogged, starved, sent_total, covered)


@dataclasses.dataclass(frozen=True)
class HostLink:
    egress: DirectionStats
    ingress: DirectionStats

    @property
    def starved_share(self) -> float:
        return max(self.egress.starved_share, self.ingress.starved_share)

    @property
    def backlogged_share(self) -> float:
        return max(self.egress.backlogged_share, self.ingress.backlogged_share)

    def worst(self) -> tuple[str, DirectionStats]:
        return max(zip(DIRECTIONS, (self.egress, self.ingress)), key=lambda d: d[1].starved_share)


def analyse(series: Sequence[dict[str, Sequence[Sample]]], rate_bps: float, start: float, end: float
            ) -> list[HostLink]:
    """Per host ({"egress": samples, "ingress": samples}), its link's intervals within the window."""
    return [HostLink(direction_stats(s.get("egress", ()), rate_bps, start, end),
                     direction_stats(s.get("ingress", ()), rate_bps, start, end)) for s in series]


class LinkMonitor(periodic.PeriodicSampler):
    """Samples both qdiscs of every host's link on a thread (start ... stop). `namespaces`: the hosts';
    `bridge_ns`: the bridge's, whose port h<i> is host i's ingress."""

    def __init__(self, namespaces: Sequence[str], bridge_ns: str, interval: float = INTERVAL_S):
        self._hosts: list[qdisc_stats.NamespaceQdiscs] = []
        try:
            for ns in namespaces:
                self._hosts.append(qdisc_stats.NamespaceQdiscs(ns, ["eth0"]))
            self._bridge = qdisc_stats.NamespaceQdiscs(bridge_ns, [f"h{i}" for i in range(len(namespaces))])
        except qdisc_stats.QdiscError:
            self._close_hosts()
            raise
        self.series: list[dict[str, list[Sample]]] = [{d: [] for d in DIRECTIONS} for _ in namespaces]
        super().__init__(self.sample, interval, "link-monitor", "the link monitor")


    def sample(self) -> None:
        """One reading of every qdisc, each stamped with the time it was read."""
        for i, reader in enumerate(self._hosts):
            stats = reader.read().get("eth0")
            now = time.time()
            if stats is not None:
                self.series[i]["egress"].append(Sample(now, stats.bytes, stats.backlog))
        ports = self._bridge.read()
        now = time.time()
        for i in range(len(self._hosts)):
            stats = ports.get(f"h{i}")
            if stats is not None:
                self.series[i]["ingress"].append(Sample(now, stats.bytes, stats.backlog))

    def stop(self) -> list[dict[str, list[Sample]]]:
        super().stop()
        self._close_hosts()
        self._bridge.close()
        return self.series

    def _close_hosts(self) -> None:
        for reader in self._hosts:
            reader.close()
