"""The baselines the launcher can run instead of p3kv: MXNet's own parameter server (`dist_sync`) and MXNet's
built-in port of P3 (`mxnet-p3`, ps-lite's P3 van). Both are ps-lite jobs: every process gets the DMLC_*
variables of its role, and the scheduler and servers are plain `import mxnet` processes."""

from __future__ import annotations

import sys

from p3kv.core import config
from p3kv.core.config import Role
from p3kv.launch.job import BASELINE_VARIABLE, Job, KVStore


def command(role: Role) -> tuple[str, ...]:
    """The scheduler's or a server's argv: with DMLC_ROLE=scheduler/server, importing mxnet runs ps-lite's node
    and returns when the job ends."""
    return (sys.executable, "-c", "import mxnet")


def set_environment(env: dict[str, str], job: Job, role: Role, root: str, port: int, host: str) -> None:
    """Adds the ps-lite variables of `role` in a baseline `job` to `env` (a process's whole environment).

    In an mxnet-p3 job the scheduler keeps ps-lite's plain ZMQ van; only workers and servers run the P3 van. The
    P3 van sends through a priority queue that is not first-in first-out among equal priorities (a message pushed
    is popped before older ones of its priority), and its sending thread stops at the first TERMINATE it pops. At
    the job's end the scheduler queues the final barrier's replies to every node, gets its own reply, and queues
    its TERMINATE: when that overtakes replies still queued, those nodes wait in the barrier forever (a finished
    job that never exits, seen in CI). The scheduler carries only control messages, so the van it uses does not
    change what MXNet's P3 sends; the plain van sends each reply before the next message is read."""
    env.update({
        "DMLC_ROLE": role.value, "DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_WORKER": str(job.num_workers), "DMLC_NUM_SERVER": str(job.num_servers), "DMLC_NODE_HOST": host,
    })
    if job.kvstore is KVStore.MXNET_P3 and role is not Role.SCHEDULER:
        env["DMLC_PS_VAN_TYPE"] = "p3"
        env["DMLC_PS_WATER_MARK"] = str(config.get("DMLC_PS_WATER_MARK", env))  # the user's, else the artifact's
    else:
        env.pop("DMLC_PS_VAN_TYPE", None)
    if role is Role.WORKER:
        env[BASELINE_VARIABLE] = job.kvstore.value
    else:
        env.pop(BASELINE_VARIABLE, None)
