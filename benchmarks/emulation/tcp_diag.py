"""Every established TCP socket of a network namespace with its kernel counters (struct tcp_info), read through
the sock_diag netlink interface: what `ss -ti` prints, without forking `ss` and `ip netns exec` per sample.

The socket monitor (socket_monitor.py) reads every emulated host's sockets every few tens of milliseconds through
one NETLINK_SOCK_DIAG socket per namespace, opened once (netlink.py). A dump walks the kernel's whole table of
established sockets, which namespaces share unless made otherwise (net.ipv4.tcp_child_ehash_entries): about 1.2 ms
of CPU per dump on this machine however few sockets a namespace has. So a reader dumps only to discover sockets
(every `rediscover_s`), and in between asks for each socket it knows by its full id (addresses, ports and the
kernel's cookie, which a later socket on the same ports does not share): one hash lookup each, all of a
namespace's requests in one send.

The messages (linux/sock_diag.h, linux/inet_diag.h, linux/tcp.h): a request is an nlmsghdr (SOCK_DIAG_BY_FAMILY, a
dump) and a struct inet_diag_req_v2 (family, IPPROTO_TCP, the extensions wanted as bits 1 << (attr - 1), the states
as bits 1 << state, a zeroed socket id); each answer is an inet_diag_msg (the socket id: ports big-endian, addresses
as four 32-bit words; then expires, rqueue, wqueue, uid, inode) followed by attributes, of which INET_DIAG_INFO
carries struct tcp_info. A BBR socket also answers with INET_DIAG_BBRINFO (struct tcp_bbr_info: its bandwidth
estimate in bytes/s as two 32-bit halves, its min RTT in µs, its pacing and cwnd gains in units of 1/256) when asked
for INET_DIAG_VEGASINFO: the extension bits are one byte, so BBR's attribute (16) cannot be asked for by its own
bit, and tcp_bbr.c answers either (as `ss -ti` asks). The tcp_info offsets read here have been stable since Linux
4.19 (the chrono times since 4.10, bytes_sent and bytes_retrans since 4.19); they were checked against `ss -ti` on
this machine's kernel (tests/test_socket_monitor.py compares with getsockopt(TCP_INFO) of a live socket). AF_INET6
is dumped as well: a socket opened as IPv6 and connected to an IPv4 address (v4-mapped) is an AF_INET6 socket, and
some libraries open those.
"""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Callable

from benchmarks.emulation import netlink
from benchmarks.emulation.netlink import (
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    NLMSGHDR,
    error_code,
    messages,
)

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
INET_DIAG_INFO = 2
INET_DIAG_VEGASINFO = 3  # the bit that asks a BBR socket for INET_DIAG_BBRINFO (see the module's docstring)
INET_DIAG_BBRINFO = 16
BBR_UNIT = 256  # tcp_bbr.c's gains are fixed point: 256 is a gain of 1
TCP_ESTABLISHED = 1
_REQ = struct.Struct("=BBBxI48s")  # inet_diag_req_v2: family, protocol, ext, pad, states, the socket id
_MSG = struct.Struct("=BBBB2s2s16s16sIQIIIII")  # inet_diag_msg: ..., sport, dport, src, dst, if, cookie, ...
_RTATTR = struct.Struct("=HH")
_BBR_INFO = struct.Struct("=IIIII")  # struct tcp_bbr_info: bw_lo, bw_hi, min_rtt (µs), pacing_gain, cwnd_gain
# struct tcp_info: (name, offset, format); see the module's docstring.
_FIELDS = (("snd_mss", 16, "I"), ("unacked", 24, "I"), ("rtt_us", 68, "I"), ("snd_cwnd", 80, "I"),
           ("pacing_rate", 104, "Q"), ("notsent_bytes", 144, "I"), ("delivery_rate", 160, "Q"),
           ("busy_us", 168, "Q"), ("rwnd_limited_us", 176, "Q"), ("sndbuf_limited_us", 184, "Q"),
           ("bytes_sent", 200, "Q"), ("bytes_retrans", 208, "Q"))
