"""Failure behaviour of real p3kv processes on loopback: bad configuration fails fast with a message naming the
variable; malformed connections to a server (failing the secret handshake, or authenticated with the job's secret
but sending bad frames) are refused and logged while a job keeps computing correct sums; a node killed with
SIGKILL or an update function that raises makes every blocked wait raise P3Error within a bound and every process
exit non-zero. tests/test_security_liveness.py covers the secret and heartbeats further.

Jobs are started process by process (scheduler, servers, workers) with explicit P3_* environments through
tests/harness.py, so each exit code and each process's output can be checked. The servers run
tests/scripts/report_server.py, which prints its rank, pid and port once it joined; the workers run
tests/scripts/failure_worker.py (see its docstring). Every wait has a hard timeout; processes are synchronized
through their output, never by sleeping; a test's processes are killed at teardown if it failed half-way.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

import p3auth
import pytest
from frames import BIG_ENDIAN, HELLO, MAGIC, NODE_FAILED, PUSH, VERSION, header
from harness import (
    FAILURE_BOUND,
    FAILURE_WORKER,
    HOST,
    MISUSE_WORKER,
    NAMED_NODE,
    RAISING_SERVER,
    REPORT_SERVER,
    ROLE_COMMANDS,
    SCRIPTS,
    SECRET,
    STEP,
    Job,
    Node,
    assert_failed_with,
    bad_frame,
    base_env,
    free_port,
    launcher_argv,
    node_env,
    refused_reason,
    run_launcher,
    run_node,
)

pytestmark = pytest.mark.integration


# ---- configuration: fail fast, name the variable ----


@pytest.mark.parametrize("role", ROLE_COMMANDS)
def test_missing_root_port_fails_at_once_naming_it(role):
    # P3_CONNECT_TIMEOUT stays long: a node that tried to connect anyway would show up as a hang.
    code, output, seconds = run_node(ROLE_COMMANDS[role], node_env(role, None, P3_CONNECT_TIMEOUT="60"))
    assert code == 1, output
    assert f"P3_ROOT_PORT not set for this {role}" in output, output
    assert seconds < 10, output


@pytest.mark.parametrize("role", ROLE_COMMANDS)
def test_malformed_number_fails_at_once_naming_it(role):
    code, output, _ = run_node(ROLE_COMMANDS[role], node_env(role, free_port(), P3_NUM_WORKER="abc",
                                                             P3_CONNECT_TIMEOUT="60"))
    assert code == 1, output
    assert "P3_NUM_WORKER='abc' is not a valid int" in output, output


def test_scheduler_port_in_use_fails_at_once():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind((HOST, 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, output, seconds = run_node(ROLE_COMMANDS["scheduler"], node_env("scheduler", port))
    assert code == 1, output
    assert f"port {port} on {HOST} is already in use" in output and "P3_ROOT_PORT" in output, output
    assert seconds < 10, output


# The role's start (P3Server() / P3Worker(), which join the job), timed inside the process: the interpreter's
# start-up, which takes seconds on a loaded machine, is not part of what a connect timeout bounds.
TIMED_JOIN = {
    "server": "from p3kv.mxnet.server import main",
    "worker": "from p3kv import P3Worker\ndef main():\n    P3Worker()",
}
TIMED = "import sys, time\n{start}\nt = time.monotonic()\ntry:\n    code = main()\nfinally:\n" \
    "    print(f'joining took {{time.monotonic() - t:.3f}} s', flush=True)\nsys.exit(code)"
CONNECT_TIMEOUT = 0.5  # P3_CONNECT_TIMEOUT of the test that waits it out


@pytest.mark.parametrize("role", ["server", "worker"])
def test_unreachable_scheduler_fails_after_the_connect_timeout(role):
    # A bound socket that does not listen: connecting to it is refused, and no other process can take the port.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
        closed.bind((HOST, 0))
        port = closed.getsockname()[1]
        code, output, _ = run_node([sys.executable, "-c", TIMED.format(start=TIMED_JOIN[role])],
                                   node_env(role, port, P3_CONNECT_TIMEOUT=str(CONNECT_TIMEOUT)))
    assert code == 1, output
    assert f"cannot reach the scheduler at P3_ROOT_URI={HOST} P3_ROOT_PORT={port}" in output, output
    assert f"within {CONNECT_TIMEOUT:g} s" in output, output
    seconds = float(re.search(r"^joining took ([\d.]+) s$", output, re.MULTILINE).group(1))
    assert CONNECT_TIMEOUT <= seconds < 3 * CONNECT_TIMEOUT, \
        f"failed after {seconds:.2f} s, expected about P3_CONNECT_TIMEOUT={CONNECT_TIMEOUT:g}:\n{output}"
    if role == "worker":
        assert "P3TimeoutError" in output, output


@pytest.mark.parametrize("role, variable", [("worker", "P3_NUM_WORKER"), ("server", "P3_NUM_SERVER")])
def test_mismatched_job_size_fails_both_ends(role, variable, nodes):
    port = free_port()
    scheduler = Node("scheduler", ROLE_COMMANDS["scheduler"], node_env("scheduler", port, workers=2, servers=1))
    nodes.append(scheduler)
    # The node retries its connection until the scheduler listens (P3_CONNECT_TIMEOUT), so no ordering is needed.
    node = Node(role, ROLE_COMMANDS[role], node_env(role, port, workers=2, servers=1, **{variable: "3"}))
    nodes.append(node)
    start = time.monotonic()
    assert node.finish() == 1, node.output
    assert scheduler.finish() == 1, scheduler.output
    assert time.monotonic() - start < 10, node.output + scheduler.output
    sizes = "P3_NUM_WORKER=3 P3_NUM_SERVER=1" if role == "worker" else "P3_NUM_WORKER=2 P3_NUM_SERVER=3"
    for output in (node.output, scheduler.output):
        assert f"a {role} at {HOST} was started with {sizes} but the scheduler with P3_NUM_WORKER=2 " \
               "P3_NUM_SERVER=1: give every node the same values" in output, output
    assert re.search(r"the scheduler at \S+ refused this node", node.output), node.output


# ---- misuse of the API: ConfigError, and the job goes on ----

def test_shape_dtype_and_unknown_keys_raise_config_error_and_the_job_completes():
    result = run_launcher("-n", "2", "-s", "2", "--timeout", "60", "--", sys.executable, MISUSE_WORKER,
                          env=base_env(), stdin=subprocess.DEVNULL, timeout=STEP * 2)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = {
        "push-shape": "push of key 'w': gradient has shape (2501,) and dtype float32, but the key was initialised "
                      "with shape (2500,) and dtype float32",
        "push-dtype": "push of key 'w': gradient has shape (2500,) and dtype float64, but the key was initialised "
                      "with shape (2500,) and dtype float32",
        "push-2d": "gradient has shape (2500, 1)",
        "push-out-shape": "out for key 'w' has shape (2499,) and dtype float32; expected (2500,) and float32",
        "push-unknown": "key 'nope' is unknown: call init('nope', value) first",
        "wait-unknown": "key 'nope' is unknown: call init('nope', value) first",
        "init-twice": "key 'w' is already initialised",
    }
    for worker in ("0", "1"):
        lines = [line.split("] ", 1)[1] for line in result.stdout.splitlines()
                 if line.startswith(f"[worker {worker}] ")]
        for case, message in expected.items():
            assert any(line.startswith(f"REJECTED {case} ConfigError: ") and message in line for line in lines), \
                f"worker {worker}, {case}: no ConfigError with {message!r} in:\n{result.stdout}"
        assert not any(line.startswith("ACCEPTED") for line in lines), result.stdout
    assert sorted(re.findall(r"^\[worker \d\] sum ok rank=(\d)$", result.stdout, re.MULTILINE)) == ["0", "1"], \
        result.stdout


# ---- malformed connections to a server during a job ----

UNAUTHENTICATED = "the peer does not know the job's secret (P3_SECRET)"
HANDSHAKE_ENDED = "connection ended during the handshake (answer to the challenge)"

# Connections that fail the handshake: name -> (a function that behaves badly on a fresh socket, the reason).
BAD_HANDSHAKES = {
    "garbage": (lambda s: s.sendall(bytes(range(256))), UNAUTHENTICATED),
    "silent": (lambda s: None, HANDSHAKE_ENDED),
    "truncated answer": (lambda s: s.sendall(bytes(30)), HANDSHAKE_ENDED),
    "frame instead of answer": (lambda s: s.sendall(header(HELLO)), UNAUTHENTICATED),
    "wrong secret": (lambda s: p3auth.authenticate(s, "not the job's secret"), UNAUTHENTICATED),
    "no secret": (lambda s: p3auth.authenticate(s, ""), UNAUTHENTICATED),
}

# Connections that authenticate with the job's secret, then send bytes that are not a valid HELLO.
BAD_FRAMES = {
    # name: (bytes to send after the handshake, before closing; the reason the server must log)
    "garbage": (bytes(range(256)), "bad magic"),
    "bad magic": (header(HELLO, magic=0x12345678), "bad magic"),
    "bad version": (header(HELLO, version=7), f"protocol version 7, expected {VERSION}"),
    "oversized payload": (header(HELLO, payload_bytes=2**40),
                          "payload of 1099511627776 bytes exceeds the limit of 1073741824 (P3_MAX_MESSAGE_BYTES)"),
    "truncated frame": (header(PUSH, count=250, payload_bytes=1000) + bytes(10), "expected HELLO, got PUSH"),
    "truncated header": (header(HELLO)[:30], "connection closed in the middle of a frame (truncated)"),
    "silent": (b"", "connection closed by peer"),
    "HELLO with payload": (header(HELLO, payload_bytes=8) + bytes(8), "HELLO with a 8-byte payload"),
    "unknown worker": (header(HELLO, sender=7), "HELLO from worker rank 7, but the job has 2 workers"),
    "impostor": (header(HELLO, sender=0), "a second connection claims to be worker 0"),
    "other byte order": (header(HELLO, sender=1, byte_order=BIG_ENDIAN),
                         "worker 1 sends payloads in big-endian byte order, this server's host is little-endian"),
}


def bad_handshake(port: int, behave) -> int:
    """Connect to `port`, misbehave during the handshake, close; our local port."""
    with socket.create_connection((HOST, port), timeout=STEP) as s:
        local_port = s.getsockname()[1]
        try:
            behave(s)
        except ConnectionError:
            pass  # the acceptor hung up on a wrong answer: what we test
    return local_port


def test_malformed_connections_are_refused_while_the_job_computes_correct_sums(nodes, tmp_path):
    stop = tmp_path / "stop"
    job = Job(nodes, worker_args=("--stop-file", str(stop)))
    rank0, _, port = job.server_ports()[0]
    job.wait_iteration(2)  # both workers are connected and pushing
    handshakes = {name: refused_reason(rank0, "server 0", bad_handshake(port, behave))
                  for name, (behave, _) in BAD_HANDSHAKES.items()}
    frames = {name: refused_reason(rank0, "server 0", bad_frame(port, data)) for name, (data, _) in BAD_FRAMES.items()}
    # A worker of another p3kv version is told why before the server closes: the frame it gets is of this version
    # (it refuses it in turn, naming both versions).
    with socket.create_connection((HOST, port), timeout=STEP) as s:
        p3auth.authenticate(s, SECRET)
        s.sendall(header(HELLO, sender=1, version=2))
        magic, version, command, _, _, sender, *_, payload_bytes = struct.unpack("<IHBBiiBBHIQQQQQ",
                                                                               p3auth.recv_exactly(s, 64))
        why = p3auth.recv_exactly(s, payload_bytes).decode()
    assert (magic, version, command, sender) == (MAGIC, VERSION, NODE_FAILED, 0), (magic, version, command, sender)
    assert why == (f"server 0 refused this worker: protocol version 2, expected {VERSION} (mixed p3kv versions in "
                   "one job?)"), why
    # The job kept going: every worker completes further iterations (each checked against numpy), then stops.
    last = max(int(n) for n in re.findall(r"^iteration (\d+) ok$", job.workers[0].output, re.MULTILINE))
    job.wait_iteration(last + 3)
    stop.touch()
    for node in job.workers:
        assert node.finish() == 0, node.output
        assert "WRONG" not in node.output and "FAILED" not in node.output, node.output
    done = {node.wait_for(r"^done iterations=(\d+)$").group(1) for node in job.workers}
    assert len(done) == 1 and int(done.pop()) >= last + 3
    for node in job.servers + [job.scheduler]:
        assert node.finish() == 0, node.output
    for logged, expected in ((handshakes, BAD_HANDSHAKES), (frames, BAD_FRAMES)):
        for name, (_, reason) in expected.items():
            assert reason in logged[name], f"{name}: the server logged {logged[name]!r}, expected {reason!r}"


# ---- a node dies ----
#
# Which message a worker gets depends on which news reaches it first: its own connection to the dead node, the
# scheduler's NODE_FAILED, or a server that already failed closing its connection (a cascade: the first worker to
# fail exits, which fails the servers, which drop the other workers). Under load the later ones can name a node
# that died of the cascade. Causality still fixes some things: nothing but the victim fails before some peer of
# the victim notices its death, so the first failure report names the victim. With one worker there is no cascade
# before the worker fails, so its message must name the victim.

@pytest.mark.parametrize("workers", [1, 2])
def test_killed_server_fails_every_blocked_wait_and_the_job(workers, nodes):
    job = Job(nodes, workers=workers)  # the workers loop until something fails
    servers = job.server_ports()
    job.wait_iteration(3)
    victim, pid, port = servers[0]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    named_victim = rf"server 0 (at |\(){HOST}:{port}\b"
    messages = [assert_failed_with(node, NAMED_NODE).group(3) for node in job.workers]
    assert any(re.search(named_victim, m) for m in messages), messages
    if workers == 1:
        assert re.search(named_victim, messages[0]), messages
    assert victim.finish(FAILURE_BOUND) == -signal.SIGKILL
    for node in [job.scheduler, servers[1][0]]:
        assert node.finish(FAILURE_BOUND) == 1, node.output
    assert "scheduler failed: " in job.scheduler.output
    assert time.monotonic() - killed < FAILURE_BOUND


def test_killed_worker_fails_the_other_workers_wait_and_the_job(nodes):
    job = Job(nodes)
    workers = job.worker_ranks()
    job.server_ports()
    job.wait_iteration(3)
    victim, pid = workers[1]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    # The survivor hears "the job failed: worker 1 ... disconnected" from the scheduler, or sees a server that
    # noticed first close its connection ("lost server N ...").
    assert_failed_with(workers[0][0], NAMED_NODE)
    assert victim.finish(FAILURE_BOUND) == -signal.SIGKILL
    for node in job.servers + [job.scheduler]:
        assert node.finish(FAILURE_BOUND) == 1, node.output
    assert time.monotonic() - killed < FAILURE_BOUND
    # Whoever noticed first (a server or the scheduler: worker 1's only peers) logged the real cause.
    logs = "".join(node.output for node in job.servers + [job.scheduler])
    assert re.search(rf"worker 1 \({HOST}\) disconnected", logs), logs


def kill_reported(output: str) -> None:
    """SIGKILL the processes whose pids a launched job's servers and workers printed (for a test that failed
    before its launcher stopped them)."""
    for pid in re.findall(r"^\[(?:server|worker) \d\] (?:server|ready) rank=\d+ pid=(\d+)", output, re.MULTILINE):
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_killed_server_fails_the_launched_job():
    launcher = Node("launcher", launcher_argv("-n", "2", "-s", "2", "--timeout", "60", "--server-command",
                                              f"{sys.executable} {REPORT_SERVER}", "--", sys.executable,
                                              FAILURE_WORKER), base_env())
    try:
        m = launcher.wait_for(r"^\[(server \d)\] server rank=\d pid=(\d+) port=\d+$")
        for worker in ("0", "1"):
            launcher.wait_for(rf"^\[worker {worker}\] iteration 3 ok$")
        os.kill(int(m.group(2)), signal.SIGKILL)
        assert launcher.finish(FAILURE_BOUND) == 1, launcher.output
    finally:
        if launcher.proc.poll() is None:
            launcher.kill()
            launcher.finish()
            kill_reported(launcher.output)
    assert f"{m.group(1)} was killed by SIGKILL; stopped all other processes" in launcher.output


# ---- an update function that raises ----

@pytest.mark.parametrize("workers", [1, 2])
def test_raising_update_function_fails_the_wait_with_its_message(workers, nodes):
    job = Job(nodes, workers=workers, server_script=RAISING_SERVER, worker_args=("--iterations", "5"))
    boom = r"server \d+ at .* rejected key '(weight|stop)' \(iteration 2\): the update function failed: " \
           r".*ValueError: boom"
    failures = []
    for node in job.workers:
        node.wait_for(r"^iteration 1 ok$")
        failures.append(assert_failed_with(node, NAMED_NODE))
        assert "iteration 2 ok" not in node.output
    # The first worker to fail hears of the update function's error: nothing else failed before. With two
    # workers, the other may first see the cascade of the first one's exit (see the note on dying nodes).
    booms = [m for m in failures if re.search(boom, m.group(3))]
    assert booms if workers > 1 else len(booms) == 1, [m.group(0) for m in failures]
    assert all(float(m.group(2)) < 5 for m in booms), [m.group(0) for m in booms]
    # Workers that leave without close() end the job: the servers and the scheduler fail too.
    for node in job.servers + [job.scheduler]:
        assert node.finish(FAILURE_BOUND) == 1, node.output
    assert any(re.search(r"rejected a request from worker \d .*the update function failed: .*ValueError: boom",
                         node.output) for node in job.servers), "".join(node.output for node in job.servers)


def test_failed_update_does_not_strand_the_next_iteration(job_runner):
    result = job_runner(2, 1, [os.path.join(SCRIPTS, "strand_worker.py")], server_script="raising_server.py",
                        timeout=60)
    assert result.returncode == 0, result.stdout
    for rank in (0, 1):
        assert re.search(rf"rank {rank} iteration 2 failed: .*boom", result.stdout), result.stdout
        assert f"rank {rank} iteration 3 ok" in result.stdout
