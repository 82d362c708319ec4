"""The network's own account of a run, per emulated host: packets the link's token buckets dropped and TCP
segments retransmitted.

The byte count says how much crossed a link, not whether the link behaved like a NIC: a tbf qdisc drops what
overflows its 50 ms queue, and TCP answers a drop with a retransmission and a smaller window. Per host we read
the qdisc of both ends of its link (`tc -s qdisc show`: eth0 in the host's namespace is its egress, the bridge
port h<i> its ingress) and the TCP counters of its namespace (/proc/net/snmp, which shows the reading process's
network namespace: read through `ip netns exec`). A run's counters are the difference of a snapshot before and
after it; a qdisc replaced in between (a new link rate) restarts from zero, which `since` allows for.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Sequence

_QDISC = re.compile(r"^qdisc\s+(\S+)\s+(\S+)(?:\s+dev\s+(\S+))?")
_SENT = re.compile(r"Sent\s+(\d+)\s+bytes\s+(\d+)\s+pkt\s+\(dropped\s+(\d+),\s+overlimits\s+(\d+)")
_SEPARATOR = "@@snmp@@"


def parse_qdisc_drops(text: str) -> dict[str, int]:
    """{device: packets dropped by its qdiscs} from `tc -s qdisc show` output (a device without "dev" in the
    line, as `tc -s qdisc show dev X` prints some kinds, counts under "")."""
    drops: dict[str, int] = {}
    device = None
    for line in text.splitlines():
        head = _QDISC.match(line.strip())
        if head:
            device = head.group(3) or ""
            continue
        sent = _SENT.search(line)
        if sent and device is not None:
            drops[device] = drops.get(device, 0) + int(sent.group(3))
            device = None
    return drops


def parse_snmp_tcp(text: str) -> dict[str, int]:
    """The Tcp: counters of /proc/net/snmp (a header line of names, then a line of values)."""
    lines = [line.split() for line in text.splitlines() if line.startswith("Tcp:")]
    if len(lines) < 2:
        return {}
    names, values = lines[0][1:], lines[1][1:]
    return {n: int(v) for n, v in zip(names, values)}


@dataclasses.dataclass(frozen=True)
class HostNet:
    """One host's counters: qdisc drops at its egress (eth0) and ingress (bridge port), TCP segments."""

    egress_drops: int = 0
    ingress_drops: int = 0
    retrans_segs: int = 0
    out_segs: int = 0

    @property
    def drops(self) -> int:
        return self.egress_drops + self.ingress_drops

    def since(self, before: HostNet) -> HostNet:
        """The counts between `before` and this snapshot; a counter that went down was reset (a new qdisc)."""
        def delta(now: int, then: int) -> int:
            return now - then if now >= then else now

        return HostNet(delta(self.egress_drops, before.egress_drops), delta(self.ingress_drops, before.ingress_drops),
                       delta(self.retrans_segs, before.retrans_segs), delta(self.out_segs, before.out_segs))


def host_counters(host_text: str, bridge_drops: dict[str, int], host: int) -> HostNet:
    """A host's counters from its namespace's output (`tc -s qdisc show dev eth0`, the separator, then
    /proc/net/snmp) and the bridge namespace's drops per port."""
    qdisc, _, snmp = host_text.partition(_SEPARATOR)
    egress = sum(parse_qdisc_drops(qdisc).values())
    tcp = parse_snmp_tcp(snmp)
    return HostNet(egress, bridge_drops.get(f"h{host}", 0), tcp.get("RetransSegs", 0), tcp.get("OutSegs", 0))


def snapshot(namespaces: Sequence[str], bridge_ns: str, timeout: float = 20) -> list[HostNet]:
    """Every host's counters now (one `ip netns exec` per host and one in the bridge namespace)."""
    def run(ns: str, script: str) -> str:
        done = subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", script], capture_output=True, text=True,
                              timeout=timeout, check=False)
        return done.stdout

    bridge = parse_qdisc_drops(run(bridge_ns, "tc -s qdisc show"))
    return [host_counters(run(ns, f"tc -s qdisc show dev eth0; echo {_SEPARATOR}; cat /proc/net/snmp"), bridge, i)
            for i, ns in enumerate(namespaces)]


def difference(after: Sequence[HostNet], before: Sequence[HostNet]) -> list[HostNet]:
    return [a.since(b) for a, b in zip(after, before)]
