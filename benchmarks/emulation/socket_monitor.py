"""Did TCP keep the links as busy as a fluid model would? (The socket monitor: a measurement for the simulator's
error, issue 28, not yet a rule of the fidelity verdict.)

The simulator shares a link among the flows that have data for it at once and at full rate (max-min fair, no
congestion control). Real TCP learns its share: BBR's bandwidth estimate is a maximum over about ten round trips,
so when flows join or leave a link it paces for a while at a rate fitted to the previous set, and a socket can
hold data that no saturated link is holding back. This monitor measures how much of that there is, per run.

Every `interval` seconds a thread reads each host's established TCP sockets (tcp_diag.py: one netlink socket per
namespace); afterwards `analyse` cuts the run's timed window. A flow is a socket whose two ends are different
hosts of the cluster (a worker's socket to its own host's server never crosses a link). In every interval between
two readings:
- each link direction carried the payload its flows sent (the growth of their bytes_sent: the source's egress,
  the destination's ingress), and is *saturated* when that is at least SENT_SHARE of what the link can carry in
  the interval (its rate x the interval x the payload share of a full frame, PAYLOAD_SHARE), less one MAX_PACKET;
- a flow is *backlogged* when its socket held at least one MSS written and not yet sent at both readings;
- a backlogged flow with no saturated link on its path (neither its egress nor its destination's ingress) is
  *unsaturated*: data waited in a socket while every link it crosses had room, which a fluid model never allows.
A run's tcp_unsaturated_pct is the unsaturated share of all backlogged flow-time (per source host in
tcp_unsaturated_hosts). What held each unsaturated flow back, at the interval's second reading, splits that time in
tcp_unsaturated_limits (LIMITS, in this order of precedence):
- rwnd: the receiver's window, for at least half the interval (the kernel's chrono);
- cwnd: the congestion window, full (segments in flight >= snd_cwnd): CUBIC after a loss, BBR in PROBE_RTT or with
  a window fitted to a stale min RTT or bandwidth;
- pacing: BBR in PROBE_BW (pacing gain 0.75 to 1.25) with neither window full: its pacing rate held it, or
  something below TCP that tcp_info does not show (TCP small queues, the qdisc);
- startup: BBR's pacing in STARTUP or DRAIN (gain 2.89 or 0.35: a connection still learning its rate);
- other: none of these (a socket under another congestion control, not at its window).
For the pacing share, tcp_unsaturated_bw_share asks whether BBR's estimate is what idles the link: the bandwidth
estimates of the backlogged flows leaving the flow's source host, summed, over the link's payload rate (time-weighted
mean over that flow-time). Below 1, the flows together believed the link slower than it is; at 1 or more, their
pacing rates would fill it, so the estimates are not what held them.
For the cwnd share under BBR, tcp_cwnd_causes asks why the window was full (WINDOW_CAUSES, in this order):
- rtt: the flow's smoothed RTT was at least BBR's cwnd gain times its min RTT. BBR sizes the window as the gain times
  its bandwidth estimate times its min RTT, so at that RTT a window at its target carries no more than the estimate:
  queueing delay, not the estimate, bounds the flow;
- short: the window was below 90% of that target (PROBE_RTT's four segments, loss recovery, a new connection);
- other: neither (a window at its target and a RTT below the gain's multiple: in flight beyond what the estimate
  implies).
tcp_cwnd_rtt_inflation is the time-weighted mean of smoothed RTT over min RTT over that same flow-time.
From the kernel's own chronos it also reports which share of the flows' busy time the receiver's window
(tcp_rwnd_limited_pct) and a full send buffer (tcp_sndbuf_limited_pct) held them, and the retransmitted share of the
bytes sent.

The sampler runs on a thread of the runner, outside the hosts' CPU quotas, like the link monitor; its CPU time is
part of the run's sampling_cpu_s and, alone, tcp_monitor_cpu_s (about 2% of a core for 3 hosts on this machine:
tcp_diag.py reads known sockets by id and dumps only once a second). It is off unless a run asks for it
(--tcp-trace).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from benchmarks.emulation import periodic, tcp_diag
from benchmarks.emulation.link_monitor import MAX_PACKET, SENT_SHARE

INTERVAL_S = 0.05  # 50 ms: at the sweeps' slowest link (200 Mbit) an interval carries ~1.2 MB, ~18 GSO packets
PAYLOAD_SHARE = 1448 / 1514  # a full frame's payload: MSS 1448 of 1514 bytes (Ethernet, IPv4, TCP timestamps)
COLUMNS = ("tcp_flows", "tcp_backlogged_s", "tcp_unsaturated_pct", "tcp_unsaturated_hosts", "tcp_unsaturated_limits",
           "tcp_unsaturated_bw_share", "tcp_cwnd_causes", "tcp_cwnd_rtt_inflation", "tcp_rwnd_limited_pct",
           "tcp_sndbuf_limited_pct", "tcp_retrans_pct", "tcp_monitor_cpu_s")

LIMITS = ("rwnd", "cwnd", "pacing", "startup", "other")  # see the module's docstring
PACING = LIMITS.index("pacing")
CWND = LIMITS.index("cwnd")
WINDOW_CAUSES = ("rtt", "short", "other")  # why a BBR flow's window was full (see the module's docstring)
SHORT_WINDOW = 0.9  # of BBR's target window

Reading = dict[tuple[str, int, str, int], tcp_diag.TcpSocket]


@dataclasses.dataclass(frozen=True)
class Sweep:
    """Every host's sockets at one moment (the hosts are read one after another within a millisecond or two)."""

    time: float
    hosts: tuple[Reading, ...]