TCP_INFO_MIN = 216  # bytes: the last field read ends here


class TcpDiagError(OSError):
    """A namespace's sockets cannot be read (named in the message)."""


@dataclasses.dataclass(frozen=True)
class TcpSocket:
    """One established socket at one moment: its sending direction src:sport -> dst:dport and its counters
    (bytes/s for the rates, µs for the times, bytes otherwise; unacked and snd_cwnd in segments)."""

    src: str
    sport: int
    dst: str
    dport: int
    wqueue: int  # bytes written and not yet acknowledged (ss's Send-Q)
    snd_mss: int
    unacked: int
    rtt_us: int
    snd_cwnd: int
    pacing_rate: int
    notsent_bytes: int  # written, not yet sent once
    delivery_rate: int
    busy_us: int  # time with data to send (tcp's chrono: includes the two below)
    rwnd_limited_us: int  # ... of which the receiver's window held it
    sndbuf_limited_us: int  # ... of which the application waited for room in the send buffer
    bytes_sent: int  # payload sent, retransmissions included
    bytes_retrans: int
    # BBR's state (0 for a socket under another congestion control): its bandwidth estimate (bytes/s; its pacing
    # rate is this times the pacing gain), its min RTT and its gains (1.0 cruising; 1.25 probing up and 0.75 draining in
    # PROBE_BW's cycle, 2.89 in STARTUP, 0.35 in DRAIN).
    bbr_bw: int = 0
    bbr_min_rtt_us: int = 0  # the least RTT BBR saw in its window (about 10 s): its window is gain x bw x this
    bbr_pacing_gain: float = 0.0
    bbr_cwnd_gain: float = 0.0
    family: int = dataclasses.field(default=socket.AF_INET, repr=False, compare=False)
    sockid: bytes = dataclasses.field(default=b"", repr=False, compare=False)  # inet_diag_sockid, as the kernel gave it

    @property
    def key(self) -> tuple[str, int, str, int]:
        return self.src, self.sport, self.dst, self.dport


def request(family: int, seq: int, sockid: bytes | None = None) -> bytes:
    """A request for every established TCP socket of `family` (a dump), or for the one socket `sockid` names, with
    its tcp_info."""
    ext = 1 << (INET_DIAG_INFO - 1) | 1 << (INET_DIAG_VEGASINFO - 1)
    body = _REQ.pack(family, socket.IPPROTO_TCP, ext, 1 << TCP_ESTABLISHED, sockid or b"")
    flags = NLM_F_REQUEST if sockid else NLM_F_REQUEST | NLM_F_DUMP
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, flags, seq, 0) + body


def address(family: int, raw: bytes) -> str:
    """An inet_diag address as text; a v4-mapped IPv6 address as its IPv4 one."""
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    ip = ipaddress.IPv6Address(raw)
    return str(ip.ipv4_mapped) if ip.ipv4_mapped else str(ip)


def parse_socket(payload: bytes) -> TcpSocket | None:
    """One SOCK_DIAG_BY_FAMILY answer's payload (after its nlmsghdr), or None without a (long enough) tcp_info."""
    if len(payload) < _MSG.size:
        return None
    family, _, _, _, sport, dport, src, dst, _, _, _, _, wqueue, _, _ = _MSG.unpack_from(payload)
    sockid = payload[4:52]
    offset, info, bbr = _MSG.size, None, {}
    while offset + _RTATTR.size <= len(payload):
        length, kind = _RTATTR.unpack_from(payload, offset)
        if length < _RTATTR.size:
            break
        body = payload[offset + _RTATTR.size:offset + length]
        if kind & 0x3FFF == INET_DIAG_INFO:
            info = body
        elif kind & 0x3FFF == INET_DIAG_BBRINFO and len(body) >= _BBR_INFO.size:
            bw_lo, bw_hi, min_rtt, pacing_gain, cwnd_gain = _BBR_INFO.unpack_from(body)
            bbr = {"bbr_bw": bw_hi << 32 | bw_lo, "bbr_min_rtt_us": min_rtt, "bbr_pacing_gain": pacing_gain / BBR_UNIT,
                   "bbr_cwnd_gain": cwnd_gain / BBR_UNIT}
        offset += netlink.align(length)
    if info is None or len(info) < TCP_INFO_MIN:
        return None
    values = {name: struct.unpack_from("=" + fmt, info, at)[0] for name, at, fmt in _FIELDS} | bbr
    return TcpSocket(address(family, src), int.from_bytes(sport, "big"), address(family, dst),
                     int.from_bytes(dport, "big"), wqueue, **values, family=family, sockid=sockid)


