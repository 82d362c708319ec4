"""What the launcher runs: a `Job` (the processes of one p3kv job, or of an MXNet baseline, on this host) and
the checks that refuse an inconsistent one before anything starts."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping

from p3kv.core.errors import ConfigError

BASELINE_VARIABLE = "P3_BASELINE"  # set for baseline workers: "dist_sync" or "mxnet-p3" (see p3kv.core.config)
DEFAULT_GRACE = 30.0
DEFAULT_KILL_GRACE = 5.0

# Variables the launcher sets for every process; --env may not set them. Value: the option to use instead.
_MANAGED = {
    "P3_ROLE": "nothing (it is per process)", "P3_ROOT_URI": "--host", "P3_ROOT_PORT": "--port",
    "P3_NUM_WORKER": "-n", "P3_NUM_SERVER": "-s", "P3_NODE_HOST": "--host", BASELINE_VARIABLE: "--kvstore",
    "DMLC_ROLE": "nothing (it is per process)", "DMLC_PS_ROOT_URI": "--host", "DMLC_PS_ROOT_PORT": "--port",
    "DMLC_NUM_WORKER": "-n", "DMLC_NUM_SERVER": "-s", "DMLC_NODE_HOST": "--host", "DMLC_PS_VAN_TYPE": "--kvstore",
    "P3_JOINED_FILE": "nothing (it is per worker)",
}


SERVER_MODULES = {"mxnet": "p3kv.mxnet.server", "core": "p3kv.core.server"}


class KVStore(enum.Enum):
    """Which parameter server the job runs."""

    P3 = "p3"  # p3kv's scheduler and servers
    DIST_SYNC = "dist_sync"  # MXNet's own ps-lite servers (the baseline)
    MXNET_P3 = "mxnet-p3"  # MXNet's built-in port of P3 (ps-lite's P3 van); needs update_on_kvstore=False
    HOROVOD = "horovod"  # Horovod's ring allreduce over Gloo: no servers, a rendezvous (p3kv.launch.horovod)


@dataclasses.dataclass(frozen=True)
class Job:
    """What to run. `command` is the worker's argv; `env` adds to (and overrides) the launcher's environment.
    `server_command`/`scheduler_command` replace the default processes of those roles (for debugging and
    tests). `timeout` (seconds) bounds the whole job; `grace` is how long the scheduler and servers may take to
    exit after the last worker; `kill_grace` is how long a process has between SIGTERM and SIGKILL."""

    command: tuple[str, ...]
    num_workers: int
    num_servers: int
    kvstore: KVStore = KVStore.P3
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free one
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    server_command: tuple[str, ...] | None = None
    scheduler_command: tuple[str, ...] | None = None
    timeout: float | None = None
    log_dir: str | None = None
    grace: float = DEFAULT_GRACE
    kill_grace: float = DEFAULT_KILL_GRACE
    # A job across hosts: this host's share of the processes (None: all of them) and where the scheduler is.
    local_workers: int | None = None
    local_servers: int | None = None
    scheduler: bool = True  # run the scheduler here (at `host`); False: it runs at `root`
    root: str | None = None
    # Horovod only: every host's address and worker count, in rank order (None: this host runs all W).
    slots: tuple[tuple[str, int], ...] | None = None
    # p3 jobs: which servers run (SERVER_MODULES): "mxnet" (MXNet's optimizer when a worker sends one) or "core"
    # (framework-free, import neither MXNet nor torch: they sum; what p3kv.torch's worker placement needs).
    servers: str = "mxnet"

    @property
    def spans_hosts(self) -> bool:
        return (not self.scheduler or (self.local_workers is not None and self.local_workers < self.num_workers)
                or (self.local_servers is not None and self.local_servers < self.num_servers))

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no worker command given: put it after the options, e.g. "
                              "python -m p3kv.launch -n 2 -s 1 -- python train.py")
        if self.num_workers < 1:
            raise ConfigError(f"-n/--num-workers must be at least 1 (got {self.num_workers})")
        if self.kvstore is KVStore.HOROVOD:
            self._check_horovod()
        elif self.num_servers < 1:
            raise ConfigError(f"-s/--num-servers must be at least 1 (got {self.num_servers})")
        elif self.slots is not None:
            raise ConfigError("--slots is Horovod's slot plan: use it with --kvstore horovod only")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"--port {self.port} is not a TCP port: use 1-65535, or 0 to pick a free one")
        for flag, seconds in (("--timeout", self.timeout), ("--grace", self.grace), ("kill_grace", self.kill_grace)):
            if seconds is not None and not 0 < seconds < math.inf:
                raise ConfigError(f"{flag} must be a positive number of seconds (got {seconds})")
        for key in self.env:
            if key in _MANAGED:
                raise ConfigError(f"--env {key}: the launcher sets {key} itself; use {_MANAGED[key]} instead")
        for flag, local, total in (("--local-workers", self.local_workers, self.num_workers),
                                   ("--local-servers", self.local_servers, self.num_servers)):
            if local is not None and not 0 <= local <= total:
                raise ConfigError(f"{flag} {local} must be between 0 and the job's total ({total})")
        if not self.scheduler and (not self.port or not self.root):
            raise ConfigError("--no-scheduler: give the scheduler's address and port with --root and --port "
                              "(the same on every host)")
        if self.scheduler and self.root:
            raise ConfigError("--root is for hosts without the scheduler: add --no-scheduler, or leave --root "
                              "out on the scheduler's host (it runs at --host)")
        if self.spans_hosts and not self.port:
            raise ConfigError("a job across hosts needs a fixed scheduler port: pass the same --port on every host")
        if self.servers not in SERVER_MODULES:
            raise ConfigError(f"--servers {self.servers!r}: use one of {', '.join(SERVER_MODULES)}")
        for flag, argv in (("--server-command", self.server_command),
                           ("--scheduler-command", self.scheduler_command)):
            if argv is not None and not argv:
                raise ConfigError(f"{flag} is empty: give a command, or leave the option out for the default")

    def _check_horovod(self) -> None:
        if self.num_servers != 0 or self.local_servers:
            raise ConfigError("Horovod has no servers (ring allreduce): pass -s 0 with --kvstore horovod")
        if self.server_command is not None:
            raise ConfigError("--server-command: a Horovod job has no servers")
        if self.slots is not None and sum(k for _, k in self.slots) != self.num_workers:
            plan = ",".join(f"{h}:{k}" for h, k in self.slots)
            raise ConfigError(f"--slots {plan} adds up to {sum(k for _, k in self.slots)} workers but -n is "
                              f"{self.num_workers}: list every host of the job with its worker count")
        if self.spans_hosts and self.slots is None:
            raise ConfigError("a Horovod job across hosts needs the slot plan: pass the same --slots ADDR:K,... "
                              "(every host's address and worker count, in rank order) on every host")
        if self.scheduler and self.local_workers == 0:
            raise ConfigError("Horovod's rendezvous runs while this host's workers run: start it (the scheduler's "
                              "place) on a host with workers")
