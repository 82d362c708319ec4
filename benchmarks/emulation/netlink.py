"""Netlink for the monitors that read a namespace's kernel state (qdisc_stats.py: the link queues; tcp_diag.py: the
TCP sockets): a socket opened inside another network namespace, and the framing of the messages it answers with
(linux/netlink.h: each message an nlmsghdr of length, type, flags, sequence and port, padded to 4 bytes).

A netlink socket belongs to the network namespace its creating thread was in, and stays there after that thread
is gone. So `open_in` creates the socket on a short-lived thread that first enters the namespace (setns(2) acts on
the calling thread only; Python 3.11's os has no setns, hence ctypes) and returns it to the caller: the caller's
own thread never changes namespace, so nothing has to be undone.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator

CLONE_NEWNET = 0x40000000
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSGHDR = struct.Struct("=IHHII")

_libc = ctypes.CDLL(None, use_errno=True)


def enter(netns: str) -> None:
    """Moves the calling thread into network namespace `netns` (a name under /run/netns, as `ip netns` makes)."""
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot enter network namespace {netns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def open_in(netns: str | None, family: int, kind: int, protocol: int, timeout: float,
            inside=None) -> tuple[socket.socket, object]:
    """(a socket of `family`/`kind`/`protocol` in `netns` (None: this thread's namespace) with `timeout`, what
    `inside()` returned when called in that namespace (None without one): e.g. interface indexes, which only mean
    something there). Raises OSError, the socket closed."""
    box: dict = {}

    def make() -> None:
        try:
            if netns is not None:
                enter(netns)
            sock = socket.socket(family, kind, protocol)
            box["sock"] = sock
            sock.settimeout(timeout)
            box["inside"] = inside() if inside is not None else None
        except OSError as e:
            box["error"] = e

    thread = threading.Thread(target=make, name=f"netns {netns}")  # ends in the namespace: nothing to undo
    thread.start()
    thread.join()
    if "error" in box:
        if "sock" in box:
            box["sock"].close()
        raise box["error"]
    return box["sock"], box["inside"]


def align(n: int) -> int:
    return (n + 3) & ~3


def messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(type, sequence, payload) of each netlink message in one recv()'s worth."""
    offset = 0
    while offset + NLMSGHDR.size <= len(data):
        length, kind, _, seq, _ = NLMSGHDR.unpack_from(data, offset)
        if length < NLMSGHDR.size:
            break
        yield kind, seq, data[offset + NLMSGHDR.size:offset + length]
        offset += align(length)


def error_code(payload: bytes) -> int:
    """An NLMSG_ERROR's errno (0: an acknowledgement)."""
    return -struct.unpack_from("=i", payload)[0] if len(payload) >= 4 else 0


def dump_answers(data: bytes, seq: int, kind: int, error: Callable[[int], Exception]) -> tuple[list[bytes], bool]:
    """The payloads of the `kind` messages answering dump `seq` in one recv()'s worth (answers to an earlier request
    that timed out are skipped), and whether the dump is done; an NLMSG_ERROR raises error(its errno)."""
    found, done = [], False
    for msg_kind, msg_seq, payload in messages(data):
        if msg_seq != seq:
            continue
        if msg_kind == NLMSG_DONE:
            done = True
        elif msg_kind == NLMSG_ERROR and error_code(payload):
            raise error(error_code(payload))
        elif msg_kind == kind:
            found.append(payload)
    return found, done
