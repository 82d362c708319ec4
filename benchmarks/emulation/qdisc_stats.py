"""The root qdisc's counters of chosen interfaces, read through rtnetlink: bytes sent and bytes queued (backlog).

The link monitor (link_monitor.py) reads every emulated link's token bucket every few milliseconds. Running
`tc -s qdisc show` that often would fork two processes per namespace per sample; one netlink socket per network
namespace, opened once (netlink.py), answers an RTM_GETQDISC dump in microseconds.

The messages (linux/rtnetlink.h, linux/pkt_sched.h, linux/gen_stats.h): a dump request is an nlmsghdr and a
tcmsg; each answer is RTM_NEWQDISC with a tcmsg (ifindex, handle, parent) and attributes: TCA_KIND, and
TCA_STATS2 nesting TCA_STATS_BASIC (u64 bytes, u32 packets) and TCA_STATS_QUEUE (u32 qlen, backlog, drops,
requeues, overlimits). The kernel also fills the older TCA_STATS (struct tc_stats), read where TCA_STATS2 is
absent.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
from collections.abc import Sequence

from benchmarks.emulation import netlink
from benchmarks.emulation.netlink import NLM_F_DUMP, NLM_F_REQUEST, NLMSGHDR

NETLINK_ROUTE = 0
RTM_NEWQDISC, RTM_GETQDISC = 36, 38
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND, TCA_STATS, TCA_STATS2 = 1, 3, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
_TCMSG = struct.Struct("=BxxxiIII")
_RTATTR = struct.Struct("=HH")


class QdiscError(OSError):
    """A namespace or an interface cannot be read (named in the message)."""


@dataclasses.dataclass(frozen=True)
class QdiscStats:
    """One root qdisc's counters at one moment."""

    kind: str
    bytes: int  # sent (dequeued to the device) since the qdisc was created
    packets: int
    backlog: int  # bytes queued in it now
    qlen: int  # packets queued in it now
    drops: int


def attributes(data: bytes) -> dict[int, bytes]:
    """{type: payload} of a run of rtattrs (the nested flag bits masked off; the last of a type wins)."""
    found, offset = {}, 0
    while offset + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size:
            break
        found[kind & 0x3FFF] = data[offset + _RTATTR.size:offset + length]
        offset += netlink.align(length)
    return found


def request(seq: int = 1) -> bytes:
    """An RTM_GETQDISC dump request of every qdisc in the namespace."""
    body = _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def parse_qdisc(payload: bytes) -> tuple[int, int, QdiscStats] | None:
    """(ifindex, parent, stats) of one RTM_NEWQDISC message's payload (after its nlmsghdr), or None when it
    carries no statistics."""
    if len(payload) < _TCMSG.size:
        return None
    _, ifindex, _, parent, _ = _TCMSG.unpack_from(payload)
    attrs = attributes(payload[_TCMSG.size:])
    kind = attrs.get(TCA_KIND, b"").rstrip(b"\0").decode(errors="replace")
    nested = attributes(attrs[TCA_STATS2]) if TCA_STATS2 in attrs else {}
    if TCA_STATS_BASIC in nested and TCA_STATS_QUEUE in nested:
        sent, packets = struct.unpack_from("=QI", nested[TCA_STATS_BASIC])
        qlen, backlog, drops, _, _ = struct.unpack_from("=IIIII", nested[TCA_STATS_QUEUE])
    elif TCA_STATS in attrs:  # struct tc_stats: bytes, packets, drops, overlimits, bps, pps, qlen, backlog
        sent, packets, drops, _, _, _, qlen, backlog = struct.unpack_from("=QIIIIIII", attrs[TCA_STATS])
    else:
        return None
    return ifindex, parent, QdiscStats(kind, sent, packets, backlog, qlen, drops)


def parse_messages(data: bytes, seq: int) -> tuple[list[tuple[int, int, QdiscStats]], bool]:
    """The qdiscs in one recv()'s worth of netlink messages answering `seq`, and whether the dump is done.
    Raises QdiscError for an NLMSG_ERROR."""
    payloads, done = netlink.dump_answers(data, seq, RTM_NEWQDISC,
                                          lambda code: QdiscError(code, f"RTM_GETQDISC failed: {os.strerror(code)}"))
    return [p for p in map(parse_qdisc, payloads) if p is not None], done


class NamespaceQdiscs:
    """The root qdiscs of `devices` in network namespace `netns` (None: this process's), read on demand."""

    def __init__(self, netns: str | None, devices: Sequence[str], timeout: float = 1.0):
        self.netns, self.devices = netns, list(devices)
        self._seq = 0
        try:
            self._sock, index = netlink.open_in(
                netns, socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE, timeout,
                inside=lambda: {socket.if_nametoindex(d): d for d in devices})
        except OSError as e:
            raise QdiscError(f"reading the qdiscs of {', '.join(devices)} in {netns or 'this namespace'}: {e}") from e
        self._index: dict[int, str] = index

    def read(self) -> dict[str, QdiscStats]:
        """{device: its root qdisc's counters} now (a device without a root qdisc that keeps statistics, e.g.
        uncapped, is absent)."""
        self._seq += 1
        self._sock.send(request(self._seq))
        found: dict[str, QdiscStats] = {}
        done = False
        while not done:
            try:
                data = self._sock.recv(65536)
            except socket.timeout as e:
                raise QdiscError(f"no answer to RTM_GETQDISC in {self.netns or 'this namespace'}") from e
            qdiscs, done = parse_messages(data, self._seq)
            for ifindex, parent, stats in qdiscs:
                if parent == TC_H_ROOT and ifindex in self._index:
                    found[self._index[ifindex]] = stats
        return found

    def close(self) -> None:
        self._sock.close()
