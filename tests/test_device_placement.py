"""Which accelerator each worker of a host trains on (`fab bench`, deploy/compare.py): p3kv.launch numbers every
host's workers for every system (LOCAL_RANK for p3kv's and MXNet's, HOROVOD_LOCAL_RANK for Horovod's), and
benchmarks/workloads/device_worker.py trains on the visible GPU of that local rank. The end-to-end run with two
workers on one host is tests/test_deploy.py's."""

import logging

import pytest

from p3kv.launch import Job, KVStore, plan


@pytest.mark.unit
@pytest.mark.parametrize("kvstore", [KVStore.P3, KVStore.DIST_SYNC, KVStore.MXNET_P3])
def test_every_systems_workers_on_a_host_get_their_local_rank(kvstore):
    job = Job(command=("train",), num_workers=3, num_servers=2, kvstore=kvstore, port=4242,
              env={"P3_SECRET": "s"}, local_workers=2, local_servers=1, scheduler=False, root="10.0.0.1")
    workers = [s for s in plan(job, "127.0.0.1", 4242, {"LOCAL_RANK": "7"}) if s.name.startswith("worker")]
    assert [(s.env["LOCAL_RANK"], s.env["LOCAL_WORLD_SIZE"]) for s in workers] == [("0", "2"), ("1", "2")]


@pytest.mark.unit
def test_servers_get_no_local_rank():
    job = Job(command=("train",), num_workers=1, num_servers=1, kvstore=KVStore.DIST_SYNC)
    [server] = [s for s in plan(job, "127.0.0.1", 4242, {}) if s.name.startswith("server")]
    assert "LOCAL_RANK" not in server.env


@pytest.mark.mxnet
def test_a_worker_trains_on_the_gpu_of_its_local_rank(caplog):
    from benchmarks.workloads.device_worker import gpu_index, local_rank

    assert local_rank({}) == (0, 1)
    assert local_rank({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == (1, 2)
    # Horovod's own numbering wins where both are set (its ranks are what its allreduce pairs up).
    assert local_rank({"HOROVOD_LOCAL_RANK": "3", "HOROVOD_LOCAL_SIZE": "4", "LOCAL_RANK": "0"}) == (3, 4)
    assert gpu_index({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 0) is None  # no GPU: the CPU
    assert [gpu_index({"LOCAL_RANK": str(k), "LOCAL_WORLD_SIZE": "4"}, 4) for k in range(4)] == [0, 1, 2, 3]
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        assert [gpu_index({"LOCAL_RANK": str(k), "LOCAL_WORLD_SIZE": "3"}, 2) for k in range(3)] == [0, 1, 0]
    assert "3 workers on this host share 2 visible GPUs" in caplog.text
