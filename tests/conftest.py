"""Shared helpers for tests that run real p3kv jobs."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")


def run_job(workers, servers, worker_args, *, env=None, server_script=None, timeout=120, launcher_args=()):
    """Runs a job through the real launcher; returns the CompletedProcess (output merged into stdout)."""
    cmd = [sys.executable, "-m", "p3kv.launch", "-n", str(workers), "-s", str(servers), *launcher_args]
    if server_script:
        cmd += ["--server-command", f"{sys.executable} {os.path.join(SCRIPTS, server_script)}"]
    cmd += ["--", sys.executable, *worker_args]
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture
def job_runner():
    return run_job


@pytest.fixture
def nodes():
    """The processes a test started (objects with a kill() method, e.g. test_failures.Node); whatever still runs
    at teardown is killed."""
    started: list = []
    yield started
    for node in started:
        node.kill()
