"""Tests of p3kv.launch: environment planning (no processes), argument errors, and real jobs of small fake
processes (tests/scripts/fake_node.py) or of MXNet's own dist_sync. Every wait has a hard timeout; ports are
picked by the launcher; processes are synchronized through their output and named pipes, never by sleeping."""

from __future__ import annotations

import io
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import Node, launcher_argv, launcher_env, run_launcher

from p3kv.core.errors import ConfigError
from p3kv.launch import BASELINE_VARIABLE, Job, KVStore, launch, main, plan

REPO = Path(__file__).resolve().parent.parent
FAKE = (sys.executable, str(REPO / "tests" / "scripts" / "fake_node.py"))
DIST_SYNC_SUM = str(REPO / "tests" / "scripts" / "dist_sync_sum.py")
HOROVOD_SUM = str(REPO / "tests" / "scripts" / "horovod_sum.py")
ROLE_VARIABLES = ("P3_ROLE", "P3_ROOT_URI", "P3_ROOT_PORT", "P3_NUM_WORKER", "P3_NUM_SERVER", "P3_NODE_HOST")


def fake(*options: str) -> str:
    return shlex.join(FAKE + options)


def collected_pids(output: str, what: str = "collected") -> list[int]:
    match = re.search(rf"{what} pids=([\d,]+)", output)
    assert match, f"no '{what} pids=' line in:\n{output}"
    return [int(p) for p in match.group(1).split(",")]


def assert_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Every pid has exited (a zombie counts: its parent is gone and PID 1 may reap it late)."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            readable, _, _ = select.select([fd], [], [], timeout)
            assert readable, f"process {pid} still runs after the launcher exited"
        finally:
            os.close(fd)


