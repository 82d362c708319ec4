"""A worker against a live server that stops reading its data connection (issue 24, item 7; the mirror image of
tests/test_server_bounds.py): a server that stalls without saying so is caught within P3_HEARTBEAT_TIMEOUT, naming
it, and a server that stops reading a worker on purpose (admission control: the worker runs ahead of a straggler
and is over its share of P3_SERVER_QUEUE_BYTES) says so with PAUSE ... RESUME, so the job still completes with
correct sums however long the straggler takes.

The raw server speaks the handshake and frames of tests/p3auth.py and tests/test_hostile.py; nodes come from
tests/harness.py, the worker is tests/scripts/pause_worker.py.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import sys
import threading
import time

import p3auth
import pytest
from harness import HOST, REPORT_SERVER, SCRIPTS, SECRET, Node, free_port, node_env
from test_hostile import BROADCAST, HELLO, INIT, NODE_TABLE, REGISTER, frame, read_frame, wait_listening
from test_server_bounds import HEARTBEAT_COMMAND, keep_alive

pytestmark = pytest.mark.integration

PAUSE_WORKER = os.path.join(SCRIPTS, "pause_worker.py")
SERVER_ROLE = 1  # p3::Role::kServer


class RawServer:
    """Registers with the scheduler as server 0 of a 1-worker job, heartbeats until the node table comes, accepts
    and authenticates the worker's data connection and reads its HELLO; then does only what the test says."""

    def __init__(self, scheduler_port: int):
        self.listener = socket.create_server((HOST, 0))
        # Inherited by the worker's connection: a fixed 64 KiB instead of an autotuned buffer of up to
        # net.ipv4.tcp_rmem's maximum (32 MiB here), which could swallow a whole push before the stall shows.
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        self.listener.settimeout(20)
        self.port = self.listener.getsockname()[1]
        self.scheduler = socket.create_connection((HOST, scheduler_port), timeout=20)
        p3auth.authenticate(self.scheduler, SECRET)
        host = HOST.encode()
        body = struct.pack("<BH", SERVER_ROLE, len(host)) + host + struct.pack("<HII", self.port, 1, 1)
        self.scheduler.sendall(frame(REGISTER, payload=body))
        self.worker: socket.socket | None = None

    def join(self) -> None:
        # The scheduler expects heartbeats from a registered node while the worker is still starting.
        self.scheduler.settimeout(0.3)
        while True:
            self.scheduler.sendall(frame(HEARTBEAT_COMMAND))
            try:
                command, _, _, _ = read_frame(self.scheduler)
            except TimeoutError:
                continue
            if command == NODE_TABLE:
                break
        self.scheduler.settimeout(20)
        conn, _ = self.listener.accept()
        conn.settimeout(20)
        a = os.urandom(p3auth.NONCE_BYTES)
        conn.sendall(p3auth.GREETING + bytes([p3auth.VERSION]) + a)
        answer = p3auth.recv_exactly(conn, p3auth.NONCE_BYTES + p3auth.MAC_BYTES)
        conn.sendall(p3auth.mac(SECRET, b"acceptor", a, answer[:p3auth.NONCE_BYTES]))
        assert read_frame(conn)[0] == HELLO
        self.worker = conn

    def serve_inits(self, elements: int) -> None:
        """Answers each INIT slice with a broadcast of its value until the key's `elements` are covered."""
        covered = 0
        while covered < elements:
            head = p3auth.recv_exactly(self.worker, 64)
            fields = struct.unpack("<IHBBiiBBHIQQQQQ", head)
            command, slice_, key, offset, count, payload_bytes = fields[2], fields[9], fields[10], fields[11], \
                fields[12], fields[14]
            value = p3auth.recv_exactly(self.worker, payload_bytes)
            assert command == INIT, fields
            self.worker.sendall(struct.pack("<IHBBiiBBHIQQQQQ", fields[0], fields[1], BROADCAST, 0, 0, 0, 0, 0, 0,
                                            slice_, key, offset, count, 0, len(value)) + value)
            covered += count

    def close(self) -> None:
        for s in (self.worker, self.scheduler, self.listener):
            if s is not None:
                s.close()


