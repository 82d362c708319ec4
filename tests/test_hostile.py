"""Hostile network (issue 15): floods, slow handshakes and slow frames against a live job on loopback, and peers
that hold the secret but claim memory they never send.

Each test asserts that the job starts and finishes with correct sums (failure_worker.py checks every broadcast
against numpy), and that the attacked process stays within its bounds: threads (/proc/PID/status), descriptors
(/proc/PID/fd) and memory. Every attack loop is bounded in count and time, and targets 127.0.0.1 only. The
measured numbers are printed (pytest -s) for the README's threat model.

Built on the node-by-node helpers of tests/harness.py and the Python handshake of tests/p3auth.py.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import sys
import threading
import time

import numpy as np
import p3auth
import pytest
from frames import LITTLE_ENDIAN, MAGIC, VERSION
from harness import (
    FAILURE_WORKER,
    HOST,
    REPORT_SERVER,
    SECRET,
    Job,
    Node,
    free_port,
    node_env,
)

pytestmark = pytest.mark.integration

HEARTBEAT = {"P3_HEARTBEAT_TIMEOUT": "3", "P3_HEARTBEAT_INTERVAL": "0.5"}  # a stall of 3 s fails the job
REGISTER, NODE_TABLE, ERROR, HELLO, INIT, PUSH, BROADCAST, REQUEST, REPLY = 1, 2, 8, 9, 10, 11, 12, 14, 15
FLOAT32, WORKER_ROLE = 0, 2
HANDSHAKE_DEADLINE = 5.0  # cpp/src/server.cc and scheduler.cc: kHandshakeTimeoutS
FRAME_DEADLINE = 10.0  # cpp/src/scheduler.cc: kFrameTimeoutS
MAX_PENDING = 128  # kMaxHandshakes
FLOOD = 1000  # idle connections per attacked node


def stats(pid: int) -> dict[str, int]:
    """Threads, open descriptors, resident and virtual memory (KiB) of a process."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {"threads": int(fields["Threads"]), "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "rss_kib": int(fields["VmRSS"].split()[0]), "vm_kib": int(fields["VmSize"].split()[0])}


def frame(command: int, *, sender: int = 0, key: int = 0, count: int = 0, iteration: int = 0, request: int = 0,
          payload: bytes = b"", payload_bytes: int | None = None) -> bytes:
    """A frame as cpp/src/codec.cc encodes it (protocol version 5, layout in cpp/include/p3/message.h; a HELLO
    declares little-endian payloads, a REQUEST names its type in `request`)."""
    n = len(payload) if payload_bytes is None else payload_bytes
    byte_order = LITTLE_ENDIAN if command == HELLO else 0
    return struct.pack("<IHBBiiBBHIQQQQQ", MAGIC, VERSION, command, 0, 0, sender, FLOAT32, byte_order, request, 0,
                       key, 0, count, iteration, n) + payload


def read_frame(s: socket.socket) -> tuple[int, int, int, bytes]:
    """(command, key, iteration, payload) of the next frame."""
    head = p3auth.recv_exactly(s, 64)
    fields = struct.unpack("<IHBBiiBBHIQQQQQ", head)
    return fields[2], fields[10], fields[13], p3auth.recv_exactly(s, fields[14])


def authenticated(port: int, source: str = HOST) -> socket.socket:
    s = socket.create_connection((HOST, port), timeout=20, source_address=(source, 0))
    p3auth.authenticate(s, SECRET)
    return s


def open_idle(port: int, n: int, source: str = HOST) -> list[socket.socket]:
    """n connections from `source` (any 127.x address) that never say anything (bounded: n sockets)."""
    conns = []
    for _ in range(n):
        try:
            conns.append(socket.create_connection((HOST, port), timeout=20, source_address=(source, 0)))
        except OSError:
            break  # the backlog is full for now: the flood is as large as it gets
    return conns


def wait_listening(port: int, node: Node, limit: float = 60) -> None:
    """Until `node` listens on `port`. Its Python start-up shares 2 cores with the other nodes' and with a flood, so
    the bound is generous; a node that exits first, or never listens, fails the test with its output."""
    end = time.monotonic() + limit
    while True:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            code = node.proc.poll()
            if code is not None or time.monotonic() > end:
                state = f"exited ({code})" if code is not None else f"did not listen within {limit:g} s"
                raise AssertionError(f"{node.name} {state} on port {port}:\n{node.output}") from None
            time.sleep(0.05)


