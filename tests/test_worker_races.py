"""The worker's core against scripted servers: a real scheduler, a real P3Worker in this process, and two fake
servers speaking the wire protocol from this test, so that a test decides exactly which frame (or which half of
one) arrives when. Covers what a live job cannot order deterministically:

- a server's rejection of an operation while another server's broadcast is still being written into the caller's
  buffer completes the operation only once that write is done (MXNet must never get back a buffer a late slice
  can still land in);
- close() with a timeout returns within it even when a server stopped reading and the sender is stalled on it.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time

import numpy as np
import p3auth
import pytest
from frames import MAGIC, VERSION
from harness import HOST, SECRET, STEP, Node, free_port, node_env

from p3kv.core.errors import P3Error, P3TimeoutError
from p3kv.core.worker import P3Worker

pytestmark = pytest.mark.integration

HEADER = struct.Struct("<IHBBiiBBHIQQQQQ")  # cpp/src/codec.cc, protocol 4 (cpp/include/p3/message.h)
REGISTER, NODE_TABLE, ERROR, HELLO, INIT, PUSH, BROADCAST = 1, 2, 8, 9, 10, 11, 12
SERVER_ROLE = 1
SLICE = 1000  # P3_SLICE_SIZE: a key of 2 * SLICE float32 elements has slice 0 on server 0 and slice 1 on server 1


def frame(command: int, *, sender: int = 0, slice_: int = 0, key: int = 0, offset: int = 0, count: int = 0,
          iteration: int = 0, payload: bytes = b"") -> bytes:
    return HEADER.pack(MAGIC, VERSION, command, 0, 0, sender, 0, 0, 0, slice_, key, offset, count, iteration,
                       len(payload)) + payload


def read_frame(sock: socket.socket) -> tuple[dict, bytes]:
    names = ("magic", "version", "command", "status", "priority", "sender", "dtype", "byte_order", "request", "slice",
             "key", "offset", "count", "iteration", "payload_bytes")
    h = dict(zip(names, HEADER.unpack(p3auth.recv_exactly(sock, HEADER.size)), strict=True))
    return h, p3auth.recv_exactly(sock, h["payload_bytes"]) if h["payload_bytes"] else b""


class FakeServer:
    """Registers with the scheduler as a server, then accepts the one worker's data connection."""

    def __init__(self, scheduler_port: int):
        self.listener = socket.create_server((HOST, 0))
        self.listener.settimeout(STEP)
        self.scheduler = socket.create_connection((HOST, scheduler_port), timeout=STEP)
        p3auth.authenticate(self.scheduler, SECRET)
        host = HOST.encode()
        reg = struct.pack("<BH", SERVER_ROLE, len(host)) + host + struct.pack(
            "<HII", self.listener.getsockname()[1], 1, 2)
        self.scheduler.sendall(frame(REGISTER, payload=reg))
        self.rank = -1
        self.worker: socket.socket | None = None

    def join(self) -> None:
        """Reads the node table (once every node registered), then accepts and authenticates the worker."""
        h, body = read_frame(self.scheduler)
        assert h["command"] == NODE_TABLE, h
        self.rank = struct.unpack_from("<i", body)[0]
        conn, _ = self.listener.accept()
        conn.settimeout(STEP)
        a = os.urandom(p3auth.NONCE_BYTES)
        conn.sendall(p3auth.GREETING + bytes([p3auth.VERSION]) + a)
        answer = p3auth.recv_exactly(conn, p3auth.NONCE_BYTES + p3auth.MAC_BYTES)
        conn.sendall(p3auth.mac(SECRET, b"acceptor", a, answer[:p3auth.NONCE_BYTES]))
        h, _ = read_frame(conn)
        assert h["command"] == HELLO, h
        self.worker = conn

    def serve_init(self) -> dict:
        """Answers the worker's INIT of one slice with a broadcast of its value; the INIT's header."""
        h, value = read_frame(self.worker)
        assert h["command"] == INIT, h
        self.broadcast(h, value, iteration=0)
        return h

    def broadcast(self, h: dict, value: bytes, iteration: int) -> None:
        self.worker.sendall(frame(BROADCAST, sender=self.rank, slice_=h["slice"], key=h["key"], offset=h["offset"],
                                  count=h["count"], iteration=iteration, payload=value))

    def close(self) -> None:
        for s in (self.worker, self.scheduler, self.listener):
            if s is not None:
                s.close()


