"""The job's secret and liveness, with real processes on loopback.

Authentication: a node or a raw connection that does not know the job's P3_SECRET (wrong, missing, or a replayed
answer from an earlier connection) is refused and the refusal logged; P3_SECRET_FILE works; the launcher gives each
job a fresh secret. Liveness: a node stopped with SIGSTOP (hung: its sockets stay open) is declared dead after
P3_HEARTBEAT_TIMEOUT and every other process exits non-zero naming it; a scheduler killed or hung fails every node;
a server killed during the rendezvous fails the job; connections that never answer the handshake do not hold up
the rendezvous. A straggling worker does not change the sums.

Built on the node-by-node helpers of tests/harness.py (Node, Job, node_env) and the Python handshake of
tests/p3auth.py. Every wait has a hard timeout; processes are synchronized through their output.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time

import p3auth
import pytest
from frames import HELLO, header
from harness import (
    FAILURE_WORKER,
    HOST,
    NAMED_NODE,
    REPORT_SERVER,
    ROLE_COMMANDS,
    SECRET,
    STEP,
    Job,
    Node,
    assert_failed_with,
    bad_frame,
    free_port,
    node_env,
    refused_reason,
    run_job,
    run_node,
    start_node,
    start_rendezvous,
)

pytestmark = pytest.mark.integration

UNAUTHENTICATED = "the peer does not know the job's secret (P3_SECRET)"
HEARTBEAT = {"P3_HEARTBEAT_TIMEOUT": "3", "P3_HEARTBEAT_INTERVAL": "0.5"}  # jobs that must not fail meanwhile
# The liveness tests wait for a heartbeat timeout to pass: a sub-second one, and bounds in multiples of it.
HEARTBEAT_TIMEOUT, HEARTBEAT_INTERVAL = 0.8, 0.2
FAST_HEARTBEAT = {"P3_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT), "P3_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL)}
# A hung node cannot be declared dead before HEARTBEAT_TIMEOUT less the one interval its last heartbeat may have
# come before the fault; every process must have exited within this many timeouts of the fault (detection, the
# cascade of the others' failures, the interpreters' exits on a loaded machine).
LIVENESS_BOUND = 8 * HEARTBEAT_TIMEOUT
SILENCE = f"sent nothing for {HEARTBEAT_TIMEOUT:g} s (P3_HEARTBEAT_TIMEOUT)"


# ---- authentication ----

@pytest.mark.parametrize("job_secret, worker_secret", [("a", "b"), ("a", None), (None, "a")],
                         ids=["wrong secret", "worker without secret", "job without secret"])
def test_a_worker_with_another_secret_is_refused_and_fails_fast(job_secret, worker_secret, nodes):
    port = free_port()

    def env(role: str, secret: str | None) -> dict[str, str]:
        e = node_env(role, port, workers=1, servers=1, P3_CONNECT_TIMEOUT="5")
        del e["P3_SECRET"]
        if secret is not None:
            e["P3_SECRET"] = secret
        return e

    scheduler = Node("scheduler", ROLE_COMMANDS["scheduler"], env("scheduler", job_secret))
    server = Node("server", [sys.executable, REPORT_SERVER], env("server", job_secret))
    nodes += [scheduler, server]
    start = time.monotonic()
    worker = Node("worker", [sys.executable, FAILURE_WORKER], env("worker", worker_secret))
    nodes.append(worker)
    assert worker.finish() == 1, worker.output
    assert time.monotonic() - start < 5, worker.output  # well before P3_CONNECT_TIMEOUT would have passed
    assert re.search(r"the scheduler at .*the peer refused our secret \(P3_SECRET differs\?\)", worker.output), \
        worker.output
    refused = rf"p3kv\.core\[scheduler\]: refused the connection from {HOST}:\d+: {re.escape(UNAUTHENTICATED)}"
    scheduler.wait_for(refused)
    # The job never completes its rendezvous: the others give up after P3_CONNECT_TIMEOUT, non-zero.
    for node in (scheduler, server):
        assert node.finish() == 1, node.output
    assert "ready rank" not in worker.output


def connect(port: int) -> tuple[socket.socket, int]:
    s = socket.create_connection((HOST, port), timeout=STEP)
    return s, s.getsockname()[1]


def replay(port: int) -> int:
    """Authenticate one connection with the job's secret and record our answer; replay that answer on a new
    connection (whose challenge has a new nonce); the second connection's local port."""
    with socket.create_connection((HOST, port), timeout=STEP) as first:
        recorded = p3auth.authenticate(first, SECRET)
    second, local_port = connect(port)
    with second:
        p3auth.read_challenge(second)
        second.sendall(recorded)
        # No proof: the acceptor refuses (32 zero bytes) and hangs up.
        assert p3auth.recv_exactly(second, p3auth.MAC_BYTES) == p3auth.REFUSED
    return local_port