def closed_within(s: socket.socket, limit: float) -> float | None:
    """Seconds until the peer closed `s` (reading and discarding), or None if it stayed open for `limit` s."""
    start = time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - start < limit:
        try:
            if not s.recv(4096):
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    return None


def trickle(s: socket.socket, data: bytes, every: float, limit: float) -> float | None:
    """Send `data` one byte every `every` s until the peer closes `s`; seconds until then, None after `limit`."""
    start = time.monotonic()
    s.settimeout(every)
    for b in data:
        if time.monotonic() - start > limit:
            return None
        try:
            s.sendall(bytes([b]))
            if not s.recv(4096):
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    return closed_within(s, max(0.0, limit - (time.monotonic() - start)))


def finish_job(job: Job, stop) -> None:
    stop.touch()
    for node in job.workers + job.servers + [job.scheduler]:
        assert node.finish() == 0, f"{node.name}:\n{node.output}"
    for node in job.workers:
        assert "WRONG" not in node.output and "FAILED" not in node.output, node.output
        node.wait_for(r"^done iterations=\d+$")


# ---- without the secret ----

def test_a_flood_during_the_rendezvous_costs_no_threads_and_the_job_still_runs(nodes, tmp_path):
    """Idle connections fill the scheduler's and the servers' doors, and new ones keep coming, while the nodes
    join from the same address: the nodes retry what the flood cost them and the job completes with correct sums;
    no attacked process grows threads, and descriptors stay near the cap on pending handshakes."""
    port = free_port()
    server_ports = [free_port(), free_port()]
    stop = tmp_path / "stop"
    scheduler = Node("scheduler", [sys.executable, "-m", "p3kv.core.scheduler"],
                     node_env("scheduler", port, P3_CONNECT_TIMEOUT="40"))
    nodes.append(scheduler)
    wait_listening(port, scheduler)
    baseline = stats(scheduler.proc.pid)
    flood = open_idle(port, FLOOD)
    stop_churn = threading.Event()
    churned = [0]

    def churn() -> None:
        """Keep opening connections (holding the newest 300) while the job joins: bounded by count and time."""
        held: list[socket.socket] = []
        end = time.monotonic() + 60
        for _ in range(20000):
            if stop_churn.is_set() or time.monotonic() > end:
                break
            try:
                held.append(socket.create_connection((HOST, port), timeout=1))
                churned[0] += 1
            except OSError:
                time.sleep(0.01)
            if len(held) > 300:
                held.pop(0).close()
            time.sleep(0.002)
        for s in held:
            s.close()

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        servers = [Node(f"server process {i}", [sys.executable, REPORT_SERVER],
                        node_env("server", port, P3_PORT=str(server_ports[i]), P3_CONNECT_TIMEOUT="40"))
                   for i in range(2)]
        nodes.extend(servers)
        workers = [Node(f"worker process {i}", [sys.executable, FAILURE_WORKER, "--stop-file", str(stop)],
                        node_env("worker", port, P3_CONNECT_TIMEOUT="40")) for i in range(2)]
        nodes.extend(workers)
        server_flood = []
        for p, server in zip(server_ports, servers):
            wait_listening(p, server)  # servers listen before they join; this flood waits in their backlog meanwhile
            server_flood.append(open_idle(p, 200))
        server_pids = [int(n.wait_for(r"^server rank=\d+ pid=(\d+) port=\d+$", 40).group(1)) for n in servers]
        for node in workers:
            node.wait_for(r"^iteration 2 ok$", 40)
        during = stats(scheduler.proc.pid)
        server_during = [stats(pid) for pid in server_pids]
    finally:
        stop_churn.set()
        churner.join()
    for conns in [flood, *server_flood]:
        for s in conns:
            s.close()
    stop.touch()
    for node in workers + servers + [scheduler]:
        assert node.finish(40) == 0, f"{node.name}:\n{node.output}"
    for node in workers:
        assert "WRONG" not in node.output and "FAILED" not in node.output, node.output
        node.wait_for(r"^done iterations=\d+$")
    # The doors never cost a thread per connection, and descriptors stay near the pending cap.
    assert during["threads"] <= baseline["threads"] + 1, (baseline, during)
    assert during["fds"] <= baseline["fds"] + MAX_PENDING + 16, (baseline, during)
    for seen in server_during:
        assert seen["threads"] <= 12, seen
        assert seen["fds"] <= MAX_PENDING + 24, seen
    assert "connections are in the handshake" in scheduler.output, scheduler.output[-2000:]
    print(f"\nflood at rendezvous: {len(flood)} idle + {churned[0]} churned connections to the scheduler: "
          f"{baseline} -> {during}; {[len(f) for f in server_flood]} idle to the servers: {server_during}")