def test_a_server_that_stops_reading_fails_the_worker_within_the_heartbeat_timeout(nodes):
    """A raw server 0 registers, heartbeats, accepts the worker and answers its INIT of a 16 MiB key, then never
    reads its data connection again while staying alive: the worker's push makes no progress and, with no PAUSE
    from the server, the worker fails within P3_HEARTBEAT_TIMEOUT (not P3_TIMEOUT, 600 s) naming server 0 and its
    address; the scheduler hears of it and exits too. Before: the worker waited until P3_TIMEOUT."""
    heartbeat_timeout = 3.0
    env = {"P3_HEARTBEAT_TIMEOUT": str(heartbeat_timeout), "P3_HEARTBEAT_INTERVAL": "0.5",
           "P3_CONNECT_TIMEOUT": "30", "P3_SLICE_SIZE": str(1 << 20)}  # 4 slices of 4 MiB
    port = free_port()
    scheduler = Node("scheduler", [sys.executable, "-m", "p3kv.core.scheduler"],
                     node_env("scheduler", port, 1, 1, **env))
    nodes.append(scheduler)
    wait_listening(port, scheduler)
    server = RawServer(port)
    size = 4 << 20  # 16 MiB of float32: far more than the socket buffers on the way to the server
    worker = Node("worker process", [sys.executable, PAUSE_WORKER, "--size", str(size)],
                  node_env("worker", port, 1, 1, **env))
    nodes.append(worker)
    server.join()
    stop = threading.Event()
    keep_alive([server.scheduler], stop, 0.3)
    try:
        server.serve_inits(size)
        worker.wait_for(r"^pushed iteration 1$")
        pushed = time.monotonic()
        code = worker.finish(timeout=heartbeat_timeout + 12)
        took = time.monotonic() - pushed
        assert code == 3, worker.output
        assert took < heartbeat_timeout + 10, (took, worker.output)
        assert re.search(rf"^FAILED .*server 0 at {HOST}:{server.port}.*did not read in time", worker.output,
                         re.MULTILINE), worker.output
        assert "stopped reading for longer than P3_HEARTBEAT_TIMEOUT without pausing" in worker.output, worker.output
        assert scheduler.finish() == 1, scheduler.output
    finally:
        stop.set()
        server.close()
    print(f"\nstalled server caught after {took:.1f} s (P3_HEARTBEAT_TIMEOUT={heartbeat_timeout:g})")


def test_a_server_that_pauses_a_worker_on_purpose_longer_than_the_heartbeat_timeout_completes_the_job(nodes):
    """Worker 0 pushes 3 iterations of an 800 KB key at once; worker 1 sleeps 5 s before each of its pushes, more
    than P3_HEARTBEAT_TIMEOUT (2 s). Worker 0's later iterations can only be held, and with P3_SERVER_QUEUE_BYTES
    at 512 KiB (256 KiB per worker) the server stops reading worker 0 for about 5 s at a time: it says so (PAUSE,
    then RESUME), worker 0 does not count that as a stall, and every process completes with correct sums. Before:
    no PAUSE existed (a plain send timeout on the worker fails this job)."""
    env = {"P3_HEARTBEAT_TIMEOUT": "2", "P3_HEARTBEAT_INTERVAL": "0.5", "P3_CONNECT_TIMEOUT": "30",
           "P3_SERVER_QUEUE_BYTES": str(512 << 10)}
    lag, iterations = 5.0, 3
    port = free_port()
    scheduler = Node("scheduler", [sys.executable, "-m", "p3kv.core.scheduler"],
                     node_env("scheduler", port, 2, 1, **env))
    server = Node("server process", [sys.executable, REPORT_SERVER], node_env("server", port, 2, 1, **env))
    workers = [Node(f"worker process {i}", [sys.executable, PAUSE_WORKER, "--size", "200000", "--iterations",
                                            str(iterations), "--lag", str(lag)], node_env("worker", port, 2, 1, **env))
               for i in range(2)]
    nodes += [scheduler, server, *workers]
    limit = iterations * lag + 60
    for w in workers:
        assert w.finish(timeout=limit) == 0, w.output
    assert server.finish() == 0, server.output
    assert scheduler.finish() == 0, scheduler.output
    done = {}
    for w in workers:
        rank = int(w.wait_for(r"^ready rank=(\d+)").group(1))
        m = w.wait_for(r"^done iterations=(\d+) pause=(\d+) resume=(\d+)$")
        done[rank] = tuple(int(g) for g in m.groups())
        assert [int(n) for n in re.findall(r"^iteration (\d+) ok$", w.output, re.MULTILINE)] == \
            list(range(1, iterations + 1)), w.output
    runner = done[0]
    assert runner[0] == iterations
    assert runner[1] >= 1 and runner[2] == runner[1], f"worker 0 saw {runner[1]} PAUSE and {runner[2]} RESUME"
    print(f"\nworker 0 paused {runner[1]} times by the server while worker 1 lagged {lag:g} s per iteration "
          "(P3_HEARTBEAT_TIMEOUT=2)")
