"""`python -m p3kv.launch` exports torchrun's variables to a p3 job's workers, and RANK is the worker's p3kv rank:
each worker asks the scheduler for that rank (P3_WORKER_RANK), whatever order the workers register in."""

from __future__ import annotations

import re
import sys

import pytest
from harness import ROLE_COMMANDS, SCRIPTS, free_port, run_job, start_node

from p3kv.launch import Job, plan

WORKER = [sys.executable, f"{SCRIPTS}/failure_worker.py", "--iterations", "2"]


@pytest.mark.unit
def test_workers_get_torchruns_variables_with_rank_equal_to_the_p3kv_rank_they_ask_for():
    job = Job(command=("train",), num_workers=3, num_servers=2)
    specs = {s.name: s.env for s in plan(job, "127.0.0.1", 4242, {"RANK": "7", "P3_WORKER_RANK": "2"})}
    ports = {specs[f"worker {i}"]["MASTER_PORT"] for i in range(3)}
    assert len(ports) == 1 and ports != {"4242"}, ports  # one store port for the job, not the scheduler's
    for i in range(3):
        env = specs[f"worker {i}"]
        assert {k: env[k] for k in ("RANK", "P3_WORKER_RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                    "MASTER_ADDR")} == {"RANK": str(i), "P3_WORKER_RANK": str(i),
                                                        "LOCAL_RANK": str(i), "WORLD_SIZE": "3",
                                                        "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1"}
    for name in ("scheduler", "server 0"):
        assert "RANK" not in specs[name] and "P3_WORKER_RANK" not in specs[name], name  # not inherited


@pytest.mark.unit
def test_across_hosts_no_rank_is_exported_the_worker_learns_it_when_it_joins():
    job = Job(command=("train",), num_workers=4, num_servers=2, port=4242, local_workers=2, local_servers=1)
    specs = {s.name: s.env for s in plan(job, "127.0.0.1", 4242, {"P3_SECRET": "s"})}
    env = specs["worker 1"]
    assert "RANK" not in env and "P3_WORKER_RANK" not in env
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["WORLD_SIZE"]) == ("1", "2", "4")


@pytest.mark.integration
def test_a_worker_gets_the_rank_it_asks_for_not_its_registration_order(nodes):
    port = free_port()
    env = {"P3_LOG_LEVEL": "INFO"}
    scheduler = start_node(nodes, "scheduler", ROLE_COMMANDS["scheduler"], "scheduler", port, **env)
    for i in range(2):
        start_node(nodes, f"server {i}", [sys.executable, "-m", "p3kv.core.server"], "server", port, **env)
    first = start_node(nodes, "first worker", WORKER, "worker", port, P3_WORKER_RANK="1", **env)
    scheduler.wait_for(r"registered worker \d")  # the first to register asks for rank 1
    second = start_node(nodes, "second worker", WORKER, "worker", port, P3_WORKER_RANK="0", **env)
    assert first.wait_for(r"^ready rank=(\d+) ").group(1) == "1", first.output
    assert second.wait_for(r"^ready rank=(\d+) ").group(1) == "0", second.output
    for node in (first, second):
        assert node.finish() == 0, node.output


@pytest.mark.integration
def test_two_workers_asking_for_one_rank_are_refused_naming_the_variable(nodes):
    port = free_port()
    scheduler = start_node(nodes, "scheduler", ROLE_COMMANDS["scheduler"], "scheduler", port)
    for i in range(2):
        start_node(nodes, f"server {i}", [sys.executable, "-m", "p3kv.core.server"], "server", port)
    workers = [start_node(nodes, f"worker {i}", WORKER, "worker", port, P3_WORKER_RANK="1") for i in range(2)]
    outputs = "".join(w.output for w in workers if w.finish() != 0) + scheduler.output
    assert "two workers asked for rank 1" in outputs and "P3_WORKER_RANK" in outputs, outputs


@pytest.mark.integration
def test_a_launched_workers_rank_variable_is_its_p3kv_rank():
    code = ("import os; from p3kv import P3Worker; w = P3Worker(); "
            "print('rank', os.environ['RANK'], w.rank, os.environ['WORLD_SIZE'], w.num_workers); w.close()")
    result = run_job(3, 1, ["-c", code])
    assert result.returncode == 0, result.stdout
    seen = re.findall(r"^\[worker (\d)\] rank (\d) (\d) (\d) (\d)$", result.stdout, re.MULTILINE)
    assert sorted(seen) == [(str(i), str(i), str(i), "3", "3") for i in range(3)], result.stdout


@pytest.mark.unit
def test_servers_core_runs_framework_free_servers():
    specs = {s.name: s.argv for s in plan(Job(command=("t",), num_workers=1, num_servers=1, servers="core"),
                                          "127.0.0.1", 4242, {})}
    assert specs["server 0"][1:] == ("-m", "p3kv.core.server")
    default = {s.name: s.argv for s in plan(Job(command=("t",), num_workers=1, num_servers=1), "127.0.0.1", 4242, {})}
    assert default["server 0"][1:] == ("-m", "p3kv.mxnet.server")


@pytest.mark.integration
def test_a_torch_jobs_core_servers_import_neither_mxnet_nor_torch():
    pytest.importorskip("torch", reason="the job's workers run p3kv.torch (pip install '.[torch]')")
    check = ("import sys, runpy; from p3kv.core import server; s = server.P3Server(); s.start(); s.run(); "
             "bad = [m for m in ('mxnet', 'torch') if m in sys.modules]; print('server imported', bad); "
             "sys.exit(3 if bad else 0)")
    result = run_job(2, 1, [f"{SCRIPTS}/torch_train.py", "p3kv", "/dev/null", "--steps", "2"],
                     launcher_args=["--server-command", f"{sys.executable} -c \"{check}\""])
    assert result.returncode == 0, result.stdout
    assert "[server 0] server imported []" in result.stdout, result.stdout