@dataclasses.dataclass(frozen=True)
class Interval:
    """What happened between two sweeps, reduced to what `analyse` needs (a run's sweeps are not kept: a
    five-minute run would hold half a million socket readings)."""

    start: float
    end: float
    egress: tuple[int, ...]  # payload bytes each host sent to other hosts
    ingress: tuple[int, ...]  # ... each host received from other hosts
    # Each backlogged flow's source and destination host, its limit (an index into LIMITS) and, for a BBR flow
    # held by its window, why (an index into WINDOW_CAUSES; -1 otherwise) and its smoothed RTT over its min RTT.
    waiting: tuple[tuple[int, int, int, int, float], ...]
    estimates: tuple[int, ...]  # the bandwidth estimates (BBR, bytes/s) of each host's backlogged flows, summed
    flows: int  # flows that crossed a link in it
    busy_us: int
    rwnd_limited_us: int
    sndbuf_limited_us: int
    retrans_bytes: int


def limit(then: tcp_diag.TcpSocket, now: tcp_diag.TcpSocket, seconds: float) -> int:
    """What held a backlogged flow back over an interval of `seconds` read at `then` and `now`: an index into LIMITS
    (see the module's docstring)."""
    if now.rwnd_limited_us - then.rwnd_limited_us >= seconds * 1e6 / 2:
        return LIMITS.index("rwnd")
    if now.snd_cwnd and now.unacked >= now.snd_cwnd:
        return LIMITS.index("cwnd")
    if not now.bbr_pacing_gain:
        return LIMITS.index("other")
    return PACING if 0.5 < now.bbr_pacing_gain < 2 else LIMITS.index("startup")


def window_cause(now: tcp_diag.TcpSocket) -> tuple[int, float]:
    """Why a BBR flow's full window was full (an index into WINDOW_CAUSES) and its smoothed RTT over its min RTT;
    (-1, 0.0) for a socket without BBR's state."""
    if not (now.bbr_min_rtt_us and now.bbr_cwnd_gain and now.bbr_bw and now.rtt_us):
        return -1, 0.0
    inflation = now.rtt_us / now.bbr_min_rtt_us
    target = now.bbr_cwnd_gain * now.bbr_bw * now.bbr_min_rtt_us / 1e6  # bytes
    if inflation >= now.bbr_cwnd_gain:
        return WINDOW_CAUSES.index("rtt"), inflation
    if now.snd_cwnd * now.snd_mss < SHORT_WINDOW * target:
        return WINDOW_CAUSES.index("short"), inflation
    return WINDOW_CAUSES.index("other"), inflation