def wrong_secret(port: int, secret: str) -> int:
    s, local_port = connect(port)
    with s, pytest.raises(ConnectionError):
        p3auth.authenticate(s, secret)
    return local_port


def test_unauthenticated_and_replayed_connections_are_refused_while_the_job_runs(nodes, tmp_path):
    stop = tmp_path / "stop"
    job = Job(nodes, worker_args=("--stop-file", str(stop)), **HEARTBEAT)
    server0, _, server_port = job.server_ports()[0]
    scheduler_port = job.port
    job.wait_iteration(2)
    for who, node, port in (("scheduler", job.scheduler, scheduler_port), ("server 0", server0, server_port)):
        for name, local_port in (("no secret", wrong_secret(port, "")), ("wrong secret", wrong_secret(port, "x")),
                                 ("replay", replay(port))):
            reason = refused_reason(node, who, local_port)
            assert UNAUTHENTICATED in reason, f"{who}, {name}: {reason!r}"
    # A connection that never answers holds the scheduler's handshake for at most its 2 s deadline; with
    # P3_HEARTBEAT_TIMEOUT=3 nobody may be declared dead meanwhile.
    silent, local_port = connect(scheduler_port)
    with silent:
        reason = refused_reason(job.scheduler, "scheduler", local_port)
    assert "no answer to the challenge in time" in reason, reason
    # The right secret passes (the server then refuses the frame, not the connection's secret).
    reason = refused_reason(server0, "server 0", bad_frame(server_port, header(HELLO, sender=7)))
    assert "HELLO from worker rank 7" in reason, reason
    last = max(int(n) for n in re.findall(r"^iteration (\d+) ok$", job.workers[0].output, re.MULTILINE))
    job.wait_iteration(last + 2)
    stop.touch()
    for node in job.workers + job.servers + [job.scheduler]:
        assert node.finish() == 0, node.output
    for node in job.workers:
        assert "WRONG" not in node.output and "FAILED" not in node.output, node.output


