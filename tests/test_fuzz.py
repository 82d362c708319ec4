"""Fuzzing a live p3kv server: while a real job (2 workers, 1 or 2 servers) iterates and checks every sum against
numpy, hypothesis throws connections at server 0 (and server 1 when there is one): random bytes, junk and
truncated handshakes, and, after a correct handshake, random bytes, truncated frames, valid HELLO/INIT/PUSH
frames with bits flipped or a field replaced, and frames with random field values.

No fuzz connection can ever be accepted: every worker rank is taken before fuzzing starts and a second HELLO for
a taken rank is refused, so each one must be refused and logged. The job must not notice: the workers keep
completing iterations with correct sums, every process exits 0, and the servers' logs and rejected_frames
counters show the refusals.

The job is started process by process through tests/harness.py, as in tests/test_failures.py, with a secret.
"""

from __future__ import annotations

import os
import random
import re
import socket
import struct
import sys
import time

import p3auth
import pytest
from frames import MAGIC, VERSION
from harness import FAILURE_WORKER, HOST, REPORT_SERVER, STEP, Node, free_port, node_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

SECRET = "fuzz-secret-\u00e9"  # non-ASCII: the secret is UTF-8 bytes on both sides
HEADER = struct.Struct("<IHBBiiBBHIQQQQQ")  # cpp/src/codec.cc, protocol 5 (cpp/include/p3/message.h)
FIELDS = ("magic", "version", "command", "status", "priority", "sender", "dtype", "byte_order", "request", "slice",
          "key", "offset", "count", "iteration", "payload_bytes")
FIELD_BITS = (32, 16, 8, 8, -32, -32, 8, 8, 16, 32, 64, 64, 64, 64, 64)  # negative: signed
INIT, HELLO, PUSH = 10, 9, 11
EXAMPLES = 150
REFUSED = r"p3kv\.core\[server (\d)\]: refused the connection from " + re.escape(HOST) + r":(\d+): (.*)$"


def frame(command: int, *, sender: int = 0, count: int = 0, payload: bytes = b"", **fields: int) -> bytes:
    values = dict(magic=MAGIC, version=VERSION, command=command, status=0, priority=0, sender=sender, dtype=0,
                  byte_order=1 if command == HELLO else 0,  # a HELLO declares little-endian payloads
                  request=0, slice=0, key=0, offset=0, count=count, iteration=1, payload_bytes=len(payload))
    values.update(fields)
    return HEADER.pack(*(values[name] for name in FIELDS)) + payload


def valid_frames() -> list[bytes]:
    """Frames a real worker sends first or later (HELLO, INIT and PUSH of 4 float32 elements)."""
    payload = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    return [frame(HELLO, sender=0), frame(HELLO, sender=1),
            frame(INIT, sender=0, count=4, payload=payload, key=0),
            frame(PUSH, sender=1, count=4, payload=payload, key=0, priority=-1, iteration=3)]


def field_value(bits: int) -> st.SearchStrategy[int]:
    if bits < 0:
        return st.integers(-(2 ** (-bits - 1)), 2 ** (-bits - 1) - 1)
    return st.integers(0, 2**bits - 1)


@st.composite
def random_frame(draw) -> bytes:
    """A header whose every field is random (command and dtype mostly in range, so decoding gets further)."""
    values = [draw(field_value(bits)) for bits in FIELD_BITS]
    if draw(st.booleans()):
        values[0], values[1] = MAGIC, VERSION
    if draw(st.booleans()):
        values[2] = draw(st.integers(0, 17))
        values[3] = draw(st.integers(0, 8))
        values[6] = draw(st.integers(0, 6))
    if draw(st.booleans()):
        values[14] = draw(st.integers(0, 64))
    return HEADER.pack(*values) + draw(st.binary(max_size=64))


