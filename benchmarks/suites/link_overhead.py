"""What a capped emulated link charges for a byte of payload: measured, for the bound's header model.

wire_bound.py counts, per byte of payload, the TCP/IP/Ethernet headers of every 1448-byte segment and
ACKS_PER_SEGMENT pure ACKs per segment coming back. The token bucket (tbf) meters a GSO packet as its segments,
headers included, so the first term is what tc charges. The second depends on the receiver: on a veth link a
sender's 64 KiB GSO packet arrives whole and is ACKed about once, not once per two segments (delayed ACKs on a
wire of MTU-sized packets), and this probe is where wire_bound.ACKS_PER_SEGMENT comes from.

This probe moves `--mib` MiB from host 0 to host 1 of a 2-host emulated cluster over one TCP connection, with
the hosts' links capped, and reads what each host's tbf charged (`tc -s qdisc`, bytes as metered):

* forward (host 0's egress): payload + segment headers; the bound's model: payload x (1 + 66/1448);
* reverse (host 1's egress): the pure ACKs alone (66 bytes each), counted per 1448-byte forward segment.

    sudo .venv/bin/python -m benchmarks.suites.link_overhead            # 3 repeats of 256 MiB at 2 Gbit
    -> benchmarks/results/link_overhead.csv, link_overhead.md

Needs root and iproute2, like every emulated-cluster run.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import pathlib
import socket
import statistics
import subprocess
import sys
import time

from benchmarks import paths
from benchmarks.emulation import emulated_cluster, run_guard, wire_bound
from benchmarks.paths import RESULTS

LOG = logging.getLogger("link_overhead")
PORT = 9411
CHUNK = 1 << 20
COLUMNS = ("timestamp", "repeat", "bandwidth", "payload_bytes", "seconds", "forward_metered_bytes",
           "reverse_metered_bytes", "forward_per_payload", "acks_per_segment", "git_commit", "git_dirty")
DELAYED_ACKS_PER_SEGMENT = 0.5  # one pure ACK per two MTU-sized segments


def metered_bytes(cluster: emulated_cluster.EmulatedCluster, host: int) -> int:
    """Bytes host's egress tbf has charged so far (tc counts a GSO packet as its segments, headers included)."""
    done = cluster.run(host, ["tc", "-s", "-j", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True,
                       check=True)
    qdiscs = [q for q in json.loads(done.stdout) if q.get("kind") == "tbf"]
    if not qdiscs:
        raise RuntimeError(f"host {host} has no tbf qdisc on eth0: is its link capped?")
    return int(qdiscs[0]["bytes"])


def receive(address: str, nbytes: int) -> int:
    """(runs in host 1) accepts one connection and reads `nbytes`; returns what it read."""
    with socket.create_server((address, PORT)) as server:
        print("listening", flush=True)  # noqa: T201 (the parent waits for this line)
        connection, _ = server.accept()
        got = 0
        with connection:
            while got < nbytes:
                data = connection.recv(CHUNK)
                if not data:
                    break
                got += len(data)
            connection.sendall(b"k")  # the sender waits for this: every byte has been acknowledged by then
    return got


def send(address: str, nbytes: int) -> None:
    """(runs in host 0) sends `nbytes` to host 1 and waits for its one-byte answer."""
    block = bytes(CHUNK)
    with socket.create_connection((address, PORT), timeout=120) as connection:
        left = nbytes
        while left:
            n = min(left, CHUNK)
            connection.sendall(block[:n])
            left -= n
        connection.recv(1)


def one_run(cluster: emulated_cluster.EmulatedCluster, nbytes: int) -> tuple[int, int, float]:
    """(forward metered bytes, reverse metered bytes, seconds) of one transfer of `nbytes`."""
    here = paths.python_module("benchmarks.suites.link_overhead")  # this module's receive and send commands
    before = (metered_bytes(cluster, 0), metered_bytes(cluster, 1))
    receiver = cluster.popen(1, [*here, "receive", "--address", cluster.address(1), "--bytes", str(nbytes)],
                             stdout=subprocess.PIPE, text=True, cwd=paths.ROOT)
    try:
        if receiver.stdout.readline().strip() != "listening":
            raise RuntimeError("the receiver did not start")
        start = time.monotonic()
        cluster.run(0, [*here, "send", "--address", cluster.address(1), "--bytes", str(nbytes)],
                    check=True, timeout=300, cwd=paths.ROOT)
        seconds = time.monotonic() - start
        if receiver.wait(timeout=60) != 0:
            raise RuntimeError(f"the receiver exited with {receiver.returncode}")
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    after = (metered_bytes(cluster, 0), metered_bytes(cluster, 1))
    return after[0] - before[0], after[1] - before[1], seconds


def model_forward() -> float:
    """The bound's forward charge per byte of payload: data + every segment's headers."""
    return 1 + wire_bound.SEGMENT_OVERHEAD / wire_bound.MSS


def acks_per_segment(payload_bytes: int, reverse_bytes: int) -> float:
    """Pure ACKs (66 bytes each) the reverse direction carried per 1448-byte forward segment."""
    return (reverse_bytes / wire_bound.SEGMENT_OVERHEAD) / (payload_bytes / wire_bound.MSS)


def summary(rows: list[dict]) -> str:
    forward = statistics.median(float(r["forward_per_payload"]) for r in rows)
    acks = statistics.median(float(r["acks_per_segment"]) for r in rows)
    bound_share = wire_bound.ACKS_PER_SEGMENT * wire_bound.SEGMENT_OVERHEAD / wire_bound.MSS
    delayed_share = DELAYED_ACKS_PER_SEGMENT * wire_bound.SEGMENT_OVERHEAD / wire_bound.MSS
    return "\n".join([
        f"| quantity (median of {len(rows)}) | measured | the bound (wire_bound.py) | "
        "delayed ACKs, MTU-sized packets |",
        "|---|---|---|---|",
        f"| forward: metered bytes per payload byte | {forward:.4f} | {model_forward():.4f} | {model_forward():.4f} |",
        f"| reverse: pure ACKs per 1448-byte segment | {acks:.4f} | {wire_bound.ACKS_PER_SEGMENT:.4f} | "
        f"{DELAYED_ACKS_PER_SEGMENT:.4f} |",
        f"| reverse: ACK bytes per payload byte | {acks * wire_bound.SEGMENT_OVERHEAD / wire_bound.MSS:.4f} | "
        f"{bound_share:.4f} | {delayed_share:.4f} |", "",
        f"{int(rows[0]['payload_bytes']) >> 20} MiB per run, one TCP connection, over a {rows[0]['bandwidth']} "
        "emulated link; bytes as the token bucket metered them (`tc -s qdisc`). Measured by "
        "`benchmarks/suites/link_overhead.py`.", ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    for name in ("receive", "send"):
        p = sub.add_parser(name, help="(internal) one end of the transfer")
        p.add_argument("--address", required=True)
        p.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--bandwidth", default="2gbit")
    parser.add_argument("--mib", type=int, default=256, help="payload per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--allow-dirty", action="store_true", help="run on an uncommitted tree (recorded)")
    args = parser.parse_args(argv)
    if args.command == "receive":
        return 0 if receive(args.address, args.bytes) == args.bytes else 1
    if args.command == "send":
        send(args.address, args.bytes)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.mib < 1 or args.repeats < 1:
        parser.error("--mib and --repeats must be >= 1")
    reason = emulated_cluster.why_unavailable()
    if reason:
        LOG.error("%s", reason)
        return 2
    tree = run_guard.tree_or_refusal(args.allow_dirty)
    if tree is None:
        return 2
    commit, dirty = tree
    nbytes = args.mib << 20
    rows = []
    with emulated_cluster.EmulatedCluster(2, args.bandwidth) as cluster:
        for repeat in range(args.repeats):
            forward, reverse, seconds = one_run(cluster, nbytes)
            rows.append({"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "repeat": repeat,
                         "bandwidth": args.bandwidth, "payload_bytes": nbytes, "seconds": round(seconds, 3),
                         "forward_metered_bytes": forward, "reverse_metered_bytes": reverse,
                         "forward_per_payload": round(forward / nbytes, 5),
                         "acks_per_segment": round(acks_per_segment(nbytes, reverse), 4),
                         "git_commit": commit, "git_dirty": dirty})
            LOG.info("repeat %d: forward %.4f metered bytes per payload byte, %.4f pure ACKs per segment (%.2f s)",
                     repeat, forward / nbytes, acks_per_segment(nbytes, reverse), seconds)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    with open(args.results_dir / "link_overhead.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    (args.results_dir / "link_overhead.md").write_text(summary(rows))
    LOG.info("wrote %s", args.results_dir / "link_overhead.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
