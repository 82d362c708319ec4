"""A script started by torchrun, without p3kv's launcher, starts p3kv's scheduler and servers itself
(distribute(servers=S), p3kv.torch.torchrun): local rank 0 starts them from torchrun's variables, every worker joins
with RANK as its p3kv rank, the job ends with the weights of the same job under p3kv's launcher and of DDP, and the
services end with the job, also when a worker is killed."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest
from harness import FAILURE_BOUND, Node, free_port
from torch_jobs import TRAIN, ddp_job, p3kv_job, running, service_pids, torchrun_argv, torchrun_env, torchrun_job

from p3kv.core.config import Role, load
from p3kv.core.errors import ConfigError
from p3kv.launch.child_services import child_environment
from p3kv.launch.torchrun import TorchrunJob, started_by_torchrun

torch = pytest.importorskip("torch", reason="p3kv.torch needs torch (pip install '.[torch]')")

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "0"}


@pytest.mark.unit
def test_torchruns_variables_describe_the_job():
    job = TorchrunJob.from_environment(TORCHRUN)
    assert (job.rank, job.world_size, job.local_rank, job.local_world_size, job.node, job.nodes) == (3, 4, 1, 2, 1, 2)
    assert (job.master_addr, job.master_port, job.agent_store, job.run_id) == ("10.0.0.1", 29500, True, "job7")
    assert not job.starts_scheduler and job.local_servers(3) == 0  # local rank 1 starts nothing
    # Without GROUP_*: derived from torchrun's numbering.
    bare = {k: v for k, v in TORCHRUN.items() if not k.startswith(("GROUP_", "TORCHELASTIC_"))}
    job = TorchrunJob.from_environment({**bare, "RANK": "2", "LOCAL_RANK": "0"})
    assert (job.node, job.nodes, job.agent_store) == (1, 2, False)


@pytest.mark.unit
def test_each_nodes_local_rank_0_starts_its_share_of_the_servers_and_node_0_the_scheduler():
    def job(rank: int) -> TorchrunJob:
        return TorchrunJob.from_environment({**TORCHRUN, "RANK": str(rank), "LOCAL_RANK": str(rank % 2),
                                             "GROUP_RANK": str(rank // 2)})

    assert [job(r).local_servers(3) for r in range(4)] == [2, 0, 1, 0]
    assert [job(r).local_servers(1) for r in range(4)] == [1, 0, 0, 0]
    assert [job(r).starts_scheduler for r in range(4)] == [True, False, False, False]
    with pytest.raises(ConfigError, match="at least one server"):
        job(0).local_servers(0)


@pytest.mark.unit
@pytest.mark.parametrize("change, message", [
    ({"RANK": None, "MASTER_PORT": None}, r"RANK, MASTER_PORT not set.*torchrun --nproc-per-node"),
    ({"RANK": "4"}, r"RANK=4 is not a rank of WORLD_SIZE=4"),
    ({"LOCAL_RANK": "2"}, r"LOCAL_RANK=2 is not a local rank of LOCAL_WORLD_SIZE=2"),
    ({"WORLD_SIZE": "5", "GROUP_WORLD_SIZE": None}, r"WORLD_SIZE=5 is not a multiple of LOCAL_WORLD_SIZE=2"),
    ({"GROUP_WORLD_SIZE": "3"}, r"GROUP_WORLD_SIZE=3 nodes of LOCAL_WORLD_SIZE=2 workers are not WORLD_SIZE=4"),
    ({"GROUP_RANK": "0"}, r"RANK=3 is not node GROUP_RANK=0's local rank"),
    ({"MASTER_PORT": "70000"}, r"MASTER_PORT=70000 is not a TCP port"),
    ({"WORLD_SIZE": "four"}, r"WORLD_SIZE='four' is not an integer"),
])
def test_missing_or_inconsistent_variables_are_refused_naming_them(change, message):
    env = {k: v for k, v in {**TORCHRUN, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        TorchrunJob.from_environment(env)


@pytest.mark.unit
def test_a_process_with_torchruns_variables_but_no_p3kv_job_is_started_by_torchrun():
    assert started_by_torchrun(TORCHRUN)
    assert not started_by_torchrun({**TORCHRUN, "P3_ROLE": "worker"})  # p3kv's launcher exports both
    assert not started_by_torchrun({"MASTER_ADDR": "x"})


@pytest.mark.unit
def test_the_services_get_the_jobs_description_not_the_workers_own_variables():
    cfg = load({"P3_SLICE_SIZE": "1234"}, role=Role.SERVER, root_uri="10.0.0.1", root_port=4000, num_worker=4,
               num_server=3, secret="s3")
    env = child_environment(cfg, Role.SERVER, {**TORCHRUN, "P3_WORKER_RANK": "3", "P3_SLICE_SIZE": "1234",
                                               "PYTHONPATH": "/x"})
    assert {k: env[k] for k in ("P3_ROLE", "P3_ROOT_URI", "P3_ROOT_PORT", "P3_NUM_WORKER", "P3_NUM_SERVER",
                                "P3_SECRET", "P3_SLICE_SIZE")} == {
        "P3_ROLE": "server", "P3_ROOT_URI": "10.0.0.1", "P3_ROOT_PORT": "4000", "P3_NUM_WORKER": "4",
        "P3_NUM_SERVER": "3", "P3_SECRET": "s3", "P3_SLICE_SIZE": "1234"}
    assert not {"RANK", "LOCAL_RANK", "GROUP_RANK", "P3_WORKER_RANK"} & env.keys()
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == "/x" and os.path.isdir(
        os.path.join(env["PYTHONPATH"].split(os.pathsep)[0], "p3kv"))


@pytest.mark.unit
def test_a_torchrun_script_without_servers_is_told_to_pass_them(monkeypatch):
    from p3kv.torch import distributed

    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("P3_ROLE", raising=False)
    monkeypatch.setattr(distributed, "_worker", None)
    with pytest.raises(ConfigError, match=r"started by torchrun.*servers=S"):
        distributed.worker()


@pytest.mark.unit
def test_without_torchruns_store_a_secret_file_is_required(monkeypatch):
    from p3kv.torch import distributed, torchrun

    env = {**TORCHRUN, "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "TORCHELASTIC_USE_AGENT_STORE": "False"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("P3_ROLE", "P3_SECRET", "P3_SECRET_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(distributed, "_worker", None)
    with pytest.raises(ConfigError, match=r"TORCHELASTIC_USE_AGENT_STORE.*P3_SECRET_FILE"):
        torchrun.init_from_torchrun(2)


PLACEMENTS = {"worker": [], "server": ["--placement", "server"]}


@pytest.mark.integration
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_a_torchrun_job_ends_with_the_weights_of_the_launchers_job_and_of_ddp(tmp_path, placement):
    args = PLACEMENTS[placement]
    # Worker placement under torchrun's c10d rendezvous (--standalone), server placement under its static one.
    result = torchrun_job(tmp_path / "torchrun.pt", *args, standalone=placement == "worker")
    assert result.returncode == 0, result.stdout
    pids = service_pids(result.stdout)
    assert sorted(pids) == ["scheduler", "server 0 of node 0", "server 1 of node 0"], result.stdout
    assert not [name for name, pid in pids.items() if running(pid)], "services outlived the job"
    # RANK is the p3kv rank (the script asserts it), and both workers end equal.
    # (Not by lines: torchrun's workers share one pipe, and one's line may land inside the other's.)
    sums = re.findall(r"rank (\d) checksum (-?\d+\.\d{10})", result.stdout)
    assert sorted(r for r, _ in sums) == ["0", "1"] and len({c for _, c in sums}) == 1, result.stdout
    launched = p3kv_job(tmp_path / "launcher.pt", *args, "--servers", "2")  # servers=2 agrees with -s 2
    assert launched.returncode == 0, launched.stdout
    ddp_job(tmp_path / "ddp.pt", *args)
    mine = torch.load(tmp_path / "torchrun.pt")
    for other in ("launcher.pt", "ddp.pt"):
        theirs = torch.load(tmp_path / other)
        assert mine.keys() == theirs.keys()
        assert [k for k in mine if not torch.equal(mine[k], theirs[k])] == [], other


@pytest.mark.integration
def test_servers_that_disagree_with_the_launchers_are_refused(tmp_path):
    result = p3kv_job(tmp_path / "x.pt", "--servers", "3", "--steps", "1")
    assert result.returncode != 0
    assert "distribute(servers=3) but this job has 2 servers" in result.stdout, result.stdout


@pytest.mark.integration
@pytest.mark.parametrize("victim", [1, 0])  # worker 0 is the services' parent
def test_a_killed_worker_ends_torchrun_and_p3kvs_services_naming_it(nodes, tmp_path, victim):
    job = Node("torchrun", torchrun_argv(os.devnull, "--steps", "100000"), torchrun_env())
    nodes.append(job)
    ranks = {int(m.group(1)): int(m.group(2))
             for m in job.wait_for_many(r"ready rank=(\d) pid=(\d+)", 2, timeout=90)}
    job.wait_for(r"step 3 loss", timeout=60)
    pids = service_pids(job.output)
    assert len(pids) == 3, job.output
    os.kill(ranks[victim], signal.SIGKILL)
    killed = time.monotonic()
    assert job.finish(FAILURE_BOUND) != 0, job.output
    # torchrun names the first failure: the killed rank, by SIGKILL.
    assert re.search(rf"rank\s*:\s*{victim} \(local_rank: {victim}\)\s+exitcode\s*:\s*-9", job.output), job.output
    while [p for p in pids.values() if running(p)] and time.monotonic() - killed < FAILURE_BOUND:
        time.sleep(0.1)
    assert not [name for name, pid in pids.items() if running(pid)], job.output
    assert time.monotonic() - killed < FAILURE_BOUND


@pytest.mark.integration
def test_without_torchrun_p3kvs_heartbeats_end_the_services_of_a_killed_worker(nodes, tmp_path):
    """The scheduler's own machinery (not torchrun's stop of process groups): two workers started with torchrun's
    variables by hand, without torchrun; worker 1 is killed; worker 0 and the services it started end naming it."""
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    port = str(free_port())
    workers = []
    for rank in range(2):
        env = torchrun_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port, P3_SECRET_FILE=str(secret),
                           P3_HEARTBEAT_TIMEOUT="5")
        argv = [sys.executable, TRAIN, "p3kv", os.devnull, "--servers", "2", "--steps", "100000"]
        workers.append(Node(f"worker {rank}", argv, env))
        nodes.append(workers[-1])
    for w in workers:
        w.wait_for(r"step 3 loss", timeout=90)
    pids = service_pids(workers[0].output)
    assert len(pids) == 3, workers[0].output
    os.kill(workers[1].proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert workers[0].finish(FAILURE_BOUND) != 0, workers[0].output
    assert "worker 1" in workers[0].output, workers[0].output
    while [p for p in pids.values() if running(p)] and time.monotonic() - killed < FAILURE_BOUND:
        time.sleep(0.1)
    assert not [name for name, pid in pids.items() if running(pid)], workers[0].output


@pytest.mark.integration
def test_reaping_reports_a_failed_service_and_kills_one_that_outlives_the_job():
    import subprocess

    from p3kv.launch.child_services import ChildServices

    services = ChildServices()
    services.children += [("p3kv server 0 of node 0", subprocess.Popen([sys.executable, "-c", "exit(3)"])),
                          ("p3kv scheduler", subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))]
    failed = services.reap(timeout=2.0)
    assert failed[0].startswith("p3kv server 0 of node 0 (pid ") and failed[0].endswith("exited with code 3")
    assert "p3kv scheduler" in failed[1] and "still ran 2 s after this worker closed; killed it" in failed[1]
    assert [proc.poll() for _, proc in services.children] == [3, -signal.SIGKILL]
