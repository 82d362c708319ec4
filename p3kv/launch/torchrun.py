"""torchrun's variables, both ways.

Out: the environment `python -m p3kv.launch` gives a p3 job's workers, so that a script written for torchrun (or
p3kv.torch) finds its rank where it looks: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT. RANK equals the worker's p3kv rank: on one host the launcher also sets P3_WORKER_RANK to it, and the
scheduler gives each worker the rank it asks for. Across hosts the launcher of one host cannot know the ranks of
the others' workers, so it exports no RANK: there the script takes its rank from p3kv.torch.worker().rank.
MASTER_ADDR/MASTER_PORT name a free port on the scheduler's host for a torch.distributed store the script may
start itself (p3kv does not use it).

In: `TorchrunJob`, what a process started by torchrun (no p3kv launcher) learns from torchrun's variables, checked
for consistency; p3kv.torch.torchrun starts p3kv's scheduler and servers from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from p3kv.core import config
from p3kv.core.errors import ConfigError

# What torchrun exports to every worker (torch.distributed.elastic's local agent); GROUP_RANK / GROUP_WORLD_SIZE
# (the node's index and the number of nodes) are optional here: derived from the others when missing.
REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Per worker process: a scheduler or server started by one must not inherit them.
PER_PROCESS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "P3_WORKER_RANK", "P3_JOINED_FILE")


def worker_environment(local_rank: int, local_workers: int, num_workers: int, master_addr: str, master_port: int,
                       single_host: bool) -> dict[str, str]:
    env = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_workers), "WORLD_SIZE": str(num_workers),
           "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}
    if single_host:
        env.update(RANK=str(local_rank), GROUP_RANK="0", P3_WORKER_RANK=str(local_rank))
    return env


def started_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process has torchrun's variables but no p3kv job description (P3_ROLE): a script started by
    torchrun (or a launcher like it) that must start p3kv's services itself."""
    return not config.get("P3_ROLE", environ) and all(config.get(name, environ) for name in ("RANK", "WORLD_SIZE"))


@dataclasses.dataclass(frozen=True)
class TorchrunJob:
    """One worker process's view of a torchrun job. Nodes are torchrun's agents (one per host): node `node` of
    `nodes` runs workers `node * local_world_size` ... (torchrun numbers ranks node by node)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int
    nodes: int
    master_addr: str
    master_port: int
    agent_store: bool  # torchrun's TCPStore at MASTER_ADDR:MASTER_PORT serves the workers too
    run_id: str
    restart: int

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> TorchrunJob:
        """Reads torchrun's variables; ConfigError naming what is missing or inconsistent."""
        env = {name: str(config.get(name, environ)) for name in (*REQUIRED, "GROUP_RANK", "GROUP_WORLD_SIZE",
                                                                 "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
                                                                 "TORCHELASTIC_RESTART_COUNT")}
        missing = [name for name in REQUIRED if not env[name]]
        if missing:
            raise ConfigError(f"{', '.join(missing)} not set: starting p3kv's scheduler and servers from a worker "
                              "needs torchrun's variables (run the script with `torchrun --nproc-per-node W "
                              "train.py`), or start the job with `python -m p3kv.launch -n W -s S -- python "
                              "train.py`, which starts them itself")

        def number(name: str, default: int | None = None) -> int:
            raw = env[name]
            if not raw and default is not None:
                return default
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not an integer (torchrun sets it)") from None

        rank, world, local_rank, local_world = (number(n) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                   "LOCAL_WORLD_SIZE"))
        port = number("MASTER_PORT")
        if world < 1 or local_world < 1:
            raise ConfigError(f"WORLD_SIZE={world} and LOCAL_WORLD_SIZE={local_world} must be at least 1")
        if not 0 <= rank < world:
            raise ConfigError(f"RANK={rank} is not a rank of WORLD_SIZE={world} workers (0 to {world - 1})")
        if not 0 <= local_rank < local_world:
            raise ConfigError(f"LOCAL_RANK={local_rank} is not a local rank of LOCAL_WORLD_SIZE={local_world} "
                              f"workers (0 to {local_world - 1})")
        if world % local_world:
            raise ConfigError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}: p3kv needs "
                              "the same number of workers on every node (torchrun --nproc-per-node)")
        nodes = number("GROUP_WORLD_SIZE", world // local_world)
        node = number("GROUP_RANK", rank // local_world)
        if nodes * local_world != world:
            raise ConfigError(f"GROUP_WORLD_SIZE={nodes} nodes of LOCAL_WORLD_SIZE={local_world} workers are not "
                              f"WORLD_SIZE={world}: p3kv needs the same number of workers on every node")
        if not 0 <= node < nodes or node * local_world + local_rank != rank:
            raise ConfigError(f"RANK={rank} is not node GROUP_RANK={node}'s local rank LOCAL_RANK={local_rank} "
                              f"(of {local_world} per node): p3kv starts each node's servers from its local rank 0 "
                              "and needs torchrun's numbering, rank = node * LOCAL_WORLD_SIZE + local rank")
        if not 0 < port < 65536:
            raise ConfigError(f"MASTER_PORT={port} is not a TCP port (1-65535)")
        return cls(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world, node=node,
                   nodes=nodes, master_addr=env["MASTER_ADDR"], master_port=port,
                   agent_store=env["TORCHELASTIC_USE_AGENT_STORE"] == "True",
                   run_id=env["TORCHELASTIC_RUN_ID"] or "none", restart=number("TORCHELASTIC_RESTART_COUNT", 0))

    @property
    def starts_scheduler(self) -> bool:
        """Local rank 0 of node 0 runs the scheduler (on the master's node)."""
        return self.node == 0 and self.local_rank == 0

    def local_servers(self, servers: int) -> int:
        """How many of the job's `servers` this process starts: each node's local rank 0 starts its share (the
        first `servers % nodes` nodes one more), the other workers none."""
        if servers < 1:
            raise ConfigError(f"servers={servers}: a p3kv job needs at least one server")
        if self.local_rank != 0:
            return 0
        return servers // self.nodes + (1 if self.node < servers % self.nodes else 0)
