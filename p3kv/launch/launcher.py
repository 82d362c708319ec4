"""Start a p3kv job (or an MXNet parameter-server baseline) on this machine: plan each process's environment,
then run them under a Supervisor. The command line is p3kv.launch.cli.

    python -m p3kv.launch -n 2 -s 2 -- python train.py --kvstore p3
    python -m p3kv.launch -n 2 -s 1 --kvstore dist_sync -- python train.py
    python -m p3kv.launch -n 2 -s 0 --kvstore horovod -- python train_horovod.py

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

import errno
import logging
import os
import random
import secrets
import socket
import sys
import tempfile
from collections.abc import Mapping
from typing import TextIO

from p3kv.core import config
from p3kv.core.config import BULK_VARIABLE, Role
from p3kv.core.errors import ConfigError
from p3kv.launch import baselines, horovod, torchrun
from p3kv.launch.job import BASELINE_VARIABLE, SERVER_MODULES, Job, KVStore
from p3kv.launch.supervisor import ProcessSpec, Supervisor

LOG = logging.getLogger("p3kv.launch")


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


EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_PORT = 10000  # below: the well-known and registered services' usual ports


def ephemeral_ports(path: str = EPHEMERAL_FILE) -> range:
    """The ports the kernel gives connections as their source port (and `bind(0)`); Linux's default if unreadable."""
    try:
        with open(path) as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port(address: str, ephemeral: range | None = None, attempts: int = 64) -> int:
    """A TCP port that is free on `address` now, chosen at random outside the kernel's ephemeral range (from
    LOWEST_PORT up to it, or above it) where there is one. In that range the port could become some connection's
    source port before the scheduler binds it, and a node that connects before the scheduler listens could then
    be connected to itself (TCP's simultaneous open, which p3kv's nodes retry and ps-lite's do not check). Another
    process may still bind it first; pass --port to choose one yourself."""
    ephemeral = ephemeral_ports() if ephemeral is None else ephemeral
    outside = [r for r in (range(LOWEST_PORT, ephemeral.start), range(ephemeral.stop, 65536)) if len(r)]
    chooser = random.SystemRandom()
    for _ in range(attempts if outside else 0):
        span = chooser.choices(outside, weights=[len(r) for r in outside])[0]
        port = chooser.choice(span)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((address, port))
            except OSError:
                continue  # taken: another try
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the kernel's choice, as a last resort
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


def _default_command(kvstore: KVStore, role: Role, servers: str = "mxnet") -> tuple[str, ...]:
    if kvstore is KVStore.P3:  # "mxnet" servers run the MXNet optimizer workers send (they sum until one arrives)
        module = SERVER_MODULES[servers] if role is Role.SERVER else f"p3kv.core.{role.value}"
        return (sys.executable, "-m", module)
    return baselines.command(role)


AUTOLOAD_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "autoload")


def _role_environment(job: Job, role: Role, host: str, port: int, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    root = job.root or host
    if role is Role.WORKER:
        env.setdefault(BULK_VARIABLE, "1")  # see p3kv.core.config
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
    baselines.set_environment(env, job, role, root, port, host)
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
    # Per worker, below (a launcher started inside a worker must not inherit them).
    for per_worker in ("P3_JOINED_FILE", "P3_WORKER_RANK", "RANK", "LOCAL_RANK"):
        base.pop(per_worker, None)
    base.setdefault("PYTHONUNBUFFERED", "1")  # so output is forwarded as it is written, not at exit
    base.update(job.env)
    if job.kvstore is KVStore.P3 and not base.get("P3_SECRET") and not base.get("P3_SECRET_FILE"):
        if job.spans_hosts:
            raise ConfigError("a p3 job across hosts needs the same secret on every host: set P3_SECRET_FILE to "
                              "a file only you can read (or P3_SECRET) on each host, e.g. from "
                              "python -c 'import secrets; print(secrets.token_hex(32))'")
        # A fresh secret per job: only this job's processes can connect to its scheduler and servers.
        base["P3_SECRET"] = secrets.token_hex(32)
    if job.kvstore is KVStore.HOROVOD:
        return horovod.plan(job, host, port, base)
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
    server_argv = job.server_command or _default_command(job.kvstore, Role.SERVER, job.servers)
    specs += [ProcessSpec(f"server {i}", server_argv, server_env, f"server{i}", primary=services_primary)
              for i in range(servers)]
    worker_env = _role_environment(job, Role.WORKER, host, port, base)
    master_port = free_port(host) if job.kvstore is KVStore.P3 else 0
    for i in range(workers):
        # With a stand-in scheduler (--scheduler-command, for tests) workers need not join anything.
        joined = None
        if joined_dir is not None and job.kvstore is KVStore.P3 and job.scheduler_command is None:
            joined = os.path.join(joined_dir, f"worker{i}.joined")
        env = worker_env if joined is None else {**worker_env, "P3_JOINED_FILE": joined}
        if job.kvstore is KVStore.P3:
            env = {**env, **torchrun.worker_environment(i, workers, job.num_workers, job.root or host, master_port,
                                                        not job.spans_hosts)}
        else:  # MXNet's baselines have no local rank of their own: a script picks its GPU by this one
            env = {**env, "LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": str(workers)}
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


