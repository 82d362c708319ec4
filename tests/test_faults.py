"""A node dies at every point of a job, and every other process learns of it within a bound and exits naming it.

Beyond tests/test_failures.py (kill -9 mid-training) and tests/test_security_liveness.py (hung nodes, a server
killed at the rendezvous):

- Rendezvous: the scheduler or a registered worker killed before the last node joined fails every node that
  registered at once, naming it; a node that dies before it registered cannot be named, so the rest fail after
  P3_CONNECT_TIMEOUT saying how many nodes registered.
- Shutdown: after the last iteration, one worker has closed and the other has not yet. Killing the scheduler, a
  server or the worker that has not closed fails the job: it cannot complete, so every survivor that was still
  part of it exits non-zero naming the dead node; the worker that had closed has all its results and exits 0.
  Killing a worker *after* its close() kills a node whose part is done: the job still completes and every
  other process exits 0 (only a launcher would report the SIGKILL). The launcher reports a death at shutdown.
- Network cut: a job across two emulated hosts (network namespaces) whose second host loses its link; both
  hosts' launchers exit non-zero within the default P3_HEARTBEAT_TIMEOUT of 10 s, naming the other side.
- MXNet: a Gluon script with kvstore='p3' whose server is killed gets an MXNetError and its launcher exits
  non-zero.
- Clean finish: every process exits 0, none is left, and the scheduler's port can be listened on again at once.

Built on the node-by-node helpers of tests/harness.py. Every wait has a hard timeout; processes are
synchronized through their output and through files the workers wait for, never by sleeping. Processes of
launched jobs carry JOB_TAG in their environment, which is how a test finds them in /proc.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import sys
import time

import pytest
from harness import (
    FAILURE_BOUND,
    FAILURE_WORKER,
    HOST,
    NAMED_NODE,
    REPORT_SERVER,
    ROLE_COMMANDS,
    SCRIPTS,
    SECRET,
    STEP,
    Job,
    Node,
    assert_failed_with,
    base_env,
    free_port,
    node_env,
    start_launcher,
    start_rendezvous,
)

from benchmarks.emulation import emulated_cluster

JOB_TAG = "P3KV_FAULT_TEST_JOB"  # set in the environment of launched jobs; children inherit it
GLUON_UNTIL_FAILURE = os.path.join(SCRIPTS, "gluon_until_failure.py")
EXIT_MXNET_ERROR = 7  # gluon_until_failure.py's exit code after an MXNetError
CONNECT_TIMEOUT = 4.0  # P3_CONNECT_TIMEOUT of the rendezvous tests (every node must register within it)
LATE_CONNECT_TIMEOUT = 0.5  # P3_CONNECT_TIMEOUT of a worker that comes after the job failed
DEFAULT_HEARTBEAT_TIMEOUT = 10.0  # P3_HEARTBEAT_TIMEOUT's default, the bound the issue sets; the network cut uses it
HEARTBEAT_TIMEOUT = 5.0  # P3_HEARTBEAT_TIMEOUT of the uneven-steps test
MARGIN = 5.0  # seconds on top of a detection bound for the processes to exit and the launcher to stop the rest


# ---- helpers ----

def job_processes(tag: str) -> list[int]:
    """Live processes whose environment has JOB_TAG=tag (a zombie's environment reads empty: not counted)."""
    needle = f"{JOB_TAG}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        if needle in environ:
            found.append(int(entry))
    return found


def role_pid(tag: str, role: str) -> int:
    """The pid of the launched job's only process with P3_ROLE=role."""
    pids = []
    for pid in job_processes(tag):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"P3_ROLE={role}".encode() in f.read().split(b"\0"):
                    pids.append(pid)
        except OSError:
            continue
    assert len(pids) == 1, f"processes with P3_ROLE={role}: {pids}"
    return pids[0]


@pytest.fixture
def tagged():
    """A fresh tag for a launched job; whatever still carries it at teardown is killed."""
    tag = secrets.token_hex(8)
    yield tag
    for pid in job_processes(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def release(prefix: str, rank: int) -> None:
    """Let a failure_worker.py holding on `prefix` (--hold-close/--hold-exit) go on."""
    with open(f"{prefix}{rank}", "w"):
        pass


class Naming:
    """Checks that a survivor's error lines name the dead node."""

    def check(self, node: Node, pattern: str) -> None:
        """Some error line of `node` (a C++ ERROR log, a role's last words, failure_worker's FAILED line, a
        traceback's last line) matches `pattern`."""
        lines = re.findall(r"^.*(?:ERROR|Error: |failed: |FAILED ).*$", node.output, re.MULTILINE)
        if not any(re.search(pattern, line) for line in lines):
            pytest.fail(f"{node.name}: no error line matches {pattern!r}; its output:\n{node.output}")


@pytest.fixture
def naming() -> Naming:
    return Naming()


def scheduler_named(port: int, host: str = HOST) -> str:
    """The pattern of a line naming the scheduler at host:port."""
    return rf"\bscheduler\b.*\b{re.escape(host)}:{port}\b"


# ---- rendezvous: a node dies before every node has registered ----

def assert_late_worker_cannot_join(nodes: list, port: int) -> None:
    """A worker that comes after the job failed finds no scheduler: it fails after P3_CONNECT_TIMEOUT."""
    late = Node("worker process 1", [sys.executable, FAILURE_WORKER],
                node_env("worker", port, P3_CONNECT_TIMEOUT=str(LATE_CONNECT_TIMEOUT)))
    nodes.append(late)
    assert late.finish() == 1, late.output
    assert "cannot reach the scheduler" in late.output, late.output
    assert f"within {LATE_CONNECT_TIMEOUT:g} s" in late.output, late.output


# (A server killed at the rendezvous: tests/test_security_liveness.py.)

@pytest.mark.integration
def test_a_worker_killed_at_the_rendezvous_fails_every_registered_node(nodes, naming):
    port = free_port()
    scheduler, servers, worker = start_rendezvous(nodes, port, P3_CONNECT_TIMEOUT=str(CONNECT_TIMEOUT))
    worker.proc.kill()
    killed = time.monotonic()
    assert worker.finish() == -signal.SIGKILL
    for node in [scheduler, *servers]:
        assert node.finish(FAILURE_BOUND) == 1, node.output
        naming.check(node, rf"worker 0 \({HOST}\) disconnected")
    assert time.monotonic() - killed < 3, "the registered nodes took longer than 3 s to fail"
    assert "ready rank" not in worker.output  # it had registered, but the rendezvous never completed
    assert_late_worker_cannot_join(nodes, port)


@pytest.mark.integration
def test_a_scheduler_killed_at_the_rendezvous_fails_every_registered_node(nodes, naming):
    port = free_port()
    scheduler, servers, worker = start_rendezvous(nodes, port, P3_CONNECT_TIMEOUT=str(CONNECT_TIMEOUT))
    scheduler.proc.kill()
    killed = time.monotonic()
    named = scheduler_named(port)
    for node in [*servers, worker]:
        assert node.finish(FAILURE_BOUND) == 1, node.output
        assert re.search(rf"rendezvous with the scheduler at {HOST}:{port} failed", node.output), node.output
        naming.check(node, named)
    assert time.monotonic() - killed < 3, "the registered nodes took longer than 3 s to fail"
    assert scheduler.finish() == -signal.SIGKILL
    assert_late_worker_cannot_join(nodes, port)


@pytest.mark.integration
def test_a_node_killed_before_it_registered_fails_the_rest_after_the_connect_timeout(nodes, naming):
    port = free_port()
    # The victim starts before the scheduler listens (it keeps retrying to connect) and dies before it exists, so
    # it can never have registered: to the others it is a node that never came.
    victim = Node("worker process 1", [sys.executable, FAILURE_WORKER], node_env("worker", port))
    nodes.append(victim)
    victim.proc.kill()
    assert victim.finish() == -signal.SIGKILL
    started = time.monotonic()
    scheduler, servers, worker = start_rendezvous(nodes, port, P3_CONNECT_TIMEOUT=str(CONNECT_TIMEOUT))
    counts = r"only 2 of 2 servers and 1 of 2 workers registered within 4 s \(P3_CONNECT_TIMEOUT\)"
    # The scheduler judges the rendezvous; the registered nodes' own waits for the node table end a grace later
    # (only a hung scheduler lets them run out), so no healthy node leaves first and every survivor names the
    # missing worker, never a live node. A loaded scheduler is late with its verdict: stopped from before its
    # deadline until well after the registered nodes' P3_CONNECT_TIMEOUT has run out (which used to make them
    # leave first, so that the others blamed a live node).
    time.sleep(max(0.0, started + CONNECT_TIMEOUT - 1 - time.monotonic()))
    os.kill(scheduler.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(max(0.0, started + CONNECT_TIMEOUT + 3 - time.monotonic()))
    finally:
        os.kill(scheduler.proc.pid, signal.SIGCONT)
    assert scheduler.finish(CONNECT_TIMEOUT + MARGIN) == 1, scheduler.output
    naming.check(scheduler, counts)
    for node in [*servers, worker]:
        assert node.finish(CONNECT_TIMEOUT + MARGIN) == 1, node.output
        naming.check(node, counts)
        assert "did not complete the rendezvous" not in node.output and "disconnected" not in node.output, node.output
    elapsed = time.monotonic() - started
    assert CONNECT_TIMEOUT - 0.5 < elapsed < 2 * CONNECT_TIMEOUT + MARGIN, f"failed after {elapsed:.1f} s"


# ---- shutdown: a node dies while the job is closing ----

SHUTDOWN_VICTIMS = ["scheduler", "server 0", "worker 1 before close", "worker 1 after close"]


@pytest.mark.integration
@pytest.mark.parametrize("victim", SHUTDOWN_VICTIMS)
def test_a_node_killed_at_shutdown(victim, nodes, tmp_path, naming):
    close, leave = f"{tmp_path}/close", f"{tmp_path}/exit"
    args = ["--iterations", "3", "--hold-close", close]
    if victim == "worker 1 after close":
        args += ["--hold-exit", leave]
        release(leave, 0)
    job = Job(nodes, worker_args=tuple(args))
    workers = job.worker_ranks()
    servers = job.server_ports()
    for node in job.workers:
        node.wait_for(r"^holding close after iteration 3$")

    if victim == "worker 1 after close":
        # Worker 1 has every result and has left; its death changes nothing. Worker 0 closes after it died.
        release(close, 1)
        workers[1][0].wait_for(r"^done iterations=3$")
        os.kill(workers[1][1], signal.SIGKILL)
        assert workers[1][0].finish() == -signal.SIGKILL
        release(close, 0)
        for node in [workers[0][0], *job.servers, job.scheduler]:
            assert node.finish() == 0, node.output
        assert "done iterations=3" in workers[0][0].output
        return

    # Worker 0 closes: its results are complete, so it exits 0 whatever happens next.
    release(close, 0)
    first = workers[0][0]
    assert first.finish() == 0, first.output
    assert "done iterations=3" in first.output
    # Worker 1, alive and holding its close(), fails too when the scheduler or a server dies; a server that hears
    # of it from worker 1 first still names the dead node (worker 1's last words carry the reason).
    if victim == "scheduler":
        dead = job.scheduler
        named = scheduler_named(job.port)
        job.scheduler.proc.kill()
    elif victim == "server 0":
        dead, pid, port = servers[0]
        named = rf"server 0 (at |\(){HOST}:{port}\b"
        os.kill(pid, signal.SIGKILL)
    else:
        dead, pid = workers[1]
        named = rf"worker 1 \({HOST}[:)]"
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    services = [node for node in [job.scheduler, *job.servers] if node is not dead]
    for node in services:
        assert node.finish(FAILURE_BOUND) == 1, node.output
        naming.check(node, named)
    if victim != "worker 1 before close":
        # Worker 1 still owed its close(): it learns of the death on its own, while idle, and its close() fails.
        holder = workers[1][0]
        holder.wait_for(r"ERROR p3kv\.core\[worker 1\]: ", FAILURE_BOUND)
        release(close, 1)
        assert_failed_with(holder, NAMED_NODE + "|scheduler")
        naming.check(holder, named)
    assert time.monotonic() - killed < FAILURE_BOUND
    assert dead.finish() == -signal.SIGKILL


@pytest.mark.integration
def test_a_scheduler_killed_at_shutdown_fails_the_launched_job(nodes, tmp_path, tagged):
    close = f"{tmp_path}/close"
    job = start_launcher(nodes, "launcher", ["-n", "2", "-s", "2", "--timeout", "60"],
                   [sys.executable, FAILURE_WORKER, "--iterations", "3", "--hold-close", close],
                   base_env(**{JOB_TAG: tagged}))
    for rank in (0, 1):
        job.wait_for(rf"^\[worker {rank}\] holding close after iteration 3$")
    release(close, 0)
    job.wait_for(r"^\[worker \d\] done iterations=3$")
    os.kill(role_pid(tagged, "scheduler"), signal.SIGKILL)
    killed = time.monotonic()
    assert job.finish(FAILURE_BOUND) == 1, job.output
    assert time.monotonic() - killed < FAILURE_BOUND
    assert "scheduler was killed by SIGKILL; stopped all other processes" in job.output, job.output
    assert job_processes(tagged) == [], "processes of the job outlived its launcher"


# ---- a network cut between two hosts ----

@pytest.mark.system
def test_a_host_cut_off_the_network_fails_both_hosts_within_the_heartbeat_timeout(nodes, naming):
    reason = emulated_cluster.why_unavailable()
    if reason:
        pytest.skip(f"emulated cluster unavailable: {reason}")
    port = 9000  # the namespaces are this test's own: nothing else listens there
    with emulated_cluster.EmulatedCluster(2) as cluster:
        root = cluster.address(0)
        common = ["-n", "2", "-s", "2", "--port", str(port), "--local-workers", "1", "--local-servers", "1",
                  "--server-command", f"{sys.executable} {REPORT_SERVER}", "--timeout", "120"]
        here = {"P3_SECRET": SECRET}  # the same on both hosts; P3_HEARTBEAT_* stay at their defaults
        hosts = [
            start_launcher(nodes, "host 0 launcher", ["--host", root, *common], [sys.executable, FAILURE_WORKER],
                     base_env(**here), lambda argv: cluster.wrap(0, argv)),
            start_launcher(nodes, "host 1 launcher", ["--host", cluster.address(1), "--root", root, "--no-scheduler",
                                                *common], [sys.executable, FAILURE_WORKER],
                     base_env(**here), lambda argv: cluster.wrap(1, argv)),
        ]
        for node in hosts:
            node.wait_for(r"^\[worker 0\] iteration 3 ok$", STEP * 2)
        cluster.set_link(1, up=False)
        cut = time.monotonic()
        bound = DEFAULT_HEARTBEAT_TIMEOUT + MARGIN
        for node in hosts:
            assert node.finish(bound) != 0, node.output
        elapsed = time.monotonic() - cut
        # Only the heartbeats can tell (no connection is closed): not before most of the timeout has passed.
        assert DEFAULT_HEARTBEAT_TIMEOUT - 2 < elapsed < bound, f"both hosts failed {elapsed:.1f} s after the cut"
    # Host 0 names a node of host 1 (whichever the scheduler found silent first); host 1 names the scheduler.
    naming.check(hosts[0], rf"(server|worker) \d \({re.escape(cluster.address(1))}[:)].*sent nothing for 10 s "
                           r"\(P3_HEARTBEAT_TIMEOUT\)")
    assert f"no word from the scheduler at {root}:{port} for 10 s (P3_HEARTBEAT_TIMEOUT)" in hosts[1].output, \
        hosts[1].output
    naming.check(hosts[1], scheduler_named(port, root))
    for node in hosts:
        assert re.search(r"p3kv\.launch: ERROR: .* stopped all other processes", node.output), node.output


# ---- MXNet: a training script blocked on a dead server gets MXNetError ----

@pytest.mark.mxnet
def test_a_server_killed_under_gluon_raises_mxnet_error_and_fails_the_launcher(nodes, tagged):
    pytest.importorskip("mxnet")
    port = free_port()
    # The scheduler and servers run by hand; the worker under its own launcher, as on a host of its own, so the
    # launcher does not stop it before it reports what MXNet raised.
    scheduler = Node("scheduler", ROLE_COMMANDS["scheduler"], node_env("scheduler", port, workers=1))
    servers = [Node(f"server process {i}", [sys.executable, REPORT_SERVER], node_env("server", port, workers=1))
               for i in range(2)]
    nodes += [scheduler, *servers]
    job = start_launcher(nodes, "worker launcher", ["-n", "1", "-s", "2", "--host", HOST, "--root", HOST, "--port",
                                              str(port), "--no-scheduler", "--local-servers", "0", "--timeout", "120"],
                   [sys.executable, GLUON_UNTIL_FAILURE], base_env(P3_SECRET=SECRET, **{JOB_TAG: tagged}))
    ports = {}
    for node in servers:
        m = node.wait_for(r"^server rank=(\d) pid=(\d+) port=(\d+)$")
        ports[int(m.group(1))] = (node, int(m.group(2)), int(m.group(3)))
    job.wait_for(r"^\[worker 0\] step 3$", STEP * 3)  # importing MXNet takes a while
    victim, pid, victim_port = ports[0]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    assert job.finish(FAILURE_BOUND) == EXIT_MXNET_ERROR, job.output
    assert time.monotonic() - killed < FAILURE_BOUND
    error = job.wait_for(r"^\[worker 0\] MXNETERROR after [\d.]+ s: (.*)$").group(1)
    assert re.search(rf"server 0 (at |\(){HOST}:{victim_port}\b", error), error
    assert f"worker 0 exited with code {EXIT_MXNET_ERROR}; stopped all other processes" in job.output
    # At exit the kvstore says once, in one line, that it closed after the failure (no second traceback).
    assert "Exception ignored in atexit" not in job.output, job.output
    assert "kvstore 'p3' closes after a failed operation" in job.output, job.output
    for node in (scheduler, ports[1][0]):
        assert node.finish(FAILURE_BOUND) == 1, node.output
    assert victim.finish() == -signal.SIGKILL
    assert job_processes(tagged) == []


# ---- MXNet: uneven steps (a worker closes while another still trains) ----

GLUON_TRAIN = os.path.join(SCRIPTS, "gluon_train.py")


@pytest.mark.mxnet
def test_uneven_steps_fail_every_process_naming_the_worker_iteration_and_key(nodes, tagged, tmp_path):
    """Worker 1 runs 3 steps and closes cleanly, worker 0 runs 5: worker 0 must not wait for ever. Its servers
    know at once that iteration 4 needs worker 1, so the script gets MXNetError naming worker 1, its last
    iteration and the key, and every process still in the job exits non-zero, well within the heartbeat timeout
    (nothing needs the heartbeats: worker 1 said goodbye)."""
    pytest.importorskip("mxnet")
    heartbeat = {"P3_HEARTBEAT_INTERVAL": "0.5", "P3_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT)}
    port = free_port()
    # The scheduler and servers by hand, the workers under a launcher of their own, so that the launcher does not
    # stop worker 0 (when a server exits first) before it reports what MXNet raised.
    scheduler = Node("scheduler", ROLE_COMMANDS["scheduler"], node_env("scheduler", port, **heartbeat))
    servers = [Node(f"server process {i}", [sys.executable, REPORT_SERVER], node_env("server", port, **heartbeat))
               for i in range(2)]
    nodes += [scheduler, *servers]
    job = start_launcher(nodes, "worker launcher", ["-n", "2", "-s", "2", "--host", HOST, "--root", HOST, "--port",
                                              str(port), "--no-scheduler", "--local-servers", "0", "--timeout", "120"],
                   [sys.executable, GLUON_TRAIN, "p3", str(tmp_path), "--rank-steps", "5,3"],
                   base_env(P3_SECRET=SECRET, P3_SLICE_SIZE="50", **heartbeat, **{JOB_TAG: tagged}))
    # (The launcher's [worker N] prefix numbers its processes; the kvstore's rank follows registration order.)
    job.wait_for(r"^\[worker \d\] rank 1 done", STEP * 3)  # importing MXNet takes a while
    left = time.monotonic()
    assert job.finish(FAILURE_BOUND) != 0, job.output
    # The cause, as the script sees it: worker 1, its last iteration (3) and the key.
    error = job.wait_for(r"^\[worker \d\] rank 0: MXNetError after [\d.]+ s of training: (.*)$").group(1)
    cause = r"worker 1 has left the job \(it closed after its iteration 3 of key \d+\), so iteration 4 of key \d+"
    assert re.search(cause, error), error
    for node in (scheduler, *servers):
        assert node.finish(FAILURE_BOUND) == 1, node.output
        assert re.search(cause, node.output), node.output
    elapsed = time.monotonic() - left
    # Worker 0 still computes steps 4 and 5 (well under a second each) and Python exits: no heartbeat is waited on.
    assert elapsed < 2 * HEARTBEAT_TIMEOUT, f"the job ended {elapsed:.1f} s after worker 1 left"
    assert job_processes(tagged) == []


# ---- a clean finish ----

@pytest.mark.integration
def test_a_clean_finish_exits_0_everywhere_leaves_nothing_and_frees_the_port(nodes, tagged):
    port = free_port()
    job = start_launcher(nodes, "launcher", ["-v", "-n", "2", "-s", "2", "--port", str(port), "--timeout", "60"],
                   [sys.executable, FAILURE_WORKER, "--iterations", "3"], base_env(**{JOB_TAG: tagged}))
    assert job.finish(STEP * 2) == 0, job.output
    assert "all 5 processes exited with code 0" in job.output, job.output
    assert sorted(re.findall(r"^\[worker (\d)\] done iterations=3$", job.output, re.MULTILINE)) == ["0", "1"]
    assert job_processes(tagged) == [], "processes of the job outlived its launcher"
    # The scheduler listens with SO_REUSEADDR (connections it closed may linger in TIME_WAIT): so does the check.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((HOST, port))
        s.listen()


@pytest.mark.mxnet
def test_closing_at_exit_after_a_failure_mxnet_already_rethrew_logs_one_line(caplog):
    # The race CI met: the script caught MXNet's error, so waitall at exit is quiet and the core's close raises
    # the failure again; at exit that must be one line, not "Exception ignored in atexit" and a traceback.
    pytest.importorskip("mxnet")
    from p3kv.core.errors import P3Error
    from p3kv.mxnet.forward_order import ForwardOrder
    from p3kv.mxnet.kvstore import P3

    class FailedWorker:
        closes = 0

        def close(self):
            FailedWorker.closes += 1
            raise P3Error("lost server 0 at 127.0.0.1:1 (connection closed by peer)")

    kv = P3.__new__(P3)
    kv._closed, kv._order, kv._worker = False, ForwardOrder(), FailedWorker()
    with caplog.at_level("WARNING", logger="p3kv"):
        kv._close_at_exit()
        kv._close_at_exit()  # idempotent: registered once per kvstore, but close() may have run already
    assert FailedWorker.closes == 1
    lines = [r.getMessage() for r in caplog.records if "closes after a failed operation" in r.getMessage()]
    assert lines == ["kvstore 'p3' closes after a failed operation: lost server 0 at 127.0.0.1:1 (connection "
                     "closed by peer)"], caplog.text
    with pytest.raises(P3Error, match="lost server 0"):  # called by hand, close still raises
        kv2 = P3.__new__(P3)
        kv2._closed, kv2._order, kv2._worker = False, ForwardOrder(), FailedWorker()
        kv2.close()