def interval(a: Sweep, b: Sweep, host_of: dict[str, int]) -> Interval:
    """The interval from sweep `a` to sweep `b`; `host_of` maps each host's address to its index."""
    n = len(b.hosts)
    egress, ingress, estimates, waiting = [0] * n, [0] * n, [0] * n, []
    flows = busy = rwnd = sndbuf = retrans = 0
    for src_host, (before, after) in enumerate(zip(a.hosts, b.hosts)):
        for key, now in after.items():
            then = before.get(key)
            dst_host = host_of.get(now.dst)
            if then is None or dst_host is None or dst_host == src_host or now.bytes_sent < then.bytes_sent:
                continue  # a new connection, one that stays on its host, or a reused port
            sent = now.bytes_sent - then.bytes_sent
            flows += sent > 0
            egress[src_host] += sent
            ingress[dst_host] += sent
            retrans += now.bytes_retrans - then.bytes_retrans
            busy += now.busy_us - then.busy_us
            rwnd += now.rwnd_limited_us - then.rwnd_limited_us
            sndbuf += now.sndbuf_limited_us - then.sndbuf_limited_us
            if min(then.notsent_bytes, now.notsent_bytes) >= max(now.snd_mss, 1):
                held_by = limit(then, now, b.time - a.time)
                waiting.append((src_host, dst_host, held_by, *(window_cause(now) if held_by == CWND else (-1, 0.0))))
                estimates[src_host] += now.bbr_bw
    return Interval(a.time, b.time, tuple(egress), tuple(ingress), tuple(waiting), tuple(estimates), flows, busy,
                    rwnd, sndbuf, retrans)


@dataclasses.dataclass(frozen=True)
class SocketStats:
    """A run's timed window as the sockets saw it (see the module's docstring)."""

    flows: int  # the most flows that crossed links in one interval
    intervals: int
    window_s: float  # the intervals' time together
    backlogged_s: float  # flow-seconds
    unsaturated_s: float
    backlogged_by_host: tuple[float, ...]
    unsaturated_by_host: tuple[float, ...]
    unsaturated_by_limit: tuple[float, ...]  # flow-seconds, in LIMITS' order
    bw_share_s: float  # the pacing share's flow-seconds weighted by its egress's estimates over the link's rate
    window_by_cause: tuple[float, ...]  # the cwnd share's BBR flow-seconds, in WINDOW_CAUSES' order
    inflation_s: float  # ... weighted by smoothed RTT over min RTT
    busy_us: int
    rwnd_limited_us: int
    sndbuf_limited_us: int
    sent_bytes: int
    retrans_bytes: int

    @property
    def unsaturated_share(self) -> float:
        return self.unsaturated_s / self.backlogged_s if self.backlogged_s else 0.0

    def host_shares(self) -> list[float]:
        return [u / b if b else 0.0 for u, b in zip(self.unsaturated_by_host, self.backlogged_by_host)]

    def columns(self) -> dict:
        def pct(part: float, whole: float) -> float | str:
            return round(100 * part / whole, 2) if whole else ""

        return {"tcp_flows": self.flows, "tcp_backlogged_s": round(self.backlogged_s, 3),
                "tcp_unsaturated_pct": pct(self.unsaturated_s, self.backlogged_s),
                "tcp_unsaturated_hosts": ";".join(f"{100 * s:.1f}" for s in self.host_shares()),
                "tcp_unsaturated_limits": ";".join(f"{name}:{100 * s / self.unsaturated_s:.1f}" for name, s in
                                                   zip(LIMITS, self.unsaturated_by_limit)) if self.unsaturated_s
                else "",
                "tcp_unsaturated_bw_share": round(self.bw_share_s / self.unsaturated_by_limit[PACING], 3)
                if self.unsaturated_by_limit[PACING] else "",
                "tcp_cwnd_causes": ";".join(f"{name}:{100 * s / sum(self.window_by_cause):.1f}" for name, s in
                                            zip(WINDOW_CAUSES, self.window_by_cause)) if sum(self.window_by_cause)
                else "",
                "tcp_cwnd_rtt_inflation": round(self.inflation_s / sum(self.window_by_cause), 2)
                if sum(self.window_by_cause) else "",
                "tcp_rwnd_limited_pct": pct(self.rwnd_limited_us, self.busy_us),
                "tcp_sndbuf_limited_pct": pct(self.sndbuf_limited_us, self.busy_us),
                "tcp_retrans_pct": pct(self.retrans_bytes, self.sent_bytes)}


