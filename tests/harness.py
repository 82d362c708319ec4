"""The one way tests start p3kv processes: the launcher (run to its end, or started and watched line by line) and
jobs started node by node (scheduler, servers, workers) with explicit P3_* environments, so that each exit code
and each process's output can be checked.

Every wait has a hard timeout; processes are synchronized through their output, never by sleeping; whatever a
test started is killed at teardown (the `nodes` fixture of conftest.py holds the Node objects).
"""

from __future__ import annotations

import os
import queue
import random
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import hang_report
import p3auth
import pytest

REPO = Path(__file__).resolve().parent.parent
ROOT = str(REPO)
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
FAILURE_WORKER = os.path.join(SCRIPTS, "failure_worker.py")
MISUSE_WORKER = os.path.join(SCRIPTS, "misuse_worker.py")
REPORT_SERVER = os.path.join(SCRIPTS, "report_server.py")
RAISING_SERVER = os.path.join(SCRIPTS, "raising_server.py")
STEP = 20.0  # seconds: no single wait of the node-by-node tests may take longer
FAILURE_BOUND = 10.0  # seconds from a node's death to every other process's exit
HOST = "127.0.0.1"
SECRET = secrets.token_hex(16)  # P3_SECRET of the jobs started node by node
# A node named in an error message. Which node a survivor names depends on which news reaches it first (see
# tests/test_failures.py's note on dying nodes).
NAMED_NODE = r"\b(server|worker) \d+\b"


# ---- environments ----

def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A port free now and outside the kernel's ephemeral range. A port picked inside it (bind to 0) can be taken
    as the source port of any client connection before the node that is to listen on it starts: the floods in
    test_hostile open thousands, and a server then failed to listen."""
    low, high = _ephemeral_range()
    candidates = list(range(10000, low)) if low > 11000 else list(range(high + 1, 65536))
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room outside the range: any free port
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def launcher_env() -> dict[str, str]:
    """This process's environment with the checkout first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without any P3_*/DMLC_* variable, with short timeouts and small slices (so a
    3000-element key spans both servers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("P3_", "DMLC_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONUNBUFFERED="1", P3_CONNECT_TIMEOUT="15", P3_TIMEOUT="30", P3_SLICE_SIZE="1000")
    env.update(extra)
    return env


def node_env(role: str, root_port: int | None, workers: int = 2, servers: int = 2, **extra: str) -> dict[str, str]:
    """`base_env` plus the description of a job on loopback for a node of `role` (no P3_ROOT_PORT if None), with
    P3_SECRET=SECRET unless `extra` says otherwise."""
    job = {"P3_ROLE": role, "P3_ROOT_URI": HOST, "P3_NODE_HOST": HOST, "P3_NUM_WORKER": str(workers),
           "P3_NUM_SERVER": str(servers), "P3_SECRET": SECRET}
    if root_port is not None:
        job["P3_ROOT_PORT"] = str(root_port)
    return base_env(**{**job, **extra})


# ---- processes ----

class Node:
    """One process whose stdout and stderr lines are interleaved as they come; lines can be awaited with a timeout.

    The two streams are read through separate pipes, so a line is never torn: with one shared pipe, a C++ log
    line written to stderr could land between an unbuffered print's text and its newline."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str]):
        self.name = name
        self.proc = subprocess.Popen(list(argv), env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self._lines: queue.SimpleQueue = queue.SimpleQueue()
        self.seen: list[str] = []
        self._open = 2  # streams not yet at their end (touched by the readers only, under _lock)
        self._lock = threading.Lock()
        self._readers = [threading.Thread(target=self._read, args=(stream,), name=f"read {name}", daemon=True)
                         for stream in (self.proc.stdout, self.proc.stderr)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            self._lines.put(line if line.endswith("\n") else line + "\n")
        with self._lock:
            self._open -= 1
            if self._open == 0:
                self._lines.put(None)

    def _take(self, timeout: float) -> bool:
        """Move one line into `seen`; False at the end of the output."""
        line = self._lines.get(timeout=timeout)
        if line is None:
            self._lines.put(None)  # keep the end marker for later calls
            return False
        self.seen.append(line)
        return True

    @property
    def output(self) -> str:
        return "".join(self.seen)

    def wait_for(self, pattern: str, timeout: float = STEP) -> re.Match:
        """The first line (seen so far or to come) matching `pattern`; fails the test after `timeout`."""
        return self.wait_for_many(pattern, 1, timeout)[0]

    def wait_for_many(self, pattern: str, count: int, timeout: float = STEP) -> list[re.Match]:
        """The first `count` matches of `pattern` in the lines seen so far or to come (every match of a line: processes
        sharing one pipe can land two messages on one line); fails the test after `timeout`."""
        deadline = time.monotonic() + timeout
        matches: list[re.Match] = []
        index = 0
        while True:
            for line in self.seen[index:]:
                for m in re.finditer(pattern, line):
                    matches.append(m)
                    if len(matches) == count:
                        return matches
            index = len(self.seen)
            try:
                more = self._take(max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                more = None
            if not more:
                state = "ended" if more is False else f"printed nothing more within {timeout:g} s"
                pytest.fail(f"{self.name} {state} with {len(matches)} of {count} lines matching {pattern!r}; its "
                            f"output:\n{self.output}")

    def finish(self, timeout: float = STEP) -> int:
        """Wait for the exit and the whole output; the exit code. Kills the process and fails after `timeout`."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.name} did not exit within {timeout:g} s; its output:\n{self.output}")
        for reader in self._readers:
            reader.join(STEP)
        while not self._lines.empty() and self._take(0):
            pass
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=STEP)