def test_secret_file_is_the_secret(nodes, tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-a-file\n")  # the trailing newline is not part of the secret
    port = free_port()
    file_env = {"P3_SECRET": "", "P3_SECRET_FILE": str(secret_file)}
    scheduler = Node("scheduler", ROLE_COMMANDS["scheduler"], node_env("scheduler", port, 1, 1, **file_env))
    server = Node("server", [sys.executable, REPORT_SERVER], node_env("server", port, 1, 1, **file_env))
    # The worker gives the file's content directly: the two must be the same secret. It trains until the probe
    # was refused (a fixed 3 iterations could end the job, and the server, before the probe reached it).
    stop = tmp_path / "stop"
    worker = Node("worker", [sys.executable, FAILURE_WORKER, "--stop-file", str(stop), "--min-iterations", "3"],
                  node_env("worker", port, 1, 1, P3_SECRET="from-a-file"))
    nodes += [scheduler, server, worker]
    server_port = int(server.wait_for(r"^server rank=0 pid=\d+ port=(\d+)$").group(1))
    reason = refused_reason(server, "server 0", wrong_secret(server_port, "from-a-file\n"))
    assert UNAUTHENTICATED in reason, reason
    stop.touch()
    for node in (worker, server, scheduler):
        assert node.finish() == 0, node.output
    assert int(re.search(r"done iterations=(\d+)", worker.output).group(1)) >= 3, worker.output


def test_unreadable_secret_file_fails_at_once_naming_it(tmp_path):
    missing = tmp_path / "missing"
    code, output, _ = run_node(ROLE_COMMANDS["worker"], node_env("worker", free_port(), P3_SECRET="",
                                                                 P3_SECRET_FILE=str(missing)))
    assert code == 1, output
    assert f"P3_SECRET_FILE='{missing}' cannot be read" in output, output


PRINT_SECRET = "import os; from p3kv import P3Worker; w = P3Worker(); print('secret', os.environ['P3_SECRET']); " \
    "w.close()"


def test_the_launcher_gives_each_job_its_own_secret():
    env = {k: "" for k in os.environ if k.startswith("P3_")}
    secrets_seen = []
    for _ in range(2):
        result = run_job(2, 1, ["-c", PRINT_SECRET], env=env, timeout=STEP * 2)
        assert result.returncode == 0, result.stdout
        found = set(re.findall(r"^\[worker \d\] secret (\S+)$", result.stdout, re.MULTILINE))
        assert len(found) == 1, result.stdout  # both workers of a job share it
        secrets_seen.append(found.pop())
    assert secrets_seen[0] != secrets_seen[1]
    assert all(re.fullmatch(r"[0-9a-f]{64}", s) for s in secrets_seen), secrets_seen
    # A secret the user sets is kept.
    result = run_job(2, 1, ["-c", PRINT_SECRET], env={**env, "P3_SECRET": "mine"}, timeout=STEP * 2)
    assert result.returncode == 0, result.stdout
    assert set(re.findall(r"^\[worker \d\] secret (\S+)$", result.stdout, re.MULTILINE)) == {"mine"}, result.stdout


# ---- liveness: a hung node (SIGSTOP keeps its sockets open, so only the heartbeats can tell) ----

def resume_and_reap(node: Node, pid: int) -> int:
    """SIGCONT a stopped process; its exit code (it must notice the job is gone, or it is killed and fails)."""
    os.kill(pid, signal.SIGCONT)
    return node.finish()


def assert_exits_within(nodes_: list[Node], code: int, start: float, low: float, high: float) -> None:
    for node in nodes_:
        assert node.finish(high) == code, f"{node.name}:\n{node.output}"
    elapsed = time.monotonic() - start
    assert low <= elapsed < high, f"exited {elapsed:.1f} s after the fault, expected {low}-{high} s"


def test_a_hung_server_is_declared_dead_and_fails_the_job(nodes):
    job = Job(nodes, **FAST_HEARTBEAT)
    servers = job.server_ports()
    job.wait_iteration(3)
    victim, pid, port = servers[0]
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        # Some worker hears the scheduler's verdict first; the other may first see the cascade of its exit (see
        # the note on dying nodes in tests/test_failures.py).
        messages = [assert_failed_with(node, NAMED_NODE).group(3) for node in job.workers]
        assert any(re.search(rf"server 0 .*{HOST}:{port}.*{re.escape(SILENCE)}", m) for m in messages), messages
        assert_exits_within([servers[1][0], job.scheduler], 1, stopped, HEARTBEAT_TIMEOUT - HEARTBEAT_INTERVAL,
                            LIVENESS_BOUND)
    finally:
        code = resume_and_reap(victim, pid)
    assert code != 0, victim.output
    assert SILENCE in job.scheduler.output, job.scheduler.output


def test_a_hung_worker_is_declared_dead_and_fails_the_job(nodes):
    job = Job(nodes, **FAST_HEARTBEAT)
    workers = job.worker_ranks()
    job.server_ports()
    job.wait_iteration(3)
    victim, pid = workers[1]
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        # Usually the scheduler's verdict; a server that heard it first may close the survivor's connection first.
        assert_failed_with(workers[0][0], NAMED_NODE)
        assert_exits_within(job.servers + [job.scheduler], 1, stopped, HEARTBEAT_TIMEOUT - HEARTBEAT_INTERVAL,
                            LIVENESS_BOUND)
    finally:
        code = resume_and_reap(victim, pid)
    assert code != 0, victim.output
    assert re.search(rf"worker 1 .*{re.escape(SILENCE)}", job.scheduler.output), \
        job.scheduler.output


def test_a_hung_scheduler_fails_every_node(nodes):
    job = Job(nodes, **FAST_HEARTBEAT)
    job.server_ports()
    job.wait_iteration(3)
    pid = job.scheduler.proc.pid
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        # The first node to fail names the scheduler; the others may first see the cascade of its exit.
        messages = [assert_failed_with(node, NAMED_NODE + "|scheduler").group(3) for node in job.workers]
        assert_exits_within(job.servers, 1, stopped, HEARTBEAT_TIMEOUT - HEARTBEAT_INTERVAL, LIVENESS_BOUND)
        assert any("no word from the scheduler" in m for m in messages) or \
            any("no word from the scheduler" in node.output for node in job.servers), messages
    finally:
        code = resume_and_reap(job.scheduler, pid)
    assert code != 0, job.scheduler.output


# ---- kill -9 beyond tests/test_failures.py ----

def test_killed_scheduler_fails_every_node(nodes):
    job = Job(nodes, **FAST_HEARTBEAT)
    job.server_ports()
    job.wait_iteration(3)
    job.scheduler.proc.kill()
    killed = time.monotonic()
    # The first worker to fail names the scheduler; the other may first see the cascade of its exit (see the note
    # on dying nodes in tests/test_failures.py).
    messages = [assert_failed_with(node, NAMED_NODE + "|scheduler").group(3) for node in job.workers]
    assert any("scheduler" in m for m in messages), messages
    # The servers fail too, naming the scheduler or (the cascade) a worker that exited.
    assert_exits_within(job.servers, 1, killed, 0, LIVENESS_BOUND)
    assert job.scheduler.finish() == -signal.SIGKILL


LATE_CONNECT_TIMEOUT = 0.5  # a worker that comes too late gives up after this


def test_a_server_killed_during_the_rendezvous_fails_the_job(nodes):
    port = free_port()
    env = dict(FAST_HEARTBEAT, P3_LOG_LEVEL="INFO", P3_CONNECT_TIMEOUT="4")
    scheduler, servers, early = start_rendezvous(nodes, port, **env)
    # Three of four nodes have registered; the rendezvous waits for the last worker. Kill a server now.
    servers[0].proc.kill()
    killed = time.monotonic()
    assert servers[0].finish() == -signal.SIGKILL
    assert_exits_within([scheduler, servers[1], early], 1, killed, 0, LIVENESS_BOUND)
    failure = scheduler.wait_for(r"ERROR p3kv\.core\[scheduler\]: (.*)$").group(1)
    assert re.search(r"server \d", failure), scheduler.output
    assert re.search(r"server \d", early.output), early.output
    # A worker that comes after the scheduler gave up cannot reach it: it fails after its P3_CONNECT_TIMEOUT.
    late = start_node(nodes, "worker process 1", [sys.executable, FAILURE_WORKER], "worker", port,
                      **{**env, "P3_CONNECT_TIMEOUT": str(LATE_CONNECT_TIMEOUT)})
    assert late.finish() == 1, late.output
    assert "cannot reach the scheduler" in late.output, late.output
    assert f"within {LATE_CONNECT_TIMEOUT:g} s" in late.output, late.output


# ---- a straggler ----

def test_a_straggling_worker_changes_nothing_but_the_time(nodes):
    job = Job(nodes, worker_args=("--iterations", "6", "--straggle", "1.5"))
    for node in job.workers:
        assert node.finish() == 0, node.output
        assert "done iterations=6" in node.output, node.output
        assert "WRONG" not in node.output and "FAILED" not in node.output, node.output
    for node in job.servers + [job.scheduler]:
        assert node.finish() == 0, node.output
    # Exactly one process got the last rank and straggled (ranks follow registration order, not start order).
    assert sum("straggle seed=" in node.output for node in job.workers) == 1, [n.output for n in job.workers]


def test_silent_connections_do_not_hold_up_the_rendezvous(nodes):
    # Handshakes run beside the scheduler's loop: ten connections that never answer the challenge (each may
    # take the 2 s handshake deadline) must not delay the real nodes. Served one after the other they would
    # need 20 s, past this job's P3_CONNECT_TIMEOUT of 8 s, and the rendezvous would fail.
    port = free_port()
    env = {"P3_CONNECT_TIMEOUT": "8"}
    scheduler = Node("scheduler", ROLE_COMMANDS["scheduler"], node_env("scheduler", port, 1, 1, **env))
    nodes.append(scheduler)
    deadline = time.monotonic() + STEP
    silent = []
    while not silent:
        try:
            silent.append(connect(port)[0])
        except OSError:
            assert time.monotonic() < deadline, scheduler.output
            time.sleep(0.05)
    silent += [connect(port)[0] for _ in range(9)]
    try:
        server = Node("server", [sys.executable, REPORT_SERVER], node_env("server", port, 1, 1, **env))
        worker = Node("worker", [sys.executable, FAILURE_WORKER, "--iterations", "3"],
                      node_env("worker", port, 1, 1, **env))
        nodes.extend([server, worker])
        assert worker.finish() == 0, worker.output + scheduler.output
        assert "done iterations=3" in worker.output
        assert server.finish() == 0 and scheduler.finish() == 0, scheduler.output
    finally:
        for s in silent:
            s.close()
