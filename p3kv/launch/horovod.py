"""Horovod as a launcher baseline (`--kvstore horovod`): ring allreduce over Gloo, the system MXNet users pick
instead of a parameter server. No servers; the scheduler's place is taken by Horovod's HTTP rendezvous, and each
worker gets the environment horovodrun's Gloo launcher would give it, so the same launcher (and `fab launch`,
`fab bench`) starts p3kv, MXNet's parameter servers and Horovod alike.

A job across hosts gives every launcher the same slot plan, ``--slots ADDR:K,ADDR:K,...`` (each host's address
and worker count, in rank order): ranks follow that order, as in Horovod's own host assignment. Gloo connects the
ranks by the address their host's *hostname* resolves to (Horovod's rule, not ours): on a real cluster each host's
name must resolve to its address on the job's network.

The rendezvous itself is p3kv.launch.rendezvous.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import socket
import sys
from collections.abc import Mapping, Sequence

from p3kv.core import config
from p3kv.core.errors import ConfigError
from p3kv.launch.job import Job
from p3kv.launch.supervisor import ProcessSpec

LOG = logging.getLogger("p3kv.launch")
INSTALL_HINT = ("install Horovod with MXNet and Gloo (`make bench-setup`, or HOROVOD_WITH_MXNET=1 "
                "HOROVOD_WITH_GLOO=1 pip install --no-build-isolation horovod==0.28.1)")


@dataclasses.dataclass(frozen=True)
class Slot:
    """One rank's place, as Horovod's host assignment gives it."""

    host: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int  # index among the hosts that have a rank with this local_rank
    cross_size: int


def parse_slots(text: str) -> tuple[tuple[str, int], ...]:
    """"ADDR:K,ADDR:K" -> ((ADDR, K), ...); ConfigError naming the bad part."""
    slots = []
    for part in (p.strip() for p in text.split(",")):
        host, sep, count = part.rpartition(":")
        if not sep or not host or not count.isdigit() or int(count) < 1:
            raise ConfigError(f"--slots {text!r}: {part!r} is not ADDRESS:WORKERS (e.g. 10.0.0.1:1); give every "
                              "host of the job, in rank order, the same on every host")
        slots.append((host, int(count)))
    hosts = [h for h, _ in slots]
    if len(set(hosts)) != len(hosts):
        raise ConfigError(f"--slots {text!r} names a host twice: give each host once with its worker count")
    return tuple(slots)


def assign(slots: Sequence[tuple[str, int]]) -> list[Slot]:
    """Every rank's Slot: ranks host by host in the plan's order (Horovod's get_host_assignments does the same)."""
    size = sum(k for _, k in slots)
    cross_sizes = [sum(1 for _, k in slots if k > local) for local in range(max(k for _, k in slots))]
    assigned, rank = [], 0
    cross_next = [0] * len(cross_sizes)
    for host, count in slots:
        for local in range(count):
            assigned.append(Slot(host, rank, size, local, count, cross_next[local], cross_sizes[local]))
            cross_next[local] += 1
            rank += 1
    return assigned


def interface_of(address: str) -> str:
    """The network interface holding `address` (Gloo's HOROVOD_GLOO_IFACE)."""
    for _, name in socket.if_nameindex():
        try:
            if config.interface_address(name) == address:
                return name
        except ConfigError:
            continue
    raise ConfigError(f"no network interface of this machine has the address {address}; pass --host with one "
                      "of its addresses")


def hostname_problem(address: str) -> str | None:
    """Why Gloo may not reach this host's ranks from other hosts, or None: Horovod builds part of its Gloo contexts
    on the address this host's name resolves to, whatever HOROVOD_GLOO_IFACE says."""
    name = socket.gethostname()
    try:
        resolved = socket.gethostbyname(name)
    except OSError as e:
        return f"this host's name {name!r} does not resolve ({e})"
    if resolved != address:
        return f"this host's name {name!r} resolves to {resolved}, not to --host {address}"
    return None


def local_slots(slots: Sequence[tuple[str, int]], host: str, names: Sequence[str], local_workers: int
                ) -> list[Slot]:
    """This host's slots: the plan's entry whose address is `host` (or one of `names`, as given on the command
    line). ConfigError when the plan does not match this host's share."""
    mine = [s for s in assign(slots) if s.host == host or s.host in names]
    if len(mine) != local_workers:
        plan = ",".join(f"{h}:{k}" for h, k in slots)
        raise ConfigError(f"--slots {plan} gives this host ({host}) {len(mine)} workers but it starts "
                          f"{local_workers} (--local-workers): list this host's address with its worker count")
    return mine


# Inherited variables that would turn a Horovod rank into something else: ps-lite's and p3kv's roles.
def _is_foreign(key: str) -> bool:
    return key.startswith("DMLC_") or (key.startswith("P3_") and key != "P3_LOG_LEVEL")


def worker_environment(base: Mapping[str, str], slot: Slot, rendezvous: str, port: int, interface: str
                       ) -> dict[str, str]:
    """What horovodrun's Gloo launcher gives a rank, on top of `base` (without parameter-server variables)."""
    env = {k: v for k, v in base.items() if not _is_foreign(k)}
    env.update({
        "HOROVOD_HOSTNAME": slot.host, "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": interface,
    })
    return env


def rendezvous_command(host: str, port: int, slots: Sequence[tuple[str, int]]) -> tuple[str, ...]:
    return (sys.executable, "-m", "p3kv.launch.rendezvous", "--host", host, "--port", str(port), "--slots",
            ",".join(f"{h}:{k}" for h, k in slots))


def plan(job: Job, host: str, port: int, base: Mapping[str, str]) -> list[ProcessSpec]:
    """This host's processes of a Horovod job: the rendezvous where the scheduler would run (a companion
    service: stopped once the workers here are done), then one rank per local worker."""
    if job.scheduler and job.scheduler_command is None and importlib.util.find_spec("horovod") is None:
        raise ConfigError(f"--kvstore horovod: Horovod is not installed for {sys.executable}; {INSTALL_HINT}")
    slots = job.slots or ((host, job.num_workers),)
    workers = job.num_workers if job.local_workers is None else job.local_workers
    mine = local_slots(slots, host, (job.host,), workers)
    specs = []
    if job.scheduler:
        argv = job.scheduler_command or rendezvous_command(host, port, slots)
        env = {k: v for k, v in base.items() if not _is_foreign(k)}
        specs.append(ProcessSpec("rendezvous", argv, env, "rendezvous", primary=False, companion=True))
    interface = interface_of(host)
    problem = hostname_problem(host) if job.spans_hosts and mine else None
    if problem:
        LOG.warning("%s: Horovod's Gloo connects ranks through the address a host's name resolves to, so ranks on "
                    "other hosts may fail to reach these; map the name to %s (e.g. in /etc/hosts)", problem, host)
    specs += [ProcessSpec(f"worker {i}", job.command, worker_environment(base, slot, job.root or host, port,
                                                                          interface), f"worker{i}", primary=True)
              for i, slot in enumerate(mine)]
    if not specs:
        raise ConfigError("nothing to run on this host: --no-scheduler with --local-workers 0")
    return specs