@pytest.fixture
def leftovers():
    """Pids a test has seen; any still running at teardown is killed, so a failing test leaves nothing behind."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    path = tmp_path / "pids.fifo"
    os.mkfifo(path)
    return str(path)


# ---- planning: the environment each role gets (no processes) ----

def by_name(job: Job) -> dict:
    return {s.name: s for s in plan(job, "127.0.0.1", 4242, {"DMLC_ROLE": "server", BASELINE_VARIABLE: "x",
                                                             "DMLC_PS_VAN_TYPE": "p3", "KEEP": "1"})}


@pytest.mark.unit
def test_plan_p3_gives_each_role_its_variables():
    job = Job(command=("train",), num_workers=2, num_servers=3, env={"P3_SLICE_SIZE": "40000"})
    specs = by_name(job)
    assert list(specs) == ["scheduler", "server 0", "server 1", "server 2", "worker 0", "worker 1"]
    for name, spec in specs.items():
        role = name.split()[0]
        assert {k: spec.env[k] for k in ROLE_VARIABLES} == {
            "P3_ROLE": role, "P3_ROOT_URI": "127.0.0.1", "P3_ROOT_PORT": "4242", "P3_NUM_WORKER": "2",
            "P3_NUM_SERVER": "3", "P3_NODE_HOST": "127.0.0.1"}
        assert spec.env["P3_SLICE_SIZE"] == "40000" and spec.env["KEEP"] == "1"
        assert "DMLC_ROLE" not in spec.env and BASELINE_VARIABLE not in spec.env
        assert spec.primary == (role == "worker")
    assert specs["scheduler"].argv == (sys.executable, "-m", "p3kv.core.scheduler")
    assert specs["server 1"].argv == (sys.executable, "-m", "p3kv.mxnet.server")
    assert specs["worker 1"].argv == ("train",) and specs["worker 1"].log_name == "worker1"


@pytest.mark.unit
@pytest.mark.parametrize("kvstore", [KVStore.DIST_SYNC, KVStore.MXNET_P3])
def test_plan_baselines_use_mxnet_variables(kvstore):
    job = Job(command=("train",), num_workers=2, num_servers=1, kvstore=kvstore)
    specs = by_name(job)
    for name, spec in specs.items():
        role = name.split()[0]
        assert {k: spec.env[k] for k in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER",
                                         "DMLC_NUM_SERVER", "DMLC_NODE_HOST")} == {
            "DMLC_ROLE": role, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "4242",
            "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_NODE_HOST": "127.0.0.1"}
        assert spec.env.get(BASELINE_VARIABLE) == (kvstore.value if role == "worker" else None)
        if kvstore is KVStore.MXNET_P3 and role != "scheduler":
            assert (spec.env["DMLC_PS_VAN_TYPE"], spec.env["DMLC_PS_WATER_MARK"]) == ("p3", "10")
        else:  # the scheduler of an mxnet-p3 job keeps the plain van (baselines.set_environment says why)
            assert "DMLC_PS_VAN_TYPE" not in spec.env
    assert specs["server 0"].argv == (sys.executable, "-c", "import mxnet")


@pytest.mark.unit
def test_plan_env_option_overrides_water_mark():
    job = Job(command=("t",), num_workers=1, num_servers=1, kvstore=KVStore.MXNET_P3,
              env={"DMLC_PS_WATER_MARK": "3", "MXNET_KVSTORE_SLICE_THRESHOLD": "40000"})
    env = by_name(job)["worker 0"].env
    assert (env["DMLC_PS_WATER_MARK"], env["MXNET_KVSTORE_SLICE_THRESHOLD"]) == ("3", "40000")


@pytest.mark.unit
def test_plan_of_one_host_of_a_job_across_hosts():
    # Host 1 of 2: its own worker and server; the scheduler is on host 0. Both advertise their own address.
    job = Job(command=("train",), num_workers=2, num_servers=2, port=4242, env={"P3_SECRET": "s"},
              local_workers=1, local_servers=1, scheduler=False, root="10.0.0.1")
    specs = {s.name: s for s in plan(job, "127.0.0.1", 4242, {})}
    assert list(specs) == ["server 0", "worker 0"]
    for spec in specs.values():
        assert (spec.env["P3_ROOT_URI"], spec.env["P3_NODE_HOST"], spec.env["P3_NUM_WORKER"]) == \
            ("10.0.0.1", "127.0.0.1", "2")
        assert spec.env["P3_SECRET"] == "s"
    # A host with only a server: it is done when the server exits 0 (the job ended elsewhere).
    server_only = Job(command=("train",), num_workers=1, num_servers=2, port=4242, env={"P3_SECRET": "s"},
                      local_workers=0, local_servers=1, scheduler=False, root="10.0.0.1")
    assert [(s.name, s.primary) for s in plan(server_only, "127.0.0.1", 4242, {})] == [("server 0", True)]
    baseline = Job(command=("train",), num_workers=2, num_servers=2, port=4242, kvstore=KVStore.DIST_SYNC,
                   local_workers=1, local_servers=0, scheduler=False, root="10.0.0.1")
    env = plan(baseline, "127.0.0.1", 4242, {})[0].env
    assert (env["DMLC_PS_ROOT_URI"], env["DMLC_NODE_HOST"], env["DMLC_ROLE"]) == ("10.0.0.1", "127.0.0.1", "worker")


@pytest.mark.unit
def test_plan_of_a_horovod_host_follows_the_slot_plan():
    # Host 0 of a 3-rank job (2 ranks here, 1 on 10.0.0.2): the rendezvous takes the scheduler's place, as a
    # companion; each rank gets Horovod's Gloo variables and no parameter-server variable it inherited.
    job = Job(command=("train",), num_workers=3, num_servers=0, kvstore=KVStore.HOROVOD, port=4242,
              local_workers=2, slots=(("127.0.0.1", 2), ("10.0.0.2", 1)))
    specs = plan(job, "127.0.0.1", 4242, {"DMLC_ROLE": "server", "P3_SECRET": "s", "P3_LOG_LEVEL": "INFO"})
    assert [(s.name, s.primary, s.companion) for s in specs] == [
        ("rendezvous", False, True), ("worker 0", True, False), ("worker 1", True, False)]
    assert specs[0].argv[-6:] == ("--host", "127.0.0.1", "--port", "4242", "--slots", "127.0.0.1:2,10.0.0.2:1")
    names = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
             "HOROVOD_CROSS_SIZE")
    assert [tuple(s.env[n] for n in names) for s in specs[1:]] == [("0", "3", "0", "2", "0", "2"),
                                                                 ("1", "3", "1", "2", "0", "1")]
    for spec in specs[1:]:
        assert (spec.env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], spec.env["HOROVOD_GLOO_RENDEZVOUS_PORT"],
                spec.env["HOROVOD_GLOO_IFACE"], spec.env["HOROVOD_HOSTNAME"]) == ("127.0.0.1", "4242", "lo",
                                                                                   "127.0.0.1")
        assert "DMLC_ROLE" not in spec.env and "P3_SECRET" not in spec.env and spec.env["P3_LOG_LEVEL"] == "INFO"
    # Host 1: its one rank is rank 2, the second host of local rank 0; the rendezvous is on the root.
    other = Job(command=("train",), num_workers=3, num_servers=0, kvstore=KVStore.HOROVOD, port=4242,
                local_workers=1, scheduler=False, root="10.0.0.1", slots=(("10.0.0.1", 2), ("127.0.0.1", 1)))
    [worker] = plan(other, "127.0.0.1", 4242, {})
    assert tuple(worker.env[n] for n in names) == ("2", "3", "0", "1", "1", "2")
    assert worker.env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.1"


@pytest.mark.unit
def test_a_horovod_host_whose_name_does_not_resolve_to_its_address_is_warned_about(monkeypatch, caplog):
    import p3kv.launch.horovod as horovod

    monkeypatch.setattr(horovod.socket, "gethostname", lambda: "node7")
    monkeypatch.setattr(horovod.socket, "gethostbyname", lambda name: "127.0.1.1")
    job = Job(command=("train",), num_workers=2, num_servers=0, kvstore=KVStore.HOROVOD, port=4242,
              local_workers=1, slots=(("127.0.0.1", 1), ("10.0.0.2", 1)))
    plan(job, "127.0.0.1", 4242, {})
    assert "this host's name 'node7' resolves to 127.0.1.1, not to --host 127.0.0.1" in caplog.text
    assert "map the name to 127.0.0.1" in caplog.text
    caplog.clear()
    monkeypatch.setattr(horovod.socket, "gethostbyname", lambda name: "127.0.0.1")
    plan(job, "127.0.0.1", 4242, {})
    assert "resolves to" not in caplog.text


@pytest.mark.unit
def test_a_horovod_job_without_horovod_installed_is_refused_with_the_fix(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "horovod" else real(name, *a))
    job = Job(command=("train",), num_workers=2, num_servers=0, kvstore=KVStore.HOROVOD)
    with pytest.raises(ConfigError, match=r"Horovod is not installed for .*make bench-setup"):
        plan(job, "127.0.0.1", 4242, {})


@pytest.mark.unit
def test_a_p3_job_across_hosts_needs_a_shared_secret():
    job = Job(command=("train",), num_workers=2, num_servers=2, port=4242, local_workers=1, local_servers=1)
    with pytest.raises(ConfigError, match="the same secret on every host: set P3_SECRET_FILE"):
        plan(job, "127.0.0.1", 4242, {})


# ---- bad arguments: exit 2 with a message that names the fix ----

@pytest.fixture
def busy_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.unit
@pytest.mark.parametrize("argv, message", [
    (["-n", "0", "-s", "1", "--", "true"], "-n/--num-workers must be at least 1 (got 0)"),
    (["-n", "1", "-s", "0", "--", "true"], "-s/--num-servers must be at least 1 (got 0)"),
    (["-s", "1", "--", "true"], "the following arguments are required: -n/--num-workers"),
    (["-n", "1", "-s", "1"], "no worker command given"),
    (["-n", "1", "-s", "1", "--"], "no worker command given"),
    (["-n", "x", "-s", "1", "--", "true"], "invalid int value: 'x'"),
    (["-n", "1", "-s", "1", "--kvstore", "nccl", "--", "true"], "invalid choice: 'nccl'"),
    (["-n", "1", "-s", "1", "--host", "192.0.2.1", "--", "true"], "is not an address of this machine"),
    (["-n", "1", "-s", "1", "--host", "no-such-host.invalid", "--", "true"], "cannot be resolved"),
    (["-n", "1", "-s", "1", "--port", "70000", "--", "true"], "--port 70000 is not a TCP port"),
    (["-n", "1", "-s", "1", "--env", "NOEQUALS", "--", "true"], "'NOEQUALS' is not KEY=VALUE"),
    (["-n", "1", "-s", "1", "--env", "P3_ROOT_PORT=9", "--", "true"], "sets P3_ROOT_PORT itself; use --port"),
    (["-n", "1", "-s", "1", "--env", "DMLC_ROLE=server", "--", "true"], "sets DMLC_ROLE itself"),
    (["-n", "1", "-s", "1", "--env", "P3_SLICE_SIZE=big", "--", "true"], "P3_SLICE_SIZE='big' is not a valid int"),
    (["-n", "1", "-s", "1", "--timeout", "0", "--", "true"], "--timeout must be a positive number of seconds"),
    (["-n", "1", "-s", "1", "--server-command", "", "--", "true"], "--server-command is empty"),
    (["-n", "1", "-s", "1", "--server-command", "'unclosed", "--", "true"], "No closing quotation"),
    (["-n", "2", "-s", "1", "--local-workers", "3", "--", "true"], "--local-workers 3 must be between 0 and"),
    (["-n", "2", "-s", "1", "--no-scheduler", "--", "true"], "--no-scheduler: give the scheduler's address"),
    (["-n", "2", "-s", "1", "--root", "10.0.0.1", "--", "true"], "--root is for hosts without the scheduler"),
    (["-n", "2", "-s", "1", "--local-workers", "1", "--", "true"], "a job across hosts needs a fixed scheduler port"),
    (["-n", "1", "-s", "1", "--port", "4242", "--no-scheduler", "--root", "10.0.0.1", "--local-workers", "0",
      "--local-servers", "0", "--env", "P3_SECRET=x", "--", "true"], "nothing to run on this host"),
    (["-n", "1", "-s", "1", "--kvstore", "horovod", "--", "true"], "Horovod has no servers (ring allreduce)"),
    (["-n", "2", "-s", "0", "--kvstore", "horovod", "--slots", "127.0.0.1:1", "--", "true"],
     "--slots 127.0.0.1:1 adds up to 1 workers but -n is 2"),
    (["-n", "2", "-s", "0", "--kvstore", "horovod", "--port", "4242", "--local-workers", "1", "--", "true"],
     "a Horovod job across hosts needs the slot plan"),
    (["-n", "1", "-s", "0", "--kvstore", "horovod", "--slots", "127.0.0.1", "--", "true"],
     "'127.0.0.1' is not ADDRESS:WORKERS"),
    (["-n", "2", "-s", "0", "--kvstore", "horovod", "--slots", "127.0.0.1:1,127.0.0.1:1", "--", "true"],
     "names a host twice"),
    (["-n", "1", "-s", "1", "--slots", "127.0.0.1:1", "--", "true"], "--slots is Horovod's slot plan"),
    (["-n", "2", "-s", "0", "--kvstore", "horovod", "--port", "4242", "--local-workers", "1", "--slots",
      "10.0.0.9:1,10.0.0.8:1", "--", "true"], "gives this host (127.0.0.1) 0 workers but it starts 1"),
    (["-n", "2", "-s", "0", "--kvstore", "horovod", "--port", "4242", "--local-workers", "0", "--slots",
      "10.0.0.9:1,10.0.0.8:1", "--", "true"], "Horovod's rendezvous runs while this host's workers run"),
])
def test_bad_arguments_fail_with_a_clear_message(argv, message, caplog):
    assert main(argv) == 2
    assert message in caplog.text


@pytest.mark.unit
def test_port_in_use_is_refused(busy_port, caplog):
    assert main(["-n", "1", "-s", "1", "--port", str(busy_port), "--", "true"]) == 2
    assert f"--port {busy_port} cannot be used" in caplog.text and "leave --port out" in caplog.text


@pytest.mark.unit
def test_unwritable_log_dir_is_refused(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    assert main(["-n", "1", "-s", "1", "--log-dir", str(tmp_path / "file" / "logs"), "--", "true"]) == 2
    assert "--log-dir" in caplog.text and "pass a writable directory" in caplog.text


@pytest.mark.integration
def test_missing_worker_program_exits_127_and_stops_the_rest(caplog):
    job = Job(command=("/nonexistent/train",), num_workers=1, num_servers=1, scheduler_command=FAKE + ("--block",),
              server_command=FAKE + ("--block",), timeout=30)
    assert launch(job, out=io.StringIO()) == 127
    assert "cannot start worker 0 (/nonexistent/train)" in caplog.text


# ---- real jobs of fake processes ----

@pytest.mark.integration
def test_success_forwards_prefixed_output_env_and_logs(tmp_path):
    names = " ".join(ROLE_VARIABLES + ("EXTRA",))
    result = run_launcher("-n", "2", "-s", "2", "--env", "EXTRA=yes", "--log-dir", str(tmp_path / "logs"),
                          "--scheduler-command", fake("--print-env", *names.split()),
                          "--server-command", fake("--print-env", *names.split()),
                          "--", *FAKE, "--print-env", *names.split())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    ports = set()
    for prefix, role in (("[scheduler]", "scheduler"), ("[server 0]", "server"), ("[server 1]", "server"),
                         ("[worker 0]", "worker"), ("[worker 1]", "worker")):
        env = {k: v for k, v in (line[len(prefix) + 5:].split("=", 1) for line in lines
                                 if line.startswith(prefix + " env "))}
        assert env["P3_ROLE"] == role and env["EXTRA"] == "yes"
        assert (env["P3_NUM_WORKER"], env["P3_NUM_SERVER"]) == ("2", "2")
        assert env["P3_ROOT_URI"] == env["P3_NODE_HOST"] == "127.0.0.1"
        ports.add(env["P3_ROOT_PORT"])
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    assert all(re.match(r"\[(scheduler|server [01]|worker [01])\] ", line) for line in lines), lines
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["scheduler.log", "server0.log", "server1.log", "worker0.log", "worker1.log"]
    assert "env P3_ROLE=worker\n" in (tmp_path / "logs" / "worker1.log").read_text()


@pytest.mark.integration
def test_failing_worker_stops_the_job_and_its_code_is_the_exit_code(fifo, leftovers):
    # The server reports its pid and its grandchild's through the pipe, so the worker fails only after both run.
    result = run_launcher("-n", "1", "-s", "1", "--scheduler-command", fake("--block"),
                          "--server-command", fake("--report", fifo, "--grandchild", "--block"),
                          "--", *FAKE, "--collect", fifo, "--exit", "3")
    server_pids = collected_pids(result.stdout)
    leftovers.extend(server_pids)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "worker 0 exited with code 3; stopped all other processes" in result.stderr
    assert len(server_pids) == 2
    assert_gone(server_pids)


@pytest.mark.integration
def test_processes_left_behind_by_a_successful_worker_are_killed(leftovers):
    result = run_launcher("-n", "1", "-s", "1", "--scheduler-command", fake(), "--server-command", fake(),
                          "--", *FAKE, "--grandchild")
    pids = collected_pids(result.stdout, "ready worker")
    leftovers.extend(pids)
    assert result.returncode == 0, result.stderr
    assert len(pids) == 2
    assert_gone(pids)


@pytest.mark.integration
def test_failing_server_stops_blocked_workers():
    result = run_launcher("-n", "2", "-s", "2", "--scheduler-command", fake("--block"),
                          "--server-command", fake("--exit", "5"), "--", *FAKE, "--block")
    assert result.returncode == 5, result.stderr
    assert re.search(r"server [01] exited with code 5; stopped all other processes", result.stderr)


@pytest.mark.integration
def test_child_killed_by_a_signal_fails_the_job_with_code_1(caplog):
    suicide = (sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    job = Job(command=FAKE + ("--block",), num_workers=1, num_servers=1, scheduler_command=FAKE + ("--block",),
              server_command=suicide, timeout=30)
    assert launch(job, out=io.StringIO()) == 1
    assert "server 0 was killed by SIGKILL" in caplog.text


@pytest.mark.integration
def test_process_ignoring_sigterm_gets_sigkill(fifo, caplog, leftovers):
    out = io.StringIO()
    job = Job(command=FAKE + ("--collect", fifo, "--exit", "4"), num_workers=1, num_servers=1,
              scheduler_command=FAKE, server_command=FAKE + ("--report", fifo, "--ignore-sigterm", "--block"),
              timeout=30, kill_grace=0.5)
    code = launch(job, out=out)
    leftovers.extend(collected_pids(out.getvalue()))
    assert code == 4
    assert "server 0 did not stop within 0.5 s of SIGTERM; sending SIGKILL" in caplog.text
    assert_gone(leftovers)


@pytest.mark.integration
def test_servers_that_outlive_the_workers_are_killed_after_the_grace_period():
    result = run_launcher("-n", "1", "-s", "1", "--grace", "0.5", "--scheduler-command", fake(),
                          "--server-command", fake("--block"), "--", *FAKE)
    assert result.returncode == 1
    assert "server 0 did not exit within 0.5 s after all workers finished; killed them" in result.stderr


@pytest.mark.integration
def test_timeout_kills_everything_and_exits_124(leftovers):
    result = run_launcher("-n", "2", "-s", "1", "--timeout", "3", "--scheduler-command", fake("--block"),
                          "--server-command", fake("--block", "--grandchild"), "--", *FAKE, "--block")
    pids = [int(p) for p in re.findall(r"ready \w+ pids=([\d,]+)", result.stdout) for p in p.split(",")]
    leftovers.extend(pids)
    assert result.returncode == 124, result.stderr
    assert "the job timed out after 3 s (--timeout)" in result.stderr
    assert len(pids) == 5, result.stdout  # scheduler, server + grandchild, two workers
    assert_gone(pids)


@pytest.mark.integration
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_the_launcher_kills_all_children(sig, code, leftovers):
    launcher = Node("launcher", launcher_argv("-n", "2", "-s", "1", "--scheduler-command", fake("--block"),
                                              "--server-command", fake("--block", "--grandchild"), "--", *FAKE,
                                              "--block"), launcher_env())
    try:
        ready = launcher.wait_for_many(r"ready \w+ pids=([\d,]+)", count=4, timeout=30)
        leftovers.extend(int(p) for m in ready for p in m.group(1).split(","))
        launcher.proc.send_signal(sig)
        launcher.finish(timeout=30)
        output = launcher.output
    finally:
        launcher.kill()
    assert launcher.proc.returncode == code, output
    assert f"interrupted by {sig.name}; stopped all processes" in output
    assert len(leftovers) == 5
    assert_gone(leftovers)


@pytest.mark.integration
def test_horovod_ranks_get_their_variables_and_the_rendezvous_is_stopped_when_they_are_done():
    # The rendezvous is a companion: SIGTERM once the workers have exited 0, and the job succeeds when it then
    # exits 0. An inherited ps-lite role must not reach the ranks (it would turn `import mxnet` into a server).
    env = launcher_env()
    env["DMLC_ROLE"] = "server"
    result = run_launcher("-n", "2", "-s", "0", "--kvstore", "horovod", "--grace", "10", "--scheduler-command",
                          fake("--block", "--exit-on-sigterm"), "--", *FAKE, "--print-env", "HOROVOD_RANK",
                          "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_CONTROLLER", "DMLC_ROLE", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in ("0", "1"):
        for line in (f"HOROVOD_RANK={rank}", "HOROVOD_SIZE=2", f"HOROVOD_LOCAL_RANK={rank}",
                     "HOROVOD_CONTROLLER=gloo", "DMLC_ROLE=<unset>"):
            assert f"[worker {rank}] env {line}\n" in result.stdout, result.stdout
    assert "[rendezvous] stopped by SIGTERM" in result.stdout


# ---- MXNet's own parameter server as the baseline ----

@pytest.mark.mxnet
@pytest.mark.parametrize("kvstore", ["dist_sync", "mxnet-p3"])
def test_mxnet_baseline_sums_pushes_of_two_workers(kvstore):
    result = run_launcher("-n", "2", "-s", "1", "--kvstore", kvstore, "--timeout", "100", "--",
                          sys.executable, DIST_SYNC_SUM, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    oks = re.findall(rf"^\[worker (\d)\] OK rank=(\d) baseline={kvstore}$", result.stdout, re.MULTILINE)
    assert sorted(w for w, _ in oks) == ["0", "1"] and sorted(r for _, r in oks) == ["0", "1"], result.stdout


@pytest.mark.mxnet
def test_horovod_job_allreduces_across_its_ranks_and_stops_its_rendezvous():
    # The real rendezvous (Horovod's HTTP store, p3kv.launch.rendezvous) and horovod.mxnet ranks over Gloo.
    done = subprocess.run([sys.executable, "-c", "import horovod.mxnet as h; assert h.gloo_built()"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"horovod.mxnet with Gloo is needed (make bench-setup installs it): {done.stderr}"
    result = run_launcher("-n", "3", "-s", "0", "--kvstore", "horovod", "--timeout", "100", "-v", "--",
                          sys.executable, HOROVOD_SUM, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    oks = re.findall(r"^\[worker (\d)\] OK rank=(\d) size=3 local=(\d)/3$", result.stdout, re.MULTILINE)
    assert sorted(oks) == [("0", "0", "0"), ("1", "1", "1"), ("2", "2", "2")], result.stdout
    assert "all 4 processes exited with code 0" in result.stderr, result.stderr
    # `python -m` runs the rendezvous from a module the package does not import first (no runpy warning).
    output = result.stdout + result.stderr
    started = r"^\[rendezvous\] .*Horovod rendezvous on 127\.0\.0\.1:\d+ for 3 ranks$"
    assert re.search(started, output, re.MULTILINE), output
    assert "RuntimeWarning" not in output, output


@pytest.mark.mxnet
def test_horovod_rank_that_dies_stops_the_job_with_its_code():
    # The other ranks wait in an allreduce for the dead one: the launcher must not wait with them.
    started = time.monotonic()
    result = run_launcher("-n", "2", "-s", "0", "--kvstore", "horovod", "--timeout", "100", "--",
                          sys.executable, HOROVOD_SUM, "--die-rank", "1", timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "worker 1 exited with code 3; stopped all other processes" in result.stderr, result.stderr
    assert time.monotonic() - started < 60



@pytest.mark.integration
def test_worker_that_exits_without_joining_is_named_at_once():
    # A worker command that ends with code 0 without ever creating the kvstore (here: a script that only prints)
    # used to leave the job waiting for the grace period and then blame the scheduler and servers.
    started = time.monotonic()
    result = run_launcher("-n", "2", "-s", "1", "--timeout", "50", "--", sys.executable, "-c",
                          "import os; print('no kvstore here', 'P3_JOINED_FILE' in os.environ)")
    seconds = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"worker [01] exited with code 0 without ever joining the job \(its command ended without "
                     r"creating kvstore 'p3' or a P3Worker", result.stderr), result.stderr
    assert "did not exit within" not in result.stderr and "timed out" not in result.stderr
    assert "no kvstore here True" in result.stdout
    assert seconds < 20, seconds  # at once: neither the 30 s grace period nor the connect timeout


@pytest.mark.integration
def test_workers_that_join_pass_the_join_check(tmp_path):
    # The check itself: P3Worker creates its P3_JOINED_FILE once it joined.
    script = tmp_path / "join.py"
    script.write_text("from p3kv import P3Worker\nwith P3Worker() as w:\n    print('joined as', w.rank)\n")
    result = run_launcher("-n", "2", "-s", "1", "--timeout", "50", "--", sys.executable, str(script))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"joined as (\d)", result.stdout)) == ["0", "1"]


@pytest.mark.unit
def test_plan_gives_each_p3_worker_its_own_joined_file():
    job = Job(command=("train",), num_workers=2, num_servers=1)
    specs = {s.name: s for s in plan(job, "127.0.0.1", 9000, {"P3_JOINED_FILE": "inherited"}, "/tmp/j")}
    assert specs["worker 1"].env["P3_JOINED_FILE"] == specs["worker 1"].joined_file == "/tmp/j/worker1.joined"
    assert "P3_JOINED_FILE" not in specs["server 0"].env and specs["server 0"].joined_file is None
    baseline = Job(command=("train",), num_workers=1, num_servers=1, kvstore=KVStore.DIST_SYNC)
    assert plan(baseline, "127.0.0.1", 9000, {}, "/tmp/j")[-1].joined_file is None  # MXNet's workers never join


@pytest.mark.integration
def test_a_peer_killed_by_a_signal_is_blamed_even_when_another_exit_is_seen_first():
    # The scheduler exits with an error as soon as a killed server's connection drops, and its exit can reach the
    # launcher first: the launcher names the process killed by the signal, the cause.
    from p3kv.launch.supervisor import ProcessSpec, Supervisor

    def spec(name, script):
        return ProcessSpec(name=name, argv=("sh", "-c", script), env=dict(os.environ), log_name=name, primary=True)

    out = io.StringIO()
    outcome = Supervisor([spec("scheduler", "sleep 0.3; exit 1"), spec("server 0", "sleep 0.45; kill -9 $$")],
                         out=out, timeout=30).run()
    assert outcome.message == "server 0 was killed by SIGKILL; stopped all other processes", outcome
    assert outcome.exit_code == 1
