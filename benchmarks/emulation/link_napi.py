"""Receive processing of the emulated links on threads of their own (threaded NAPI), so that it is charged to the
host that receives, as on a real cluster, and never runs in an interrupt beside the virtual GPU's timer.

By default a veth hands each packet to the receiving side in softirq context: on whatever CPU sent it, charged to
whichever process happened to run (or to nobody), with preemption off for up to net.core.netdev_budget packets per
round. On this machine a round of 300 64-KiB GSO packets of TCP receive work takes milliseconds, and the virtual
GPU's real-time timer waits behind it: at 4 hosts its completions ran 1-5 ms late, failing the fidelity monitor.
With GRO on, a veth receives through a NAPI instance of its own; with `threaded` set, that instance polls on a
kernel thread (napi/<dev>-<id>), an ordinary thread that a real-time timer preempts and that a cgroup can hold.

Only the hosts' side receives this way (eth0 in host i's namespace, its thread put into host i's CPU group by the
cluster): the host pays for its own TCP receive work within its quota. A veth uses its peer's NAPI for TCP only
when the sending end has TSO off (no_tso), so the switch's ports (the bridge side) send without TSO; what the
switch itself receives (bridging, a few µs per packet) stays in softirq: the switch is not a host.

Two kernel interfaces: the ETHTOOL_SGRO ioctl (this machine has no ethtool binary) and
/sys/class/net/<dev>/threaded, both inside the device's namespace: this file is run as a script (standard library
only) with `ip netns exec`: `python link_napi.py receive|no-tso DEV...`.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import pathlib
import socket
import struct
import sys
from collections.abc import Sequence

_SIOCETHTOOL = 0x8946
_ETHTOOL_STSO = 0x1F
_ETHTOOL_GGRO = 0x2B
_ETHTOOL_SGRO = 0x2C


def _ethtool_value(dev: str, cmd: int, value: int = 0) -> int:
    """One ethtool_value command ({u32 cmd; u32 data}) on `dev` in this process's namespace; returns data."""
    data = ctypes.create_string_buffer(struct.pack("II", cmd, value))
    ifreq = struct.pack("16sP", dev.encode(), ctypes.addressof(data))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, _SIOCETHTOOL, ifreq)
    return struct.unpack("II", data.raw[:8])[1]


def enable(dev: str, sys_net: pathlib.Path = pathlib.Path("/sys/class/net")) -> None:
    """GRO on (a veth then receives through NAPI) and NAPI threaded, for `dev` in this namespace. Raises OSError
    where the kernel refuses either."""
    _ethtool_value(dev, _ETHTOOL_SGRO, 1)
    if not _ethtool_value(dev, _ETHTOOL_GGRO):
        raise OSError(f"{dev}: GRO stayed off")
    (sys_net / dev / "threaded").write_text("1")


def no_tso(dev: str) -> None:
    """TSO off for `dev` in this namespace. A veth hands a TCP packet to its peer's NAPI only when the sending
    device has no TSO (the kernel's veth_skb_is_eligible_for_gro): else the packet goes the softirq way whatever
    the receiver's settings. The large packets are then cut into MSS-sized segments when they leave the sending
    device (software GSO, a few µs per 64 KiB), and the receiver's GRO joins them again."""
    _ethtool_value(dev, _ETHTOOL_STSO, 0)


def napi_threads(dev: str, proc: pathlib.Path = pathlib.Path("/proc")) -> set[int]:
    """Pids of the kernel threads polling NAPI instances of devices named `dev` (in any namespace: the names do
    not say which)."""
    found = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        # comm is cut to 15 characters: "napi/eth0-8193" fits; match the device's prefix only
        if name.startswith(f"napi/{dev}-"[:15]):
            found.add(int(entry.name))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    actions = {"receive": enable, "no-tso": no_tso}
    if len(args) < 2 or args[0] not in actions:
        os.write(2, b"usage: python link_napi.py receive|no-tso DEV... (inside the devices' namespace)\n")
        return 2
    for dev in args[1:]:
        try:
            actions[args[0]](dev)
        except OSError as e:
            os.write(2, f"link_napi: {args[0]} {dev}: {e}\n".encode())
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
