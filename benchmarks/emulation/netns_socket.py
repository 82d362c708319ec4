"""A socket opened inside another network namespace, for the monitors that read a namespace's kernel state
through netlink (qdisc_stats.py: the link queues; tcp_diag.py: the TCP sockets).

A netlink socket belongs to the network namespace its creating thread was in, and stays there after that thread
is gone. So `open_in` creates the socket on a short-lived thread that first enters the namespace (setns(2) acts on
the calling thread only; Python 3.11's os has no setns, hence ctypes) and returns it to the caller: the caller's
own thread never changes namespace, so nothing has to be undone.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000

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
