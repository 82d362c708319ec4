"""The hosts' network: each host's address and interface, and `fab bandwidth` (an egress cap with tc).

A cap is a tbf qdisc at the root of the host's interface (the same parameters as the emulated cluster's links,
`tbf_args` in benchmarks/emulation/emulated_cluster.py): it limits what the host sends. Setting it on every host caps
both directions of every host-to-host transfer. `tc` needs root on the hosts.
"""

from __future__ import annotations

import ipaddress
import logging
import shlex
from collections.abc import Sequence

from deploy.hosts import Host
from deploy.remote import ConnectionFactory, HostError, Session

LOG = logging.getLogger("p3kv.deploy")


def _emulated_cluster():
    """benchmarks/emulation/emulated_cluster.py, for its rate parser and tbf parameters."""
    from benchmarks.emulation import emulated_cluster

    return emulated_cluster


def interfaces(session: Session, host: Host) -> dict[str, list[str]]:
    """{interface: its IPv4 addresses} on `host` (interfaces without IPv4 are left out)."""
    out = session.run(host, "ip -o -4 addr show", "listing network interfaces (ip -o -4 addr show)",
                      "install iproute2 there")
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet":
            found.setdefault(parts[1], []).append(parts[3].split("/")[0])
    return found


def _resolve(session: Session, host: Host, name: str) -> str:
    """`name` as an IPv4 address, resolved on `host` itself."""
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        pass
    out = session.run(host, f"getent ahostsv4 {shlex.quote(name)}", f"resolving {name}",
                      "give the host's address on the cluster network with address= in the hosts file")
    return out.split()[0]


def address_and_interface(session: Session, host: Host) -> tuple[str, str | None]:
    """(address the host's processes use, the interface holding it or None). HostError if the hosts file names
    an interface the host does not have."""
    found = interfaces(session, host)
    have = ", ".join(f"{name} ({' '.join(addrs)})" for name, addrs in found.items()) or "none with IPv4"
    if host.interface:
        if host.interface not in found:
            raise HostError(host, f"has no network interface {host.interface!r} with an IPv4 address (it has: "
                            f"{have}); fix interface= in the hosts file")
        return host.address or found[host.interface][0], host.interface
    address = host.address or _resolve(session, host, host.hostname)
    holding = [name for name, addrs in found.items() if address in addrs]
    return address, holding[0] if holding else None


def _interface(session: Session, host: Host) -> str:
    address, interface = address_and_interface(session, host)
    if interface is None:
        raise HostError(host, f"cannot tell which interface carries {address} (no interface holds it); add "
                        "interface=NAME to this host's line in the hosts file")
    return interface


def _tc(session: Session, host: Host, args: str, what: str) -> str:
    return session.run(host, f"tc {args}", what, "tc needs root and iproute2 on the host: log in as root (user "
                       "root@ in the hosts file) or run it there with sudo")


def bandwidth(hosts: Sequence[Host], connect: ConnectionFactory, *, rate: str | None = None, clear: bool = False
              ) -> dict[str, str]:
    """Caps each host's egress at `rate` (e.g. "10gbit"), or with `clear` removes the cap; with neither, only
    shows. {label: `tc qdisc show` of its interface afterwards}. Raises DeployError naming failed hosts."""
    if rate is not None and clear:
        raise ValueError("give a rate or --clear, not both")
    tbf = None
    if rate is not None:
        cluster = _emulated_cluster()
        tbf = cluster.tbf_args(cluster.parse_rate(rate))

    def apply(host: Host) -> str:
        dev = shlex.quote(_interface(session, host))
        if tbf is not None:
            _tc(session, host, f"qdisc replace dev {dev} root {' '.join(tbf)}", f"capping {dev} at {rate}")
            LOG.info("%s: %s capped at %s", host.label, dev, rate)
        elif clear:
            current = _tc(session, host, f"qdisc show dev {dev} root", f"reading the qdisc of {dev}")
            if "tbf" in current.split():
                _tc(session, host, f"qdisc del dev {dev} root", f"removing the cap on {dev}")
                LOG.info("%s: cap on %s removed", host.label, dev)
        return f"{dev}: " + _tc(session, host, f"qdisc show dev {dev}", f"showing the qdisc of {dev}").strip()

    with Session(hosts, connect) as session:
        return session.each(apply, "bandwidth")