@pytest.fixture
def job(nodes, monkeypatch):
    """A scheduler (1 worker, 2 servers), two FakeServers by rank, and this process's P3Worker on the first key
    (key 0: 2 * SLICE float32 elements, initialised with zeros)."""
    port = free_port()
    env = node_env("worker", port, workers=1, servers=2, P3_SLICE_SIZE=str(SLICE), P3_HEARTBEAT_TIMEOUT="60",
                   P3_HEARTBEAT_INTERVAL="1")
    scheduler = Node("scheduler", [sys.executable, "-m", "p3kv.core.scheduler"], {**env, "P3_ROLE": "scheduler"})
    nodes.append(scheduler)
    for name, value in env.items():
        if name.startswith("P3_"):
            monkeypatch.setenv(name, value)
    deadline = time.monotonic() + STEP
    servers = []
    while len(servers) < 2:  # the scheduler may not listen yet
        try:
            servers.append(FakeServer(port))
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, scheduler.output
            time.sleep(0.05)
    joined = [threading.Thread(target=s.join, daemon=True) for s in servers]
    for t in joined:
        t.start()
    worker = P3Worker()
    for t in joined:
        t.join(STEP)
    servers.sort(key=lambda s: s.rank)
    assert [s.rank for s in servers] == [0, 1] and all(s.worker for s in servers)
    value = np.zeros(2 * SLICE, np.float32)
    worker.init(0, value)
    inits = [s.serve_init() for s in servers]
    worker.wait(0, timeout=STEP)
    yield worker, servers, inits
    try:
        worker.close(timeout=1)
    except P3Error:
        pass
    for s in servers:
        s.close()


def test_a_rejection_waits_for_a_broadcast_still_landing_in_the_callers_buffer(job):
    worker, servers, inits = job
    grad = np.ones(2 * SLICE, np.float32)
    out = np.zeros(2 * SLICE, np.float32)
    worker.push(0, grad, out=out)
    for s in servers:
        h, _ = read_frame(s.worker)
        assert h["command"] == PUSH and h["iteration"] == 1, h
    # Server 0 starts its broadcast of slice 0 (the worker reads it straight into `out`) and stops half-way...
    head = inits[0]
    value = np.full(SLICE, 7, np.float32).tobytes()
    message = frame(BROADCAST, sender=0, slice_=head["slice"], key=0, offset=head["offset"], count=head["count"],
                    iteration=1, payload=value)
    half = HEADER.size + len(value) // 2
    servers[0].worker.sendall(message[:half])
    # The worker counts a frame when it has read its header; it then goes straight on into the payload, which
    # waits for the rest (the moment's grace covers the step from the one to the other).
    deadline = time.monotonic() + STEP
    while worker.counters()["received"]["BROADCAST"] < 3:  # the 2 inits' and this one
        assert time.monotonic() < deadline, worker.counters()
        time.sleep(0.01)
    time.sleep(0.2)
    # ...while server 1 rejects the same operation.
    why = b"scripted rejection"
    servers[1].worker.sendall(frame(ERROR, sender=1, slice_=inits[1]["slice"], key=0, iteration=1, payload=why))
    # The operation must not complete while slice 0 is still being written into `out`.
    with pytest.raises(P3TimeoutError):
        worker.wait(0, timeout=0.5)
    servers[0].worker.sendall(message[half:])
    with pytest.raises(P3Error, match="scripted rejection"):
        worker.wait(0, timeout=STEP)
    assert (out[:SLICE] == 7).all()  # the slice landed before the operation completed


def test_close_with_a_timeout_returns_when_a_server_stopped_reading(job):
    worker, servers, _ = job
    # Slices far larger than the socket buffers: the sender stalls on server 1, which reads nothing more.
    big = np.ones(1 << 23, np.float32)  # 32 MiB in slices of 1000 elements, half of them for server 1
    worker.init(1, big)
    started = time.monotonic()
    with pytest.raises(P3Error):
        worker.close(timeout=1.0)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0 + 2.0, f"close(timeout=1) returned after {elapsed:.1f} s"