def test_refused_or_reset_scheduler_connections_are_retried_until_the_connect_timeout(nodes):
    """A scheduler port that resets every connection mid-handshake for 2 s (as a full or restarting scheduler
    would) does not fail the nodes: they retry, and join the real scheduler once it is there."""
    port = free_port()
    impostor = socket.create_server((HOST, port))
    impostor.settimeout(0.1)
    env = {"P3_CONNECT_TIMEOUT": "30"}
    starters = [Node(f"server process {i}", [sys.executable, REPORT_SERVER], node_env("server", port, 2, 1, **env))
                for i in range(1)]
    starters += [Node(f"worker process {i}", [sys.executable, FAILURE_WORKER, "--iterations", "3"],
                      node_env("worker", port, 2, 1, **env)) for i in range(2)]
    nodes.extend(starters)
    resets = 0
    end = time.monotonic() + 3
    while time.monotonic() < end:  # bounded by time
        try:
            c, _ = impostor.accept()
        except TimeoutError:
            continue
        c.sendall(b"P3KVAUTH")  # part of a challenge, then the connection ends
        c.close()
        resets += 1
    impostor.close()
    assert resets >= 3, "every node should have tried at least once"
    scheduler = Node("scheduler", [sys.executable, "-m", "p3kv.core.scheduler"],
                     node_env("scheduler", port, 2, 1, **env))
    nodes.append(scheduler)
    for node in starters + [scheduler]:
        assert node.finish(40) == 0, f"{node.name}:\n{node.output}"
    for node in starters[1:]:
        assert "done iterations=3" in node.output and "WRONG" not in node.output, node.output
    print(f"\n{resets} connections reset during the handshake; every node retried and the job completed")


def test_slow_handshakes_slow_frames_and_floods_while_the_job_runs(nodes, tmp_path):
    """While the job computes: trickling handshakes are closed at the whole-handshake deadline, an authenticated
    peer's slow frame to the scheduler and one byte of HELLO to a server are cut off at their deadlines and
    logged with the culprit's address, and a flood of idle connections costs no thread. Heartbeats keep
    flowing throughout (P3_HEARTBEAT_TIMEOUT=3 s would fail the job otherwise)."""
    stop = tmp_path / "stop"
    job = Job(nodes, worker_args=("--stop-file", str(stop)), **HEARTBEAT)
    servers = job.server_ports()
    server0, server_pid, server_port = servers[0]
    sched_pid = job.scheduler.proc.pid
    job.wait_iteration(2)
    base = {"scheduler": stats(sched_pid), "server": stats(server_pid)}
    results: dict[str, object] = {}

    def run(name: str, fn) -> threading.Thread:
        t = threading.Thread(target=lambda: results.__setitem__(name, fn()))
        t.start()
        return t

    # 32 connections to each that send a byte every second of a (wrong) answer: the deadline is per handshake.
    tricklers = [(who, socket.create_connection((HOST, p), timeout=20)) for who, p in
                 (("scheduler", job.port), ("server", server_port)) for _ in range(32)]
    for _, s in tricklers:
        p3auth.read_challenge(s)
    threads = [run(f"trickle {i}", lambda s=s: trickle(s, bytes(64), 1.0, HANDSHAKE_DEADLINE + 4))
               for i, (_, s) in enumerate(tricklers)]
    slow = authenticated(job.port)
    slow_port = slow.getsockname()[1]
    threads.append(run("slow frame", lambda: trickle(slow, frame(REGISTER, payload_bytes=100), 1.0,
                                                     FRAME_DEADLINE + 5)))
    # From an address of its own: its refusal must be logged however many the tricklers' and the flood's
    # addresses have had logged (each address has a log budget of its own, cpp/src/refusal_log.h).
    hello = authenticated(server_port, "127.0.0.3")
    hello_port = hello.getsockname()[1]
    hello.sendall(frame(HELLO)[:1])
    threads.append(run("one byte of HELLO", lambda: closed_within(hello, HANDSHAKE_DEADLINE + 4)))
    # The flood comes from another address: it evicts only its own pending connections (see p3/gatekeeper.h), so
    # the slow peers above meet their deadlines, not the flood.
    floods = {who: open_idle(p, FLOOD, "127.0.0.2") for who, p in (("scheduler", job.port), ("server", server_port))}
    time.sleep(1)
    during = {"scheduler": stats(sched_pid), "server": stats(server_pid)}
    for t in threads:
        t.join()
    for conns in floods.values():
        for s in conns:
            s.close()
    for _, s in tricklers:
        s.close()
    slow.close()
    hello.close()
    trickled = [results[f"trickle {i}"] for i in range(len(tricklers))]
    # Why each connection closed before when: a node that exited (a failed job) closes them all, and only its
    # output can tell that from a deadline.
    for node in (job.scheduler, server0, *job.workers):
        assert node.proc.poll() is None, f"{node.name} exited ({node.proc.poll()}) during the attack:\n{node.output}"
    job.scheduler.wait_for(rf"dropped unregistered peer {HOST}:{slow_port}: a frame was not complete within 10 s")
    server0.wait_for(rf"refused the connection from 127\.0\.0\.3:{hello_port}: the first frame \(HELLO\) was not "
                     r"complete within 5 s")
    assert "no answer to the challenge in time" in job.scheduler.output
    assert all(t is not None and t < HANDSHAKE_DEADLINE + 2 for t in trickled), trickled
    # The test's clock starts before the first byte is sent, the scheduler's when it reads it: never later.
    assert results["slow frame"] is not None and FRAME_DEADLINE - 1 < results["slow frame"] < FRAME_DEADLINE + 2, \
        results["slow frame"]
    assert results["one byte of HELLO"] is not None and results["one byte of HELLO"] < HANDSHAKE_DEADLINE + 2
    for who in ("scheduler", "server"):
        assert during[who]["threads"] <= base[who]["threads"] + 1, (who, base[who], during[who])
        assert during[who]["fds"] <= base[who]["fds"] + MAX_PENDING + 4, (who, base[who], during[who])
        assert during[who]["rss_kib"] <= base[who]["rss_kib"] + 32 * 1024, (who, base[who], during[who])
    last = max(int(n) for n in re.findall(r"^iteration (\d+) ok$", job.workers[0].output, re.MULTILINE))
    job.wait_iteration(last + 2)
    finish_job(job, stop)
    print(f"\nunder {FLOOD} idle + 64 trickling connections each: {base} -> {during}; trickles closed after "
          f"{min(trickled):.1f}-{max(trickled):.1f} s, slow frame after {results['slow frame']:.1f} s, one byte of "
          f"HELLO after {results['one byte of HELLO']:.1f} s")


