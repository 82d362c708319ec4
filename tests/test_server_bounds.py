"""Bounds of a live server against raw workers that hold the secret (issue 24): a worker that stops reading is
caught within P3_HEARTBEAT_TIMEOUT, naming it, one that resets its connection mid-broadcast is named disconnected
whichever server thread sees the reset, and a worker that pushes far ahead is held to its share of
P3_SERVER_QUEUE_BYTES while the job still sums correctly.

Raw frames and the handshake come from tests/test_hostile.py and tests/p3auth.py; nodes from tests/harness.py.
"""

from __future__ import annotations

import re
import socket
import struct
import sys
import threading
import time

import numpy as np
import p3auth
import pytest
from harness import HOST, REPORT_SERVER, SECRET, Node, free_port, node_env
from test_hostile import (
    BROADCAST,
    HELLO,
    INIT,
    PUSH,
    authenticated,
    frame,
    next_data,
    register_workers,
    stats,
    wait_listening,
)

pytestmark = pytest.mark.integration

HEARTBEAT_COMMAND = 16


def keep_alive(links: list[socket.socket], stop: threading.Event, every: float) -> threading.Thread:
    """Raw workers' heartbeats to the scheduler (and whatever it sends them, read and dropped)."""
    def run():
        for s in links:
            s.setblocking(False)
        while not stop.is_set():
            for s in links:
                try:
                    s.sendall(frame(HEARTBEAT_COMMAND))
                    while s.recv(65536):
                        pass
                except (BlockingIOError, OSError):
                    pass
            stop.wait(every)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def start_job(nodes, env: dict[str, str]) -> tuple[Node, Node, list[socket.socket], int, int]:
    port = free_port()
    scheduler = Node("scheduler", [sys.executable, "-m", "p3kv.core.scheduler"],
                     node_env("scheduler", port, 2, 1, **env))
    server = Node("server process", [sys.executable, REPORT_SERVER], node_env("server", port, 2, 1, **env))
    nodes += [scheduler, server]
    wait_listening(port, scheduler)
    links = register_workers(port)
    m = server.wait_for(r"^server rank=0 pid=(\d+) port=(\d+)$")
    return scheduler, server, links, int(m.group(1)), int(m.group(2))


def stalled_broadcast(nodes, env: dict[str, str]) -> tuple[Node, Node, list[socket.socket], threading.Event]:
    """Worker 1 registers, says HELLO and inits a 16 MiB key with worker 0, keeps heartbeating, but never reads its
    data connection: the server's broadcast to it makes no progress. Returns the scheduler, the server, the two
    data connections (worker 1's second) and the event that stops the heartbeats."""
    scheduler, server, links, _, server_port = start_job(nodes, env)
    stop = threading.Event()
    keep_alive(links, stop, 0.3)
    data = [authenticated(server_port)]
    stuck = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it takes little before it stops
    stuck.settimeout(20)
    stuck.connect((HOST, server_port))
    p3auth.authenticate(stuck, SECRET)
    data.append(stuck)
    for rank, s in enumerate(data):
        s.sendall(frame(HELLO, sender=rank))
    count = 4 << 20  # 16 MiB of float32: far more than the socket buffers on the way to worker 1
    value = np.ones(count, dtype=np.float32)
    data[1].sendall(frame(INIT, sender=1, key=1, count=count))
    data[0].sendall(frame(INIT, sender=0, key=1, count=count, payload=value.tobytes()))
    command, key, iteration, body = next_data(data[0])  # worker 0 reads its broadcast; worker 1 never reads
    assert (command, key, iteration, len(body)) == (BROADCAST, 1, 0, 4 * count)
    data += links
    return scheduler, server, data, stop


def test_a_worker_that_stops_reading_fails_the_job_within_the_heartbeat_timeout(nodes):
    """The server's broadcast to worker 1 makes no progress (stalled_broadcast), and the server fails within
    P3_HEARTBEAT_TIMEOUT (not P3_TIMEOUT, 600 s), naming worker 1 and its address; every process exits."""
    heartbeat_timeout = 3.0
    env = {"P3_HEARTBEAT_TIMEOUT": str(heartbeat_timeout), "P3_HEARTBEAT_INTERVAL": "0.5",
           "P3_CONNECT_TIMEOUT": "30"}
    scheduler, server, data, stop = stalled_broadcast(nodes, env)
    stuck_port = data[1].getsockname()[1]
    queued = time.monotonic()
    code = server.finish(timeout=heartbeat_timeout + 12)
    took = time.monotonic() - queued
    stop.set()
    assert code == 1, server.output
    assert took < heartbeat_timeout + 10, (took, server.output)
    assert re.search(rf"worker 1 \({HOST}:{stuck_port}\).*did not read in time", server.output), server.output
    assert "P3_HEARTBEAT_TIMEOUT" in server.output, server.output
    assert scheduler.finish() == 1, scheduler.output
    for s in data:
        s.close()
    print(f"\nstalled worker caught after {took:.1f} s (P3_HEARTBEAT_TIMEOUT={heartbeat_timeout:g})")


