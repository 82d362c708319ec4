"""What a capped emulated link charges for a byte of payload: measured, to check the bound's header model.

wire_bound.py counts, per byte of payload, the TCP/IP/Ethernet headers of every 1448-byte segment and one pure
ACK per two segments coming back. The token bucket (tbf) meters a GSO packet as its segments, headers included,
so the first term is what tc charges. The second is an assumption about the receiver: on a veth link a
sender's 64 KiB GSO packet arrives whole, and the receiver may ACK it once rather than once per two segments.

This probe moves `--mib` MiB from host 0 to host 1 of a 2-host emulated cluster over one TCP connection, with
the hosts' links capped, and reads what each host's tbf charged (`tc -s qdisc`, bytes as metered):

* forward (host 0's egress): payload + segment headers; the bound's model: payload x (1 + 66/1448);
* reverse (host 1's egress): the ACKs alone; the bound's model: payload / 1448 / 2 x 66 bytes.

    sudo .venv/bin/python benchmarks/link_overhead.py            # 3 repeats of 256 MiB at 2 Gbit
    -> benchmarks/results/link_overhead.csv, link_overhead.md

Needs root and iproute2, like every emulated-cluster run.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

import emulated_cluster
import run_guard
import wire_bound

LOG = logging.getLogger("link_overhead")
HERE = pathlib.Path(__file__).resolve().parent
PORT = 9411
CHUNK = 1 << 20
COLUMNS = ("timestamp", "repeat", "bandwidth", "payload_bytes", "seconds", "forward_metered_bytes",
           "reverse_metered_bytes", "forward_per_payload", "reverse_per_payload", "model_forward_per_payload",
           "model_reverse_per_payload", "git_commit", "git_dirty")


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
    here = os.path.abspath(__file__)
    before = (metered_bytes(cluster, 0), metered_bytes(cluster, 1))
    receiver = cluster.popen(1, [sys.executable, here, "receive", "--address", cluster.address(1),
                                 "--bytes", str(nbytes)], stdout=subprocess.PIPE, text=True)
    try:
        if receiver.stdout.readline().strip() != "listening":
            raise RuntimeError("the receiver did not start")
        start = time.monotonic()
        cluster.run(0, [sys.executable, here, "send", "--address", cluster.address(1), "--bytes", str(nbytes)],
                    check=True, timeout=300)
        seconds = time.monotonic() - start
        if receiver.wait(timeout=60) != 0:
            raise RuntimeError(f"the receiver exited with {receiver.returncode}")
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    after = (metered_bytes(cluster, 0), metered_bytes(cluster, 1))
    return after[0] - before[0], after[1] - before[1], seconds


def model_ratios() -> tuple[float, float]:
    """The bound's charge per byte of payload, forward (data + segment headers) and reverse (ACKs)."""
    segments = 1 / wire_bound.MSS
    return 1 + segments * wire_bound.SEGMENT_OVERHEAD, segments / wire_bound.ACK_EVERY * wire_bound.SEGMENT_OVERHEAD


def summary(rows: list[dict]) -> str:
    forward = statistics.median(float(r["forward_per_payload"]) for r in rows)
    reverse = statistics.median(float(r["reverse_per_payload"]) for r in rows)
    model_f, model_r = model_ratios()
    acks_per_segment = reverse * wire_bound.MSS / wire_bound.SEGMENT_OVERHEAD
    return "\n".join([
        "| direction | metered bytes per payload byte (median of "
        f"{len(rows)}) | the bound's model |", "|---|---|---|",
        f"| forward (data) | {forward:.4f} | {model_f:.4f} |",
        f"| reverse (ACKs only) | {reverse:.4f} | {model_r:.4f} |", "",
        f"{int(rows[0]['payload_bytes']) >> 20} MiB per run over a {rows[0]['bandwidth']} emulated link; the "
        f"receiver sent {acks_per_segment:.3f} pure ACKs per 1448-byte segment (the bound assumes "
        f"{1 / wire_bound.ACK_EVERY:.3f}). Measured by `benchmarks/link_overhead.py`.", ""])


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
    parser.add_argument("--results-dir", type=pathlib.Path, default=HERE / "results")
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
    model_f, model_r = model_ratios()
    rows = []
    with emulated_cluster.EmulatedCluster(2, args.bandwidth) as cluster:
        for repeat in range(args.repeats):
            forward, reverse, seconds = one_run(cluster, nbytes)
            rows.append({"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "repeat": repeat,
                         "bandwidth": args.bandwidth, "payload_bytes": nbytes, "seconds": round(seconds, 3),
                         "forward_metered_bytes": forward, "reverse_metered_bytes": reverse,
                         "forward_per_payload": round(forward / nbytes, 5),
                         "reverse_per_payload": round(reverse / nbytes, 5),
                         "model_forward_per_payload": round(model_f, 5), "model_reverse_per_payload": round(model_r, 5),
                         "git_commit": commit, "git_dirty": dirty})
            LOG.info("repeat %d: forward %.4f, reverse %.4f per payload byte (%.2f s)", repeat,
                     forward / nbytes, reverse / nbytes, seconds)
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