def run_node(argv: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    """Run a process to its end (hard timeout STEP); its exit code, merged output and running time."""
    start = time.monotonic()
    result = subprocess.run(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=STEP)
    return result.returncode, result.stdout, time.monotonic() - start


# ---- the launcher ----

def launcher_argv(*args: str) -> list[str]:
    """`python -m p3kv.launch ARGS` (ARGS include `-- WORKER...`): the only place tests spell the launcher."""
    return [sys.executable, "-m", "p3kv.launch", *args]


def run_launcher(*args: str, env: dict[str, str] | None = None, timeout: float = 60, merge_output: bool = False,
                 stdin=None, wrap: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Runs `python -m p3kv.launch ARGS` (prefixed by `wrap`, e.g. `ip netns exec NS`) in the checkout to its
    end; `env` defaults to launcher_env(). Output is captured, stderr into stdout with `merge_output`. A launcher
    still running after `timeout` seconds fails the test with its output and what each of its processes was
    doing (hang_report.py), then is stopped with SIGTERM (it stops its children) and, 15 s later, SIGKILL."""
    argv = [*wrap, *launcher_argv(*args)]
    with subprocess.Popen(argv, cwd=REPO, env=launcher_env() if env is None else env, stdin=stdin,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_output else subprocess.PIPE,
                          text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            processes = hang_report.report(proc.pid)
            proc.terminate()
            try:
                stdout, stderr = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            pytest.fail(f"the launcher did not end within {timeout:g} s: {' '.join(argv)}\n--- its output (end):\n"
                        f"{(stdout or '')[-4000:]}{(stderr or '')[-2000:]}\n--- its processes when the time ran out:"
                        f"\n{processes}", pytrace=False)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def run_job(workers: int, servers: int, worker_args: Sequence[str], *, env: dict[str, str] | None = None,
            server_script: str | None = None, timeout: float = 120,
            launcher_args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Runs `python WORKER_ARGS` as a job of `workers` x `servers` through the real launcher (servers run
    tests/scripts/SERVER_SCRIPT if given); returns the CompletedProcess (output merged into stdout)."""
    args = ["-n", str(workers), "-s", str(servers), *launcher_args]
    if server_script:
        args += ["--server-command", f"{sys.executable} {os.path.join(SCRIPTS, server_script)}"]
    return run_launcher(*args, "--", sys.executable, *worker_args, env={**os.environ, **(env or {})},
                        timeout=timeout, merge_output=True)


def start_launcher(nodes: list, name: str, args: Sequence[str], worker: Sequence[str], env: dict[str, str],
                   wrap=lambda argv: argv) -> Node:
    """`python -m p3kv.launch ARGS -- WORKER` (run through `wrap`, e.g. in a namespace), in `nodes`."""
    node = Node(name, wrap(launcher_argv(*args, "--", *worker)), env)
    nodes.append(node)
    return node


# ---- jobs started node by node ----

ROLE_COMMANDS = {
    "scheduler": [sys.executable, "-m", "p3kv.core.scheduler"],
    "server": [sys.executable, "-m", "p3kv.mxnet.server"],
    "worker": [sys.executable, "-c", "from p3kv import P3Worker; P3Worker()"],
}


class Job:
    """A scheduler, `servers` servers and `workers` workers started as separate processes. The servers run
    tests/scripts/report_server.py (prints its rank, pid and port once it joined) unless told otherwise; the
    workers run tests/scripts/failure_worker.py (see its docstring)."""

    def __init__(self, nodes: list[Node], *, workers: int = 2, servers: int = 2,
                 server_script: str = REPORT_SERVER, worker_args: tuple[str, ...] = (), **env: str):
        """`env`: extra variables for every process (e.g. P3_HEARTBEAT_TIMEOUT)."""
        port = free_port()  # another process could take it first; then the scheduler fails and the test shows why
        self.port = port  # the scheduler's (P3_ROOT_PORT)
        self.scheduler = Node("scheduler", ROLE_COMMANDS["scheduler"],
                              node_env("scheduler", port, workers, servers, **env))
        nodes.append(self.scheduler)
        self.servers = [Node(f"server process {i}", [sys.executable, server_script],
                             node_env("server", port, workers, servers, **env)) for i in range(servers)]
        nodes.extend(self.servers)
        self.workers = [Node(f"worker process {i}", [sys.executable, FAILURE_WORKER, *worker_args],
                             node_env("worker", port, workers, servers, **env)) for i in range(workers)]
        nodes.extend(self.workers)

    def server_ports(self) -> dict[int, tuple[Node, int, int]]:
        """rank -> (node, pid, port), from report_server.py's line."""
        found = {}
        for node in self.servers:
            m = node.wait_for(r"^server rank=(\d+) pid=(\d+) port=(\d+)$")
            found[int(m.group(1))] = (node, int(m.group(2)), int(m.group(3)))
        assert sorted(found) == list(range(len(self.servers))), found
        return found

    def worker_ranks(self) -> dict[int, tuple[Node, int]]:
        """rank -> (node, pid), from failure_worker.py's ready line."""
        found = {}
        for node in self.workers:
            m = node.wait_for(r"^ready rank=(\d+) pid=(\d+)$")
            found[int(m.group(1))] = (node, int(m.group(2)))
        assert sorted(found) == list(range(len(self.workers))), found
        return found

    def wait_iteration(self, iteration: int) -> None:
        for node in self.workers:
            node.wait_for(rf"^iteration {iteration} ok$")


def start_node(nodes: list[Node], name: str, argv: list[str], role: str, port: int, **env: str) -> Node:
    """One node of a job on `port`, started now and killed at teardown (`nodes` fixture)."""
    node = Node(name, argv, node_env(role, port, **env))
    nodes.append(node)
    return node


def start_rendezvous(nodes: list[Node], port: int, **env: str) -> tuple[Node, list[Node], Node]:
    """The scheduler (P3_LOG_LEVEL=INFO), both servers and one of two workers; returns when the scheduler has
    registered all three, so the rendezvous waits for the last worker."""
    env = {"P3_LOG_LEVEL": "INFO", **env}
    scheduler = start_node(nodes, "scheduler", ROLE_COMMANDS["scheduler"], "scheduler", port, **env)
    servers = [start_node(nodes, f"server process {i}", [sys.executable, REPORT_SERVER], "server", port, **env)
               for i in range(2)]
    worker = start_node(nodes, "worker process 0", [sys.executable, FAILURE_WORKER], "worker", port, **env)
    for name in ("server 0", "server 1", "worker 0"):
        scheduler.wait_for(rf"registered {name} ")
    return scheduler, servers, worker


def assert_failed_with(node: Node, pattern: str) -> re.Match:
    """The worker's wait raised P3Error (not a timeout) whose message matches `pattern`; exit code 3."""
    code = node.finish(FAILURE_BOUND)
    m = re.search(r"^FAILED (\w+) after ([\d.]+) s: (.*)$", node.output, re.MULTILINE)
    assert m, f"{node.name} did not report a failed operation (exit code {code}):\n{node.output}"
    assert code == 3, node.output
    assert m.group(1) == "P3Error", node.output
    assert re.search(pattern, m.group(3)), f"{m.group(3)!r} does not match {pattern!r}"
    return m


# ---- connections to a node ----

def refused_reason(node: Node, who: str, local_port: int) -> str:
    """The reason `node` (whose logs say `who`: "server 0", "scheduler") logged for refusing the connection
    from our `local_port`."""
    return node.wait_for(rf"p3kv\.core\[{who}\]: refused the connection from {HOST}:{local_port}: (.*)$").group(1)


def bad_frame(port: int, data: bytes, secret: str = SECRET) -> int:
    """Connect to `port`, pass the handshake, send `data`, close; our local port."""
    with socket.create_connection((HOST, port), timeout=STEP) as s:
        local_port = s.getsockname()[1]
        p3auth.authenticate(s, secret)
        s.sendall(data)
    return local_port
