"""How many payload bytes a TCP socket holds written and not yet acknowledged, on this machine's kernel, through a
link shaped as the emulated cluster shapes one (a tbf with its default queue and burst).

The simulator's senders (benchmarks/sim/engine.py, Sender's socket_bytes) let a process write into a destination's
socket only as far as that socket has room, and TCP frees a byte only once the receiver has it; how much room a
socket has is the kernel's business (it doubles SO_SNDBUF for its bookkeeping, autotunes a socket left alone, and
the congestion control decides how much of it is in flight). So it is measured, not assumed: one bulk flow between
two namespaces over a veth pair, the sender's socket at a given SO_SNDBUF (the receiver's SO_RCVBUF the same, as
p3kv sets both) or left to autotune (0: ZMQ's sockets under MXNet), and `ss -tmi` sampled while the flow runs:
Send-Q is the payload written and not yet acknowledged.

    sudo .venv/bin/python -m benchmarks.emulation.socket_probe            # 32, 128, 512 KiB and autotuned
    sudo .venv/bin/python -m benchmarks.emulation.socket_probe --rate 1100mbit --buffers 131072

Writes benchmarks/results/socket_payload.csv (one row per rate and buffer, with the kernel and the congestion
control it ran under).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import textwrap
import time

from benchmarks.emulation.link_shaping import parse_rate, tbf_args
from benchmarks.paths import RESULTS

LOG = logging.getLogger("socket_probe")
CSV = RESULTS / "socket_payload.csv"
NAMESPACES = ("p3sp_a", "p3sp_b")
ADDRESSES = ("10.98.0.1", "10.98.0.2")
PORT = 5555
FIELDS = ("date", "kernel", "congestion_control", "rate", "so_sndbuf", "send_queue_bytes", "unacked_bytes",
          "notsent_bytes", "payload_per_byte_set", "throughput_mbps", "samples")

_RECEIVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if {buf}: s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, {buf})
s.bind(("{addr}", {port})); s.listen(1); c, _ = s.accept()
while c.recv(1 << 20): pass
"""
_SENDER = """
import socket, time
s = socket.socket()
if {buf}: s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, {buf})
s.connect(("{addr}", {port})); block = b"x" * (1 << 20); start = time.time(); sent = 0
while time.time() - start < {seconds}: sent += s.send(block)
print(sent / (time.time() - start))
"""


def parse_ss(text: str) -> dict[str, int] | None:
    """One connection's `ss -tmi` lines -> {"send_q", "unacked", "notsent"} in bytes (unacked from segments x mss),
    or None where there is no established connection."""
    lines = [line for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        fields = line.split()
        if fields and fields[0] == "ESTAB" and i + 1 < len(lines):
            info = lines[i + 1]
            mss = re.search(r"\bmss:(\d+)", info)
            unacked = re.search(r"\bunacked:(\d+)", info)
            notsent = re.search(r"\bnotsent:(\d+)", info)
            return {"send_q": int(fields[2]),
                    "unacked": int(unacked.group(1)) * int(mss.group(1)) if unacked and mss else 0,
                    "notsent": int(notsent.group(1)) if notsent else 0}
    return None


def _run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def _netns(ns: str, *args: str) -> str:
    return _run("ip", "netns", "exec", ns, *args)


def _teardown() -> None:
    for ns in NAMESPACES:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _build(rate_bps: float) -> None:
    _teardown()
    for ns in NAMESPACES:
        _run("ip", "netns", "add", ns)
    _run("ip", "link", "add", "p3spa", "type", "veth", "peer", "name", "p3spb")
    for ns, dev, addr in zip(NAMESPACES, ("p3spa", "p3spb"), ADDRESSES):
        _run("ip", "link", "set", dev, "netns", ns)
        _netns(ns, "ip", "addr", "add", f"{addr}/24", "dev", dev)
        _netns(ns, "ip", "link", "set", dev, "up")
        _netns(ns, "ip", "link", "set", "lo", "up")
    _netns(NAMESPACES[0], "tc", "qdisc", "add", "dev", "p3spa", "root", *tbf_args(rate_bps))


def probe(rate: str, buffer_bytes: int, seconds: float = 3.0) -> dict:
    """One flow at `rate` with SO_SNDBUF/SO_RCVBUF `buffer_bytes` (0: autotuned): the medians of `ss` sampled in
    the middle of the flow."""
    _build(parse_rate(rate))
    try:
        fmt = {"buf": buffer_bytes, "addr": ADDRESSES[1], "port": PORT, "seconds": seconds}
        sender = receiver = None
        receiver = subprocess.Popen(["ip", "netns", "exec", NAMESPACES[1], sys.executable, "-c",
                                     textwrap.dedent(_RECEIVER.format(**fmt))])
        time.sleep(0.5)
        sender = subprocess.Popen(["ip", "netns", "exec", NAMESPACES[0], sys.executable, "-c",
                                   textwrap.dedent(_SENDER.format(**fmt))], stdout=subprocess.PIPE, text=True)
        time.sleep(seconds / 3)
        samples, deadline = [], time.monotonic() + seconds / 2  # the middle of the flow, never past its end
        while len(samples) < 10 and time.monotonic() < deadline:
            got = parse_ss(_netns(NAMESPACES[0], "ss", "-tmi", "dst", ADDRESSES[1]))
            if got:
                samples.append(got)
            time.sleep(seconds / 30)
        out, _ = sender.communicate(timeout=seconds + 30)
        receiver.wait(timeout=30)
    finally:
        for process in (sender, receiver):
            if process is not None and process.poll() is None:
                process.kill()
        _teardown()
    if not samples or sender.returncode != 0:
        raise RuntimeError(f"no established flow to sample at {rate}, buffer {buffer_bytes} (sender exit "
                           f"{sender.returncode}): is `ss` (iproute2) installed and were the namespaces built?")
    send_q = statistics.median(s["send_q"] for s in samples)
    return {"rate": rate, "so_sndbuf": buffer_bytes, "send_queue_bytes": int(send_q),
            "unacked_bytes": int(statistics.median(s["unacked"] for s in samples)),
            "notsent_bytes": int(statistics.median(s["notsent"] for s in samples)),
            "payload_per_byte_set": round(send_q / buffer_bytes, 3) if buffer_bytes else "",
            "throughput_mbps": round(float(out.strip()) * 8 / 1e6, 1), "samples": len(samples)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", nargs="+", default=["440mbit", "1100mbit"], help="link rates (tc syntax)")
    p.add_argument("--buffers", nargs="+", type=int, default=[32768, 131072, 524288, 0],
                   help="SO_SNDBUF/SO_RCVBUF values in bytes; 0 leaves the socket to autotune")
    p.add_argument("--seconds", type=float, default=3.0, help="how long each flow runs")
    p.add_argument("--csv", default=str(CSV))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if os.geteuid() != 0:
        p.error("builds network namespaces: run as root (sudo .venv/bin/python -m benchmarks.emulation.socket_probe)")
    common = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "kernel": platform.release(),
              "congestion_control": _run("sysctl", "-n", "net.ipv4.tcp_congestion_control").strip()}
    rows = []
    for rate in args.rate:
        for buf in args.buffers:
            row = {**common, **probe(rate, buf, args.seconds)}
            LOG.info("%s, SO_SNDBUF %s: %d bytes written and not acknowledged (%s per byte set), %s Mbit/s", rate,
                     buf or "autotuned", row["send_queue_bytes"], row["payload_per_byte_set"] or "-",
                     row["throughput_mbps"])
            rows.append(row)
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    LOG.info("wrote %s", args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