def parse_messages(data: bytes, seq: int) -> tuple[list[TcpSocket], bool]:
    """The sockets in one recv()'s worth of messages answering `seq`, and whether the dump is done. Raises
    TcpDiagError for an NLMSG_ERROR."""
    def error(code: int) -> TcpDiagError:
        return TcpDiagError(code, f"SOCK_DIAG_BY_FAMILY failed: {os.strerror(code)}")

    payloads, done = netlink.dump_answers(data, seq, SOCK_DIAG_BY_FAMILY, error)
    return [p for p in map(parse_socket, payloads) if p is not None], done


class NamespaceSockets:
    """The established TCP sockets of network namespace `netns` (None: this process's) that `keep` accepts (None:
    all), read on demand: a dump every `rediscover_s` seconds, the known sockets by their ids in between."""

    def __init__(self, netns: str | None, timeout: float = 1.0, keep: Callable[[TcpSocket], bool] | None = None,
                 rediscover_s: float = 1.0):
        self.netns = netns
        self._keep = keep or (lambda s: True)
        self.rediscover_s = rediscover_s
        self._known: list[TcpSocket] = []
        self._next_dump = 0.0
        self._seq = 0
        try:
            self._sock, _ = netlink.open_in(netns, socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG,
                                                 timeout)
        except OSError as e:
            raise TcpDiagError(f"reading the TCP sockets of {netns or 'this namespace'}: {e}") from e

    def read(self) -> list[TcpSocket]:
        """The sockets now: a dump when it is time to discover new ones, else the known ones that still exist."""
        now = time.monotonic()
        if now >= self._next_dump:
            self._known = [s for s in self.dump() if self._keep(s)]
            self._next_dump = now + self.rediscover_s
        else:
            self._known = self.lookup(self._known)
        return list(self._known)

    def _recv(self) -> bytes:
        try:
            return self._sock.recv(1 << 17)
        except socket.timeout as e:
            raise TcpDiagError(f"no answer to SOCK_DIAG_BY_FAMILY in {self.netns or 'this namespace'}") from e

    def lookup(self, sockets: list[TcpSocket]) -> list[TcpSocket]:
        """`sockets` read again by their ids, in one send; those closed since (ENOENT) are left out."""
        if not sockets:
            return []
        pending = {}
        for s in sockets:
            self._seq += 1
            pending[self._seq] = s
        self._sock.send(b"".join(request(s.family, seq, s.sockid) for seq, s in pending.items()))
        found = []
        while pending:
            for kind, seq, payload in messages(self._recv()):
                if seq not in pending:
                    continue  # an answer to an earlier request that timed out
                del pending[seq]
                if kind == SOCK_DIAG_BY_FAMILY:
                    parsed = parse_socket(payload)
                    if parsed is not None:
                        found.append(parsed)
                elif kind == NLMSG_ERROR and error_code(payload) not in (0, errno.ENOENT):
                    code = error_code(payload)
                    raise TcpDiagError(code, f"SOCK_DIAG_BY_FAMILY failed: {os.strerror(code)}")
        return found

    def dump(self) -> list[TcpSocket]:
        """Every established socket of the namespace (both families)."""
        found: list[TcpSocket] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            self._seq += 1
            self._sock.send(request(family, self._seq))
            done = False
            while not done:
                sockets, done = parse_messages(self._recv(), self._seq)
                found.extend(sockets)
        return found

    def close(self) -> None:
        self._sock.close()
