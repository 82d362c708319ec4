"""The worker's core against scripted servers: a real scheduler, a real P3Worker in this process, and two fake
servers speaking the wire protocol from this test, so that a test decides exactly which frame (or which half of
one) arrives when. Covers what a live job cannot order deterministically:

- a server's rejection of an operation while another server's broadcast is still being written into the caller's
  buffer completes the operation only once that write is done (MXNet must never get back a buffer a late slice
  can still land in);
- close() with a timeout returns within it even when a server stopped reading and the sender is stalled on it;
- a rejection while the operation's slice for another server is still queued in the sender completes only once
  that slice left the queue (the sender reads it straight from the caller's gradient);
- a wait that times out or is interrupted (Ctrl-C) keeps the caller's arrays alive while a late slice can still
  land in them, and refuses them to another init or push meanwhile.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import struct
import sys
import threading
import time
import weakref

import numpy as np
import p3auth
import pytest
from frames import MAGIC, VERSION
from harness import HOST, SECRET, STEP, Node, free_port, node_env

from p3kv.core.errors import ConfigError, P3Error, P3TimeoutError
from p3kv.core.worker import P3Worker

pytestmark = pytest.mark.integration

HEADER = struct.Struct("<IHBBiiBBHIQQQQQ")  # cpp/src/codec.cc, protocol 5 (cpp/include/p3/message.h)
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

    def __init__(self, scheduler_port: int, rcvbuf: int | None = None):
        self.listener = socket.create_server((HOST, 0))
        if rcvbuf:  # the accepted connection inherits it: the worker's sends fill it sooner
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
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
def job(nodes, monkeypatch, request):
    """A scheduler (1 worker, 2 servers), two FakeServers by rank, and this process's P3Worker on the first key
    (key 0: 2 slices of float32 elements, initialised with zeros). Parametrised indirectly with {"slice": elements,
    "rcvbuf": the fake servers' receive buffer}; by default slices of SLICE and the kernel's buffers."""
    options = getattr(request, "param", {})
    slice_size = options.get("slice", SLICE)
    port = free_port()
    env = node_env("worker", port, workers=1, servers=2, P3_SLICE_SIZE=str(slice_size), P3_HEARTBEAT_TIMEOUT="60",
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
            servers.append(FakeServer(port, options.get("rcvbuf")))
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
    value = np.zeros(2 * slice_size, np.float32)
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


BIG_SLICE = 1 << 20  # 4 MiB of float32 per slice: far more than the socket buffers hold


@pytest.mark.parametrize("job", [{"slice": BIG_SLICE, "rcvbuf": 1 << 16}], indirect=True)
def test_a_broadcast_of_a_slice_whose_push_is_still_being_sent_fails_the_worker_at_once(job):
    # A server broadcasts a slice only once it has every worker's push of it. One that broadcasts while this
    # worker's push of that slice is still part-written (its sender waiting for room in a socket the server no
    # longer reads) breaks the protocol: the worker must fail with an error saying so, not wait for a write the
    # server will never take, and must not write the broadcast into the caller's array.
    worker, servers, inits = job
    grad = np.ones(2 * BIG_SLICE, np.float32)
    out = np.zeros(2 * BIG_SLICE, np.float32)
    worker.push(0, grad, out=out)
    h = dict(zip(("magic", "version", "command"), HEADER.unpack(p3auth.recv_exactly(servers[0].worker,
                                                                                 HEADER.size))[:3], strict=True))
    assert h["command"] == PUSH, h  # server 0 takes the header and stops reading: the payload stays part-written
    time.sleep(0.3)  # the sender fills the buffers and waits for room
    value = np.full(BIG_SLICE, 7, np.float32).tobytes()

    def broadcast() -> None:  # the worker reads its header only, so sendall may block until the socket closes
        with contextlib.suppress(OSError):
            servers[0].broadcast(inits[0], value, iteration=1)

    early = threading.Thread(target=broadcast, daemon=True)
    started = time.monotonic()
    early.start()
    with pytest.raises(P3Error, match="still sending its PUSH of that slice: the server broadcast before it had"):
        worker.wait(0, timeout=STEP)
    assert time.monotonic() - started < STEP / 2
    assert not out.any()  # nothing of the early broadcast landed in the caller's array


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


def read_until_push(server: FakeServer, key: int) -> tuple[dict, bytes]:
    """Reads (and drops) the frames the worker sent `server` up to its PUSH of `key`, which it returns."""
    while True:
        h, payload = read_frame(server.worker)
        if h["command"] == PUSH and h["key"] == key:
            return h, payload


def pushed_and_dropped(worker, servers, value: float) -> tuple[weakref.ref, weakref.ref]:
    """Pushes key 0 (iteration 1) from arrays only the worker keeps; both servers read the push and say nothing.
    Returns weak references to the gradient and the out array."""
    grad = np.full(2 * SLICE, value, np.float32)
    out = np.zeros(2 * SLICE, np.float32)
    worker.push(0, grad, out=out)
    for s in servers:
        h, _ = read_frame(s.worker)
        assert h["command"] == PUSH and h["iteration"] == 1, h
    return weakref.ref(grad), weakref.ref(out)


def alive_after_collection(ref: weakref.ref) -> bool:
    gc.collect()
    return ref() is not None


def broadcast_push(servers, inits, value: float) -> None:
    for s, h in zip(servers, inits, strict=True):
        s.broadcast(h, np.full(SLICE, value, np.float32).tobytes(), iteration=1)


def test_a_timed_out_wait_keeps_the_arrays_until_the_late_broadcast_landed(job):
    worker, servers, inits = job
    grad, out = pushed_and_dropped(worker, servers, 1.0)
    with pytest.raises(P3TimeoutError):
        worker.wait(0, timeout=0.2)
    # The receivers would still read a late slice straight into `out`: it must not be freed.
    assert alive_after_collection(out) and alive_after_collection(grad)
    # Nor handed to another operation, which the late slice would silently overwrite.
    with pytest.raises(ConfigError, match="still in use by an operation on key 0 whose wait gave up"):
        worker.init(1, np.zeros(2 * SLICE, np.float32), out=out())
    with pytest.raises(ConfigError, match="still in use"):
        worker.push(0, grad())
    held = out()  # (the test's own reference, to read the late slices)
    broadcast_push(servers, inits, 5.0)  # the late broadcast lands where it always could
    worker.wait(0, timeout=STEP)
    assert (held == 5.0).all()
    # Completed: the worker lets go of both arrays and takes them again.
    assert not alive_after_collection(grad)
    worker.push(0, held)
    for s in servers:
        assert read_frame(s.worker)[0]["iteration"] == 2


@contextlib.contextmanager
def ctrl_c_pressed_until_the_block_ends(interval: float = 0.3):
    """Sends SIGINT to the main thread every `interval` s while the block runs, as a user presses Ctrl-C until
    something happens. One press is not enough in a test: CPython loses a SIGINT whose KeyboardInterrupt is
    raised inside a finalizer that a garbage collection runs on the main thread (it is printed and ignored),
    which a big test process (the full suite, with mxnet and torch loaded) hit once in a fresh-clone run. The
    handler raises only while the block runs, so a press still in flight when it ends reaches no later code."""
    armed = threading.Event()
    armed.set()
    stop = threading.Event()

    def handler(_signum, _frame):
        if armed.is_set():
            raise KeyboardInterrupt

    main = threading.main_thread().ident

    def press() -> None:
        while not stop.wait(interval):
            signal.pthread_kill(main, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, handler)
    presser = threading.Thread(target=press, name="ctrl-c", daemon=True)
    presser.start()
    try:
        yield
    finally:
        armed.clear()
        stop.set()
        presser.join()
        # signal.signal runs the handlers of signals already delivered (here: disarmed) before it swaps them.
        signal.signal(signal.SIGINT, previous)


def test_an_interrupted_wait_keeps_the_arrays_until_the_operation_completed(job):
    worker, servers, inits = job
    grad, out = pushed_and_dropped(worker, servers, 1.0)
    # Ctrl-C while the worker waits for all keys (the wait polls for signals every 0.2 s).
    with ctrl_c_pressed_until_the_block_ends(), pytest.raises(KeyboardInterrupt):
        worker.wait(timeout=STEP)
    assert alive_after_collection(out) and alive_after_collection(grad)
    with pytest.raises(ConfigError, match=r"whose wait gave up \(KeyboardInterrupt\)"):
        worker.push(0, np.zeros(2 * SLICE, np.float32), out=out())
    held = out()
    broadcast_push(servers, inits, 6.0)
    worker.wait(timeout=STEP)
    assert (held == 6.0).all()
    assert not alive_after_collection(grad)


def test_a_rejection_completes_only_once_its_slice_for_another_server_left_the_send_queue(job):
    worker, servers, inits = job
    # Server 1 stops reading while the worker queues far more than the socket buffers hold for it: key 1's INITs
    # (32 MiB, top priority), then key 0's push, whose slice for server 1 stays queued behind them. The sender
    # will read that slice straight from `grad` whenever server 1 reads again.
    worker.init(1, np.ones(1 << 23, np.float32))
    grad = np.full(2 * SLICE, 3.0, np.float32)
    worker.push(0, grad, out=np.zeros(2 * SLICE, np.float32))
    # Server 0 reads everything up to its slice of the push and rejects the operation.
    h, _ = read_until_push(servers[0], 0)
    assert h["iteration"] == 1, h
    why = b"scripted rejection"
    servers[0].worker.sendall(frame(ERROR, sender=0, slice_=h["slice"], key=0, iteration=1, payload=why))
    # The rejection must not hand the operation back while its slice for server 1 is still queued.
    with pytest.raises(P3TimeoutError, match="failed operations still held by the sender"):
        worker.wait(0, timeout=0.5)
    grad_ref = weakref.ref(grad)
    del grad
    assert alive_after_collection(grad_ref)
    # Server 1 reads again: the queued slice goes out, read from the live gradient, and the operation completes.
    drained: list = []
    reader = threading.Thread(target=lambda: drained.append(read_until_push(servers[1], 0)), daemon=True)
    reader.start()
    with pytest.raises(P3Error, match="scripted rejection"):
        worker.wait(0, timeout=STEP)
    reader.join(STEP)
    h, payload = drained[0]
    assert h["iteration"] == 1 and np.frombuffer(payload, np.float32).tolist() == [3.0] * SLICE
    assert not alive_after_collection(grad_ref)


def test_late_slices_after_a_timeout_land_in_live_memory_even_when_the_caller_dropped_the_arrays(job):
    """The sanitizer tier's check of the same guarantee: before the fix, the receiver wrote these late slices into
    freed memory (AddressSanitizer: heap-use-after-free, WRITE in WorkerNode::HandleBroadcast)."""
    worker, servers, inits = job
    grad, out = pushed_and_dropped(worker, servers, 1.0)
    with pytest.raises(P3TimeoutError):
        worker.wait(0, timeout=0.2)
    gc.collect()
    broadcast_push(servers, inits, 5.0)
    worker.wait(0, timeout=STEP)
    # Completed: now, and only now, the worker has let go of them.
    assert not alive_after_collection(out) and not alive_after_collection(grad)


def test_a_rejected_push_still_queued_is_sent_from_live_memory_when_the_caller_dropped_the_gradient(job):
    """The sanitizer tier's check of the rejection guarantee: before the fix, the sender read the slice still
    queued for server 1 from a freed gradient (AddressSanitizer: heap-use-after-free, READ in the sender)."""
    worker, servers, _ = job
    worker.init(1, np.ones(1 << 23, np.float32))  # keeps server 1's queue full, as above
    gradient = np.full(2 * SLICE, 3.0, np.float32)
    worker.push(0, gradient, out=np.zeros(2 * SLICE, np.float32))
    grad = weakref.ref(gradient)
    del gradient
    h, _ = read_until_push(servers[0], 0)
    servers[0].worker.sendall(frame(ERROR, sender=0, slice_=h["slice"], key=0, iteration=1, payload=b"no"))
    drained: list = []
    reader = threading.Thread(target=lambda: drained.append(read_until_push(servers[1], 0)), daemon=True)
    with pytest.raises(P3Error, match="rejected key '0'"):
        try:
            worker.wait(0, timeout=0.5)
        except P3TimeoutError:  # (the fix: still held by the sender) server 1 reads again
            gc.collect()
            reader.start()
            worker.wait(0, timeout=STEP)
    if not reader.is_alive() and not drained:
        gc.collect()  # (before the fix: handed back at once, so the gradient is freed before server 1 reads)
        reader.start()
    reader.join(STEP)
    assert np.frombuffer(drained[0][1], np.float32).tolist() == [3.0] * SLICE
    assert not alive_after_collection(grad)
