"""torchrun's environment for the workers of a p3 job, so that a script written for torchrun (or p3kv.torch)
finds its rank where it looks: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.

RANK equals the worker's p3kv rank: on one host the launcher also sets P3_WORKER_RANK to it, and the scheduler
gives each worker the rank it asks for. Across hosts the launcher of one host cannot know the ranks of the
others' workers, so it exports no RANK: there the script takes its rank from p3kv.torch.worker().rank.
MASTER_ADDR/MASTER_PORT name a free port on the scheduler's host for a torch.distributed store the script may
start itself (p3kv does not use it).
"""

from __future__ import annotations


def worker_environment(local_rank: int, local_workers: int, num_workers: int, master_addr: str, master_port: int,
                       single_host: bool) -> dict[str, str]:
    env = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_workers), "WORLD_SIZE": str(num_workers),
           "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}
    if single_host:
        env.update(RANK=str(local_rank), GROUP_RANK="0", P3_WORKER_RANK=str(local_rank))
    return env