@st.composite
def mutated_frame(draw) -> bytes:
    """A valid frame with random bits flipped, or one field replaced by a random value."""
    data = bytearray(draw(st.sampled_from(valid_frames())))
    if draw(st.booleans()):
        for bit in draw(st.lists(st.integers(0, len(data) * 8 - 1), min_size=1, max_size=8)):
            data[bit // 8] ^= 1 << (bit % 8)
    else:
        index = draw(st.integers(0, len(FIELDS) - 1))
        values = list(HEADER.unpack(bytes(data[:HEADER.size])))
        values[index] = draw(field_value(FIELD_BITS[index]))
        data[:HEADER.size] = HEADER.pack(*values)
    return bytes(data)


def truncated(strategy: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.tuples(strategy, st.integers(0, 200)).map(lambda t: t[0][:t[1]])


PAYLOADS = st.one_of(st.binary(max_size=300), truncated(st.sampled_from(valid_frames())), mutated_frame(),
                     random_frame())
# (handshake, bytes sent after it). Handshakes: "none" sends the bytes right after connecting (the server is
# still waiting for the answer to its challenge); "junk" answers the challenge with random bytes; "flipped" with
# a correct answer with one bit flipped; "partial" with the first bytes of a correct answer; "ok" authenticates.
CASES = st.tuples(st.sampled_from(["none", "junk", "flipped", "partial", "ok", "ok", "ok"]), PAYLOADS)


def attack(port: int, handshake: str, data: bytes, rng: random.Random) -> int:
    """One fuzz connection; returns its local port (the server names it in its refusal)."""
    with socket.create_connection((HOST, port), timeout=STEP) as s:
        local = s.getsockname()[1]
        try:
            if handshake != "none":
                a = p3auth.read_challenge(s)
                right = p3auth.answer(SECRET, a)
                if handshake == "junk":
                    s.sendall(bytes(rng.getrandbits(8) for _ in range(len(right))))
                elif handshake == "flipped":
                    bit = rng.randrange(len(right) * 8)
                    s.sendall(right[:bit // 8] + bytes([right[bit // 8] ^ (1 << bit % 8)]) + right[bit // 8 + 1:])
                elif handshake == "partial":
                    s.sendall(right[:rng.randrange(len(right))])
                else:
                    s.sendall(right)
                    proof = p3auth.recv_exactly(s, p3auth.MAC_BYTES)
                    assert proof == p3auth.mac(SECRET, b"acceptor", a, right[:p3auth.NONCE_BYTES])
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            # The server must hang up (refusal) rather than wait for more: read to the end, with a bound.
            while s.recv(4096):
                pass
        except TimeoutError:
            raise
        except OSError:
            pass  # the server already refused and closed (reset, not connected, broken pipe)
    return local


@pytest.mark.parametrize("servers", [1, 2])
def test_fuzzed_server_refuses_everything_while_the_job_computes_correct_sums(servers, nodes, tmp_path):
    stop = tmp_path / "stop"
    port = free_port()
    env = {"P3_SECRET": SECRET}
    scheduler = Node("scheduler", [sys.executable, "-m", "p3kv.core.scheduler"],
                     node_env("scheduler", port, 2, servers, **env))
    server_nodes = [Node(f"server process {i}", [sys.executable, REPORT_SERVER], node_env("server", port, 2, servers,
                                                                                           **env))
                    for i in range(servers)]
    workers = [Node(f"worker process {i}", [sys.executable, FAILURE_WORKER, "--stop-file", str(stop)],
                    node_env("worker", port, 2, servers, **env)) for i in range(2)]
    nodes.extend([scheduler, *server_nodes, *workers])
    ports = {}
    for node in server_nodes:
        m = node.wait_for(r"^server rank=(\d+) pid=(\d+) port=(\d+)$")
        ports[int(m.group(1))] = int(m.group(3))
    for node in workers:
        node.wait_for(r"^iteration 2 ok$")  # both workers hold their connection to every server

    sent: dict[int, list[int]] = {rank: [] for rank in ports}  # server rank -> local ports of fuzz connections
    rng = random.Random(0)
    started = time.monotonic()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(case=CASES, target=st.sampled_from(sorted(ports)))
    def fuzz(case: tuple[str, bytes], target: int) -> None:
        handshake, data = case
        sent[target].append(attack(ports[target], handshake, data, rng))

    fuzz()
    fuzz_seconds = time.monotonic() - started
    total = sum(len(v) for v in sent.values())
    assert total >= EXAMPLES

    # The job did not notice: more iterations, each checked against numpy, then an orderly end.
    last = max(int(n) for n in re.findall(r"^iteration (\d+) ok$", workers[0].output, re.MULTILINE))
    for node in workers:
        node.wait_for(rf"^iteration {last + 3} ok$")
    stop.touch()
    for node in workers:
        assert node.finish() == 0, node.output
        assert "WRONG" not in node.output and "FAILED" not in node.output, node.output
        node.wait_for(r"^done iterations=\d+$")
    for node in [*server_nodes, scheduler]:
        assert node.finish() == 0, f"{node.name} (after {total} fuzz connections):\n{node.output}"

    # Every fuzz connection was refused once, by the server it went to, and the counters saw the bad frames.
    for node in server_nodes:
        rank = int(node.wait_for(r"^server rank=(\d+) pid=").group(1))
        refused = [m for line in node.seen if (m := re.search(REFUSED, line))]
        assert all(int(m.group(1)) == rank for m in refused)
        refused_ports = sorted(int(m.group(2)) for m in refused)
        assert refused_ports == sorted(sent[rank]), \
            f"server {rank}: {len(sent[rank])} fuzz connections, {len(refused)} refusals logged"
        counted = int(node.wait_for(r"^server rank=\d+ rejected_frames=(\d+)$").group(1))
        # Connections that merely end (empty, truncated, partial handshake) are refused but not counted as bad.
        invalid = [m for m in refused if not re.search(r"closed|truncated|ended during", m.group(3))]
        assert counted >= len(invalid) > 0, (counted, len(invalid))
    print(f"{total} fuzz connections in {fuzz_seconds:.1f} s, {len(set(sent))} server(s)")


def test_refused_connections_do_not_keep_server_descriptors(nodes, tmp_path):
    port = free_port()
    env = {"P3_SECRET": SECRET}
    nodes.append(Node("scheduler", [sys.executable, "-m", "p3kv.core.scheduler"],
                      node_env("scheduler", port, 2, 1, **env)))
    server = Node("server process", [sys.executable, REPORT_SERVER], node_env("server", port, 2, 1, **env))
    nodes.append(server)
    workers = [Node(f"worker process {i}", [sys.executable, FAILURE_WORKER, "--stop-file", str(tmp_path / "stop")],
                    node_env("worker", port, 2, 1, **env)) for i in range(2)]
    nodes.extend(workers)
    m = server.wait_for(r"^server rank=0 pid=(\d+) port=(\d+)$")
    pid, server_port = int(m.group(1)), int(m.group(2))
    for node in workers:
        node.wait_for(r"^iteration 2 ok$")
    before = len(os.listdir(f"/proc/{pid}/fd"))
    rng = random.Random(1)
    local_ports = [attack(server_port, "junk", b"", rng) for _ in range(100)]
    for local in local_ports:
        server.wait_for(rf"refused the connection from {re.escape(HOST)}:{local}: ")
    after = len(os.listdir(f"/proc/{pid}/fd"))
    (tmp_path / "stop").touch()
    for node in nodes[2:] + nodes[:2]:
        assert node.finish() == 0, node.output
    assert after <= before + 5, f"the server holds {after - before} more descriptors after 100 refused connections"
