"""A script started by torchrun, without p3kv's launcher, starts p3kv's scheduler and servers itself:

    model, optimizer = p3kv.torch.distribute(model, optimizer, servers=2)   # or, before it:
    p3kv.torch.init_from_torchrun(servers=2)

    torchrun --nproc-per-node 2 train.py

From torchrun's variables (p3kv.launch.torchrun.TorchrunJob): local rank 0 of node 0 starts the scheduler on its
node, at the address this node uses to reach MASTER_ADDR and on a free port, and publishes address, port and the
job's secret in torchrun's own store (the TCPStore at MASTER_ADDR:MASTER_PORT that torchrun shares with its
workers, TORCHELASTIC_USE_AGENT_STORE=True); local rank 0 of every node starts that node's share of the servers
(framework-free `python -m p3kv.core.server`); every worker joins with RANK as its p3kv rank. Without torchrun's
store (another launcher exporting the same variables) the scheduler listens at MASTER_ADDR:MASTER_PORT+1 and the
secret must come from P3_SECRET_FILE (or P3_SECRET) on every node.

The services are children of the worker that started them (p3kv.launch.child_services): they end with the job,
also when a worker dies (the scheduler sees its connection drop or its heartbeats stop, ends the job naming it,
and every server exits), and torchrun's stop of a failed job's process groups reaches them too.
"""

from __future__ import annotations

import atexit
import datetime
import json
import secrets
import socket
import sys

from p3kv.core import config, node
from p3kv.core.config import Config, Role
from p3kv.core.errors import ConfigError, P3Error
from p3kv.core.worker import P3Worker
from p3kv.launch.child_services import ChildServices
from p3kv.launch.launcher import free_port
from p3kv.launch.torchrun import TorchrunJob, started_by_torchrun


def init_from_torchrun(servers: int) -> P3Worker:
    """Starts this node's share of p3kv's services (see the module doc) and joins the job; returns this
    process's P3Worker, which p3kv.torch.worker() and distribute() then use. Call it once per process, in
    every worker, with the same `servers`. ConfigError when torchrun's variables are missing or inconsistent."""
    from p3kv.torch import distributed

    if distributed.joined():
        raise ConfigError("this process has joined a p3kv job already; call init_from_torchrun once, before "
                          "distribute (or pass servers= to distribute instead)")
    if config.get("P3_ROLE"):
        raise ConfigError("init_from_torchrun in a job started by python -m p3kv.launch: the launcher started "
                          "the scheduler and servers already; call distribute() without it")
    job = TorchrunJob.from_environment()
    job.local_servers(servers)  # refuses servers < 1 on every worker alike
    own_secret = bool(config.get("P3_SECRET") or config.get("P3_SECRET_FILE"))
    timeout = float(config.get("P3_CONNECT_TIMEOUT"))
    store = _agent_store(job, timeout) if job.agent_store else None
    if store is None and not own_secret:
        raise ConfigError("torchrun's store is not shared with the workers here (TORCHELASTIC_USE_AGENT_STORE is "
                          "not True), so p3kv cannot hand the job's secret to every worker: set P3_SECRET_FILE to "
                          "a file holding the same secret on every node (e.g. from python -c 'import secrets; "
                          "print(secrets.token_hex(32))')")
    key = f"p3kv/{job.run_id}/{job.restart}/scheduler"
    services = ChildServices()
    try:
        if job.starts_scheduler:
            host = config.route_address(job.master_addr, job.master_port)
            port = free_port(host) if store is not None else job.master_port + 1
            secret = None if own_secret else secrets.token_hex(32)
            cfg = _config(Role.SCHEDULER, host, port, job, servers, secret)
            node.configure_logging(cfg)
            services.start("p3kv scheduler", Role.SCHEDULER, cfg)
            if store is not None:
                # torchrun's store is as open as torch.distributed's own bootstrap; P3_SECRET_FILE keeps the secret
                # out of it.
                store.set(key, json.dumps({"host": host, "port": port, "secret": secret or ""}))
        elif store is not None:
            host, port, secret = _published(store, key, job, timeout)
            secret = None if own_secret else secret
        else:
            host, port, secret = _resolve(job.master_addr), job.master_port + 1, None
        for i in range(job.local_servers(servers)):
            cfg = _config(Role.SERVER, host, port, job, servers, secret)
            node.configure_logging(cfg)
            services.start(f"p3kv server {i} of node {job.node}", Role.SERVER, cfg)
        if services.children:
            # Registered before the worker's own close (atexit runs last-in first-out): reaped after it.
            atexit.register(_reap_at_exit, services, cfg.timeout + cfg.heartbeat_timeout)
        worker = P3Worker(_config(Role.WORKER, host, port, job, servers, secret, worker_rank=job.rank))
    except BaseException:
        services.kill()
        raise
    distributed.adopt(worker)
    return worker


def join(servers: int | None) -> None:
    """What distribute(servers=S) does before it joins: under torchrun start the services (init_from_torchrun);
    under p3kv's launcher check that S is the job's server count."""
    from p3kv.torch import distributed

    if servers is None:
        return
    if not distributed.joined() and started_by_torchrun():
        init_from_torchrun(servers)
        return
    have = distributed.worker().num_servers
    if have != servers:
        raise ConfigError(f"distribute(servers={servers}) but this job has {have} servers (python -m p3kv.launch "
                          "-s): give the same number, or leave servers= out under p3kv's launcher")


def _config(role: Role, host: str, port: int, job: TorchrunJob, servers: int, secret: str | None,
            worker_rank: int = -1) -> Config:
    """The job's description for `role` (the user's other P3_* settings apply)."""
    return config.load(role=role, root_uri=host, root_port=port, num_worker=job.world_size, num_server=servers,
                       secret=secret, worker_rank=worker_rank)


def _agent_store(job: TorchrunJob, timeout: float):
    """A client of torchrun's own TCPStore (as torch.distributed's env:// rendezvous connects to it)."""
    import torch.distributed as dist

    try:
        return dist.TCPStore(job.master_addr, job.master_port, is_master=False,
                             timeout=datetime.timedelta(seconds=timeout))
    except (RuntimeError, OSError) as e:
        raise P3Error(f"cannot reach torchrun's store at {job.master_addr}:{job.master_port} ({e}); is this "
                      "process a worker of a running torchrun?") from None


def _published(store, key: str, job: TorchrunJob, timeout: float) -> tuple[str, int, str | None]:
    try:
        info = json.loads(store.get(key))
    except (RuntimeError, OSError) as e:
        raise P3Error(f"p3kv's scheduler address did not appear in torchrun's store within {timeout:g} s "
                      f"(P3_CONNECT_TIMEOUT; {str(e).splitlines()[0] if str(e) else type(e).__name__}): local rank "
                      "0 of node 0 starts it; its output says why it did not") from None
    return str(info["host"]), int(info["port"]), info["secret"] or None


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise ConfigError(f"MASTER_ADDR={host!r} cannot be resolved ({e})") from None


def _reap_at_exit(services: ChildServices, timeout: float) -> None:
    """After this worker's clean close the job ends once every worker has closed, and the services exit: wait for
    them. A script dying of an exception (sys.last_value) does not close cleanly and must not wait: its
    connections drop as it exits, the scheduler then ends the job naming it, and the services exit."""
    if getattr(sys, "last_value", None) is not None:
        return
    services.reap(timeout)