def saturated(carried: float, rate_bps: float, seconds: float) -> bool:
    """Whether a link direction that carried `carried` payload bytes in `seconds` ran at its rate."""
    return carried >= SENT_SHARE * rate_bps / 8 * seconds * PAYLOAD_SHARE - MAX_PACKET


def analyse(intervals: Sequence[Interval], hosts: int, rate_bps: float, start: float, end: float) -> SocketStats:
    """The intervals within [start, end] of a cluster of `hosts` whose link directions run at `rate_bps`."""
    backlogged, unsaturated, by_limit = [0.0] * hosts, [0.0] * hosts, [0.0] * len(LIMITS)
    bw_share_s = inflation_s = 0.0
    by_cause = [0.0] * len(WINDOW_CAUSES)
    line = rate_bps / 8 * PAYLOAD_SHARE
    counted = flows = busy = rwnd = sndbuf = sent = retrans = 0
    covered = 0.0
    for iv in intervals:
        dt = iv.end - iv.start
        if iv.start < start or iv.end > end or dt <= 0:
            continue
        counted += 1
        covered += dt
        flows = max(flows, iv.flows)
        busy, rwnd, sndbuf = busy + iv.busy_us, rwnd + iv.rwnd_limited_us, sndbuf + iv.sndbuf_limited_us
        sent, retrans = sent + sum(iv.egress), retrans + iv.retrans_bytes
        for src_host, dst_host, held_by, cause, inflation in iv.waiting:
            backlogged[src_host] += dt
            if not (saturated(iv.egress[src_host], rate_bps, dt) or saturated(iv.ingress[dst_host], rate_bps, dt)):
                unsaturated[src_host] += dt
                by_limit[held_by] += dt
                if held_by == PACING:
                    bw_share_s += dt * iv.estimates[src_host] / line
                elif cause >= 0:
                    by_cause[cause] += dt
                    inflation_s += dt * inflation
    return SocketStats(flows, counted, covered, sum(backlogged), sum(unsaturated), tuple(backlogged),
                       tuple(unsaturated), tuple(by_limit), bw_share_s, tuple(by_cause), inflation_s, busy, rwnd,
                       sndbuf, sent, retrans)


class SocketMonitor(periodic.PeriodicSampler):
    """Reads every host's TCP sockets on a thread (start ... stop). `namespaces`: the hosts', in host order."""

    def __init__(self, namespaces: Sequence[str], addresses: Sequence[str], interval: float = INTERVAL_S):
        self._host_of = {a: i for i, a in enumerate(addresses)}
        self._last: Sweep | None = None
        self._hosts: list[tcp_diag.NamespaceSockets] = []
        try:
            for ns in namespaces:  # sockets to the cluster's hosts only: the flows that may cross a link
                self._hosts.append(tcp_diag.NamespaceSockets(ns, keep=lambda s: s.dst in self._host_of))
        except tcp_diag.TcpDiagError:
            self._close()
            raise
        self.intervals: list[Interval] = []
        super().__init__(self.sample, interval, "socket-monitor", "the socket monitor")

    def sample(self) -> None:
        readings = tuple({s.key: s for s in reader.read()} for reader in self._hosts)
        now = Sweep(time.time(), readings)
        if self._last is not None:
            self.intervals.append(interval(self._last, now, self._host_of))
        self._last = now

    def stop(self) -> list[Interval]:
        super().stop()
        self._close()
        return self.intervals

    def _close(self) -> None:
        for reader in self._hosts:
            reader.close()