def test_a_worker_that_resets_its_connection_mid_broadcast_is_named_disconnected_by_either_thread(nodes):
    """Worker 1 resets its data connection (unread bytes, SO_LINGER 0) while the server's broadcast to it is blocked:
    the server's sender and worker 1's receiver both see the reset, and whichever sees it first, the server fails
    at once naming the same event ("worker 1 (host) disconnected without saying goodbye"; the sender used to report
    only a reset while sending, and a test that looks for the disconnect then failed by chance)."""
    env = {"P3_HEARTBEAT_TIMEOUT": "60", "P3_HEARTBEAT_INTERVAL": "0.5", "P3_CONNECT_TIMEOUT": "30"}
    scheduler, server, data, stop = stalled_broadcast(nodes, env)
    time.sleep(0.5)  # the sender fills worker 1's buffers and waits to write
    data[1].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    data[1].close()
    reset = time.monotonic()
    code = server.finish(timeout=15)
    took = time.monotonic() - reset
    stop.set()
    assert code == 1, server.output
    assert took < 10, (took, server.output)  # not the heartbeat timeout (60 s)
    m = re.search(rf"worker 1 \({HOST}\) disconnected without saying goodbye \((.*)\): the worker died",
                  server.output)
    assert m, server.output
    assert scheduler.finish() == 1, scheduler.output
    for s in data[:1] + data[2:]:
        s.close()
    print(f"\nreset seen by the {'sender' if 'sending BROADCAST' in m.group(1) else 'receiver'}: {m.group(1)}")


def test_pushes_far_ahead_are_held_within_the_workers_share_and_the_job_sums_correctly(nodes):
    """Worker 0 pushes iterations 1..16 of a 1 MiB slice at once while worker 1 has pushed nothing: iterations
    2..16 can only be held. The server holds at most about its share of P3_SERVER_QUEUE_BYTES (1 MiB of 2 MiB)
    for it, the rest waits in the socket (before: all 15 MiB held); then worker 1 catches up iteration by
    iteration and every broadcast holds the correct sum."""
    env = {"P3_HEARTBEAT_TIMEOUT": "60", "P3_CONNECT_TIMEOUT": "30", "P3_SERVER_QUEUE_BYTES": str(2 << 20)}
    scheduler, server, links, pid, server_port = start_job(nodes, env)
    data = [authenticated(server_port) for _ in range(2)]
    for rank, s in enumerate(data):
        s.sendall(frame(HELLO, sender=rank))
    count, iterations = 1 << 18, 16  # 1 MiB of float32 per push
    data[0].sendall(frame(INIT, sender=0, key=1, count=count, payload=np.zeros(count, np.float32).tobytes()))
    data[1].sendall(frame(INIT, sender=1, key=1, count=count))
    for s in data:
        assert next_data(s)[:3] == (BROADCAST, 1, 0)
    base = stats(pid)
    got0: list[tuple[int, int, int, bytes]] = []
    reader = threading.Thread(target=lambda: got0.extend(next_data(data[0]) for _ in range(iterations)), daemon=True)
    reader.start()
    ones = np.ones(count, np.float32).tobytes()
    pusher = threading.Thread(target=lambda: [data[0].sendall(frame(PUSH, sender=0, key=1, count=count, iteration=i,
                                                                     payload=ones))
                                              for i in range(1, iterations + 1)], daemon=True)
    pusher.start()
    time.sleep(3)
    ahead = stats(pid)
    grown = (ahead["rss_kib"] - base["rss_kib"]) // 1024
    assert grown < 8, f"the server grew by {grown} MiB holding worker 0's pushes ahead (bound: 2 MiB)"
    twos = np.full(count, 2, np.float32).tobytes()
    for i in range(1, iterations + 1):
        data[1].sendall(frame(PUSH, sender=1, key=1, count=count, iteration=i, payload=twos))
        command, key, iteration, body = next_data(data[1])
        assert (command, key, iteration) == (BROADCAST, 1, i), (command, key, iteration, body[:200])
        assert np.all(np.frombuffer(body, np.float32) == 3), i
    pusher.join(20)
    reader.join(20)
    assert [g[2] for g in got0] == list(range(1, iterations + 1))
    assert all(np.all(np.frombuffer(g[3], np.float32) == 3) for g in got0)
    for s in data + links:
        s.close()
    assert server.finish() == 1  # its workers vanished without saying goodbye
    assert scheduler.finish() == 1
    print(f"\nworker 0 pushing {iterations - 1} MiB ahead: server RSS +{grown} MiB (P3_SERVER_QUEUE_BYTES=2 MiB)")