# ---- with the secret: a buggy or compromised worker ----

def register_workers(port: int) -> list[socket.socket]:
    """Two raw workers registered with the scheduler, by rank."""
    links = [authenticated(port) for _ in range(2)]
    for s in links:
        host = HOST.encode()
        body = struct.pack("<BH", WORKER_ROLE, len(host)) + host + struct.pack("<HII", 0, 2, 1)
        s.sendall(frame(REGISTER, payload=body))
    by_rank: dict[int, socket.socket] = {}
    for s in links:
        while True:
            command, _, _, body = read_frame(s)
            if command == NODE_TABLE:
                by_rank[struct.unpack("<i", body[:4])[0]] = s
                break
    return [by_rank[0], by_rank[1]]


def next_data(s: socket.socket) -> tuple[int, int, int, bytes]:
    while True:
        got = read_frame(s)
        if got[0] in (BROADCAST, ERROR):
            return got


def test_memory_claims_of_a_worker_are_refused_or_paid_for_as_they_arrive(nodes):
    """A worker of the job (it holds the secret) declares a 2^26-element slice with a 64-byte INIT: rejected
    against P3_SERVER_SLICE_BYTES before anything is allocated, logged with its address, and the job goes on
    with correct sums. Then it sends a PUSH header claiming 512 MiB and only 1 MiB of payload: the server's
    memory grows by what arrived, not by the claim, and the frame deadline (P3_TIMEOUT from the frame's first
    byte) then fails the job naming the worker."""
    port = free_port()
    env = {"P3_HEARTBEAT_TIMEOUT": "60", "P3_SERVER_SLICE_BYTES": str(64 << 20), "P3_CONNECT_TIMEOUT": "30",
           "P3_TIMEOUT": "4"}
    scheduler = Node("scheduler", [sys.executable, "-m", "p3kv.core.scheduler"],
                     node_env("scheduler", port, 2, 1, **env))
    server = Node("server process", [sys.executable, REPORT_SERVER], node_env("server", port, 2, 1, **env))
    nodes += [scheduler, server]
    wait_listening(port, scheduler)
    # Before anything: a control frame too large for the scheduler is refused before its payload is read, and the
    # refusal names the limit that applies (a fixed one, not P3_MAX_MESSAGE_BYTES).
    big = authenticated(port)
    big_port = big.getsockname()[1]
    big.sendall(frame(REGISTER, payload_bytes=2 << 20))
    assert closed_within(big, 5) is not None
    big.close()
    scheduler.wait_for(rf"dropped unregistered peer {HOST}:{big_port}: payload of 2097152 bytes exceeds the limit of "
                       r"1048576 \(the fixed 1 MiB limit of frames to and from the scheduler\)")
    links = register_workers(port)
    m = server.wait_for(r"^server rank=0 pid=(\d+) port=(\d+)$")
    pid, server_port = int(m.group(1)), int(m.group(2))
    data = [authenticated(server_port) for _ in range(2)]
    for rank, s in enumerate(data):
        s.sendall(frame(HELLO, sender=rank))
    # The job works: a key of 1000 elements, initialised and pushed once, sums correctly (and every thread of the
    # server has run, so what follows measures the attacks alone).
    value = np.arange(1000, dtype=np.float32)
    data[0].sendall(frame(INIT, sender=0, key=1, count=1000, payload=value.tobytes()))
    data[1].sendall(frame(INIT, sender=1, key=1, count=1000))
    for s in data:
        command, key, iteration, body = next_data(s)
        assert (command, key, iteration) == (BROADCAST, 1, 0) and np.array_equal(np.frombuffer(body, np.float32), value)
    for rank, s in enumerate(data):
        s.sendall(frame(PUSH, sender=rank, key=1, count=1000, iteration=1,
                        payload=np.full(1000, rank + 1, np.float32).tobytes()))
    for s in data:
        command, key, iteration, body = next_data(s)
        assert (command, iteration) == (BROADCAST, 1) and np.all(np.frombuffer(body, np.float32) == 3), body[:16]
    base = stats(pid)
    local = data[1].getsockname()[1]
    data[1].sendall(frame(INIT, sender=1, key=99, count=1 << 26))
    command, key, _, why = next_data(data[1])
    assert command == ERROR and key == 99 and b"P3_SERVER_SLICE_BYTES" in why, why
    server.wait_for(rf"rejected a request from worker 1 \({HOST}:{local}\) for key 99 .*P3_SERVER_SLICE_BYTES")
    after_init = stats(pid)
    assert after_init["vm_kib"] < base["vm_kib"] + 64 * 1024, (base, after_init)
    # ... and goes on: the next iteration sums correctly.
    for rank, s in enumerate(data):
        s.sendall(frame(PUSH, sender=rank, key=1, count=1000, iteration=2,
                        payload=np.full(1000, rank + 1, np.float32).tobytes()))
    for s in data:
        command, key, iteration, body = next_data(s)
        assert (command, iteration) == (BROADCAST, 2) and np.all(np.frombuffer(body, np.float32) == 3), body[:16]
    # A control request the server refuses is answered with the reason and logged with the worker's address.
    data[1].sendall(frame(REQUEST, sender=1, request=999, iteration=5, payload=b"x"))
    while (reply := read_frame(data[1]))[0] != REPLY:
        pass
    assert b"999" in reply[3], reply
    server.wait_for(rf"rejected control request 999 \(id 5\) from worker 1 \({HOST}:{local}\)")
    # A header claiming 512 MiB, then 1 MiB of it.
    before = stats(pid)
    data[0].sendall(frame(PUSH, sender=0, key=1, count=1 << 27, iteration=3, payload_bytes=1 << 29))
    data[0].sendall(bytes(1 << 20))
    time.sleep(1)
    claimed = stats(pid)
    assert claimed["vm_kib"] < before["vm_kib"] + 16 * 1024, (before, claimed)
    assert claimed["threads"] == before["threads"], (before, claimed)
    # The rest never comes: the frame deadline (P3_TIMEOUT from its first byte) fails the job, naming the worker.
    assert server.finish() == 1, server.output
    assert re.search(rf"worker 0 \({HOST}[:\d]*\).*a frame was not complete within 4 s of its first byte",
                     server.output), server.output
    assert scheduler.finish() == 1, scheduler.output
    for s in data[1:] + links:
        s.close()
    print(f"\nINIT of 2^26 elements: VmSize {base['vm_kib']} -> {after_init['vm_kib']} KiB; PUSH claiming 512 MiB "
          f"with 1 MiB sent: VmSize {before['vm_kib']} -> {claimed['vm_kib']} KiB, RSS {before['rss_kib']} -> "
          f"{claimed['rss_kib']} KiB")
