"""Start a p3kv job (or an MXNet parameter-server baseline) on this machine.

    python -m p3kv.launch -n 2 -s 2 -- python train.py --kvstore p3
    python -m p3kv.launch -n 2 -s 1 --kvstore dist_sync -- python train.py

A job across hosts runs one launcher per host, each starting only its own share of the processes; every host
gives the same -n/-s, --root and --port, and the same secret (P3_SECRET or P3_SECRET_FILE)::

    host0$ python -m p3kv.launch -n 2 -s 2 --host 10.0.0.1 --port 9000 --local-workers 1 --local-servers 1 -- ...
    host1$ python -m p3kv.launch -n 2 -s 2 --host 10.0.0.2 --root 10.0.0.1 --port 9000 --no-scheduler \
               --local-workers 1 --local-servers 1 -- ...

Starts one scheduler, S servers and W workers (the command), gives each the environment of its role, prefixes
their output with "[worker 0] " etc., and exits with 0 when every worker exited 0 and then the scheduler and
servers exited 0. The first process to fail stops the whole job; the launcher then exits with its code.

From Python: ``launch(Job(command=("python", "train.py"), num_workers=2, num_servers=2))``.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import errno
import logging
import math
import os
import secrets
import shlex
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import TextIO

from p3kv import config
from p3kv.config import Role
from p3kv.errors import ConfigError
from p3kv.supervisor import ProcessSpec, Supervisor

LOG = logging.getLogger("p3kv.launch")

BASELINE_VARIABLE = "P3_BASELINE"  # set for baseline workers: "dist_sync" or "mxnet-p3"
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


class KVStore(enum.Enum):
    """Which parameter server the job runs."""

    P3 = "p3"  # p3kv's scheduler and servers
    DIST_SYNC = "dist_sync"  # MXNet's own ps-lite servers (the baseline)
    MXNET_P3 = "mxnet-p3"  # MXNet's built-in port of P3 (ps-lite's P3 van); needs update_on_kvstore=False


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

    @property
    def spans_hosts(self) -> bool:
        return (not self.scheduler or (self.local_workers is not None and self.local_workers < self.num_workers)
                or (self.local_servers is not None and self.local_servers < self.num_servers))

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no worker command given: put it after the options, e.g. "
                              "python -m p3kv.launch -n 2 -s 1 -- python train.py")
        for flag, value in (("-n/--num-workers", self.num_workers), ("-s/--num-servers", self.num_servers)):
            if value < 1:
                raise ConfigError(f"{flag} must be at least 1 (got {value})")
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
        for flag, argv in (("--server-command", self.server_command),
                           ("--scheduler-command", self.scheduler_command)):
            if argv is not None and not argv:
                raise ConfigError(f"{flag} is empty: give a command, or leave the option out for the default")


def local_address(host: str) -> str:
    """The IPv4 address `host` stands for, checked to belong to this machine (every process runs here)."""
    try:
        address = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"--host {host!r} cannot be resolved ({e}); give an IPv4 address of this "
                          "machine, e.g. 127.0.0.1") from None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
        except OSError as e:
            raise ConfigError(f"--host {host} ({address}) is not an address of this machine ({e.strerror}); "
                              f"use one of: {', '.join(_addresses())}") from None
    return str(address)


def _addresses() -> list[str]:
    found = []
    for _, name in socket.if_nameindex():
        try:
            found.append(config.interface_address(name))
        except ConfigError:
            continue
    return found or ["127.0.0.1"]


def free_port(address: str) -> int:
    """A TCP port that is free on `address` now. Another process may take it before the scheduler binds it;
    pass --port to choose one yourself."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def check_port(address: str, port: int) -> None:
    """ConfigError if something listens on address:port (SO_REUSEADDR ignores connections in TIME_WAIT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as e:
            hint = "leave --port out to pick a free one" if e.errno == errno.EADDRINUSE else "pick another"
            raise ConfigError(f"--port {port} cannot be used on {address} ({e.strerror}); {hint}") from None


def _default_command(kvstore: KVStore, role: Role) -> tuple[str, ...]:
    if kvstore is KVStore.P3:
        return (sys.executable, "-m", f"p3kv.{role.value}")
    # With DMLC_ROLE=scheduler/server, importing mxnet runs ps-lite's node and returns when the job ends.
    return (sys.executable, "-c", "import mxnet")


# Gradients become ready layer by layer only when MXNet does not bulk backward operators; P3's (and MXNet's
# own) overlap of communication with backward needs that. Set for workers unless the user set it.
BULK_VARIABLE = "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD"
AUTOLOAD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autoload")


def _role_environment(job: Job, role: Role, host: str, port: int, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    root = job.root or host
    if role is Role.WORKER:
        env.setdefault(BULK_VARIABLE, "1")
    if job.kvstore is KVStore.P3:
        if role is Role.WORKER:
            # `import p3kv` at start-up (autoload/sitecustomize.py): unmodified scripts find kvstore 'p3'.
            env["PYTHONPATH"] = os.pathsep.join(p for p in (AUTOLOAD_DIR, env.get("PYTHONPATH", "")) if p)
        cfg = config.load(env, role=role, root_uri=root, root_port=port, num_worker=job.num_workers,
                          num_server=job.num_servers, node_host=host)
        env.update(config.environment_for(cfg, role))
        # An inherited DMLC_ROLE=server would turn a worker's `import mxnet` into an MXNet server.
        env.pop("DMLC_ROLE", None)
        env.pop(BASELINE_VARIABLE, None)
        return env
    env.update({
        "DMLC_ROLE": role.value, "DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_WORKER": str(job.num_workers), "DMLC_NUM_SERVER": str(job.num_servers), "DMLC_NODE_HOST": host,
    })
    if job.kvstore is KVStore.MXNET_P3:
        env["DMLC_PS_VAN_TYPE"] = "p3"
        env.setdefault("DMLC_PS_WATER_MARK", "10")
    else:
        env.pop("DMLC_PS_VAN_TYPE", None)
    if role is Role.WORKER:
        env[BASELINE_VARIABLE] = job.kvstore.value
    else:
        env.pop(BASELINE_VARIABLE, None)
    return env


JOIN_HINT = ("its command ended without creating kvstore 'p3' or a P3Worker; e.g. gluon.Trainer creates the "
             "kvstore at the first trainer.step, Module.fit at fit, or call mx.kv.create('p3')")


def plan(job: Job, host: str, port: int, environ: Mapping[str, str], joined_dir: str | None = None
         ) -> list[ProcessSpec]:
    """The processes of `job` in launch order (scheduler, servers, workers) with their whole environments:
    `environ`, then `job.env`, then the role's variables. `host` must be an address (see `local_address`).
    With `joined_dir`, each worker of a p3 job with p3kv's own scheduler gets P3_JOINED_FILE in that directory:
    a worker that exits 0 without having joined then fails the job at once, named."""
    base = dict(environ)
    base.pop("P3_JOINED_FILE", None)  # per worker, below (a launcher started inside a worker must not inherit it)
    base.setdefault("PYTHONUNBUFFERED", "1")  # so output is forwarded as it is written, not at exit
    base.update(job.env)
    if job.kvstore is KVStore.P3 and not base.get("P3_SECRET") and not base.get("P3_SECRET_FILE"):
        if job.spans_hosts:
            raise ConfigError("a p3 job across hosts needs the same secret on every host: set P3_SECRET_FILE to "
                              "a file only you can read (or P3_SECRET) on each host, e.g. from "
                              "python -c 'import secrets; print(secrets.token_hex(32))'")
        # A fresh secret per job: only this job's processes can connect to its scheduler and servers.
        base["P3_SECRET"] = secrets.token_hex(32)
    workers = job.num_workers if job.local_workers is None else job.local_workers
    servers = job.num_servers if job.local_servers is None else job.local_servers
    # With no worker here, this host's share is done when its services exit 0 (they stop when the job ends).
    services_primary = workers == 0
    specs = []
    if job.scheduler:
        specs.append(ProcessSpec("scheduler", job.scheduler_command or _default_command(job.kvstore, Role.SCHEDULER),
                                 _role_environment(job, Role.SCHEDULER, host, port, base), "scheduler",
                                 primary=services_primary))
    server_env = _role_environment(job, Role.SERVER, host, port, base)
    server_argv = job.server_command or _default_command(job.kvstore, Role.SERVER)
    specs += [ProcessSpec(f"server {i}", server_argv, server_env, f"server{i}", primary=services_primary)
              for i in range(servers)]
    worker_env = _role_environment(job, Role.WORKER, host, port, base)
    for i in range(workers):
        # With a stand-in scheduler (--scheduler-command, for tests) workers need not join anything.
        joined = None
        if joined_dir is not None and job.kvstore is KVStore.P3 and job.scheduler_command is None:
            joined = os.path.join(joined_dir, f"worker{i}.joined")
        env = worker_env if joined is None else {**worker_env, "P3_JOINED_FILE": joined}
        specs.append(ProcessSpec(f"worker {i}", job.command, env, f"worker{i}", primary=True, joined_file=joined,
                                 join_hint=JOIN_HINT))
    if not specs:
        raise ConfigError("nothing to run on this host: --no-scheduler with --local-workers 0 and "
                          "--local-servers 0")
    return specs


def launch(job: Job, out: TextIO | None = None) -> int:
    """Run `job` to its end; its exit code (0: every process succeeded, 124: timed out, 128+N: the launcher got
    signal N, else the code of the first process that failed). Child output goes to `out` (default stdout).
    Raises ConfigError for a job that cannot start (bad host, port in use, bad P3_* variable, bad log dir).
    Called from the main thread, it handles SIGINT/SIGTERM/SIGHUP itself (stops the job) until it returns."""
    host = local_address(job.host)
    if job.port and job.scheduler:
        check_port(host, job.port)
    port = job.port or free_port(host)
    with tempfile.TemporaryDirectory(prefix="p3kv-launch-") as joined_dir:
        return _run(job, host, port, plan(job, host, port, os.environ, joined_dir), out)


def _run(job: Job, host: str, port: int, specs: list[ProcessSpec], out: TextIO | None) -> int:
    if job.log_dir is not None:
        try:
            os.makedirs(job.log_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--log-dir {job.log_dir}: cannot create it ({e.strerror}); pass a writable "
                              "directory") from None
    LOG.info("%s job with scheduler at %s:%d, %d servers, %d workers; here (%s): %s", job.kvstore.value,
             job.root or host, port, job.num_servers, job.num_workers, host, ", ".join(s.name for s in specs))
    supervisor = Supervisor(specs, out=sys.stdout if out is None else out, log_dir=job.log_dir,
                            timeout=job.timeout, grace=job.grace, kill_grace=job.kill_grace)
    try:
        outcome = supervisor.run()
    except OSError as e:
        raise ConfigError(f"--log-dir {job.log_dir}: cannot write logs there ({e}); pass a writable "
                          "directory") from None
    if outcome.exit_code:
        LOG.error("%s", outcome.message)
    else:
        LOG.info("%s", outcome.message)
    return outcome.exit_code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(f"{message} (see python -m p3kv.launch --help)")


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not key.replace("_", "a").isalnum():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _command(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m p3kv.launch", description="Run a p3kv (or MXNet dist_sync) job on this machine: "
                "1 scheduler, S servers and W workers running COMMAND.")
    p.add_argument("-n", "--num-workers", type=int, required=True, metavar="W", help="number of workers")
    p.add_argument("-s", "--num-servers", type=int, required=True, metavar="S", help="number of servers")
    p.add_argument("--kvstore", choices=[k.value for k in KVStore], default=KVStore.P3.value,
                   help="p3 (default); dist_sync or mxnet-p3 run MXNet's own parameter server as a baseline")
    p.add_argument("--host", default="127.0.0.1", help="address of this machine the processes use "
                   "(default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="scheduler port (default: a free one)")
    p.add_argument("--local-workers", type=int, metavar="K", help="a job across hosts: start K of the W "
                   "workers on this host (default: all)")
    p.add_argument("--local-servers", type=int, metavar="K", help="start K of the S servers on this host "
                   "(default: all)")
    p.add_argument("--no-scheduler", action="store_true", help="the scheduler runs on another host, at --root "
                   "and --port")
    p.add_argument("--root", metavar="ADDRESS", help="with --no-scheduler: the scheduler's address")
    p.add_argument("--server-command", type=_command, metavar="CMD", help="run CMD as each server instead of "
                   "the default (split like a shell does)")
    p.add_argument("--scheduler-command", type=_command, metavar="CMD", help="run CMD as the scheduler")
    p.add_argument("--env", type=_env_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="set KEY for every process (repeatable), e.g. --env P3_SLICE_SIZE=40000")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="kill the job after SECONDS; exit 124")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE, metavar="SECONDS", help="how long the scheduler "
                   f"and servers may take to exit after the last worker (default {DEFAULT_GRACE:g})")
    p.add_argument("--log-dir", metavar="DIR", help="also write each process's output to DIR/scheduler.log, "
                   "DIR/server<i>.log, DIR/worker<i>.log")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the launcher does")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the worker command (after --)")
    return p


def job_from_args(argv: Sequence[str]) -> tuple[Job, bool]:
    """Parse the command line into a Job and the --verbose flag. Raises ConfigError."""
    args = _parser().parse_args(list(argv))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    job = Job(command=tuple(command), num_workers=args.num_workers, num_servers=args.num_servers,
              kvstore=KVStore(args.kvstore), host=args.host, port=args.port, env=dict(args.env),
              server_command=args.server_command, scheduler_command=args.scheduler_command,
              timeout=args.timeout, log_dir=args.log_dir, grace=args.grace, local_workers=args.local_workers,
              local_servers=args.local_servers, scheduler=not args.no_scheduler, root=args.root)
    return job, args.verbose


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(format="%(name)s: %(levelname)s: %(message)s", stream=sys.stderr)
    try:
        job, verbose = job_from_args(sys.argv[1:] if argv is None else argv)
        level = "INFO" if verbose else str(config.get("P3_LOG_LEVEL")).upper()
        if not isinstance(logging.getLevelName(level), int):
            raise ConfigError(f"P3_LOG_LEVEL={level!r} is not a log level: use DEBUG, INFO, WARNING or ERROR")
        logging.getLogger("p3kv").setLevel(level)
        return launch(job)
    except ConfigError as e:
        LOG.error("%s", e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
