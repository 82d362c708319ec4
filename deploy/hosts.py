"""The hosts file: which machines a deployment uses, how to reach them, and what each one runs.

One host per line, ``[user@]host[:sshport]`` followed by optional ``key=value`` words; ``#`` starts a comment::

    # head node: runs the scheduler (the first host always does)
    ubuntu@10.0.0.1 interface=eth0 gpus=0,1
    ubuntu@10.0.0.2:2222 interface=eth0 gpus=0,1 workers=1 servers=1

Keys (all optional):

- ``interface``: the network interface the job uses (its IPv4 address is where this host's processes listen;
  ``fab bandwidth`` caps it). Default: the interface holding ``address``.
- ``address``: the IPv4 address of this host on the cluster network, when the SSH name resolves elsewhere.
  Default: the interface's address if ``interface`` is given, else ``host``.
- ``gpus``: GPU ids the host's workers may use (``CUDA_VISIBLE_DEVICES``), e.g. ``0,1``.
- ``workers``, ``servers``: how many workers and servers this host runs (default: the launch options).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re

DEFAULT_SSH_PORT = 22
KEYS = ("interface", "address", "gpus", "workers", "servers")
_TARGET = re.compile(r"^(?:(?P<user>[^@\s:]+)@)?(?P<host>[A-Za-z0-9._-]+)(?::(?P<port>\d+))?$")
_INTERFACE = re.compile(r"^[A-Za-z0-9._@-]{1,15}$")


class HostsFileError(ValueError):
    """The hosts file cannot be used; the message names the file, the line and what to write instead."""


@dataclasses.dataclass(frozen=True)
class Host:
    """One machine of the cluster, as written in the hosts file."""

    hostname: str
    user: str | None = None
    port: int = DEFAULT_SSH_PORT
    interface: str | None = None
    address: str | None = None
    gpus: tuple[int, ...] = ()
    workers: int | None = None
    servers: int | None = None

    @property
    def label(self) -> str:
        """How messages, output prefixes and log folders name this host (unique within a hosts file)."""
        return self.hostname if self.port == DEFAULT_SSH_PORT else f"{self.hostname}:{self.port}"

    @property
    def login(self) -> str:
        """``user@host`` (or ``host``) as ssh takes it, for messages."""
        return f"{self.user}@{self.hostname}" if self.user else self.hostname


def _count(key: str, value: str, where: str) -> int:
    if not value.isdigit():
        raise HostsFileError(f"{where}: {key}={value!r} must be a count (0, 1, 2, ...)")
    return int(value)


def _gpus(value: str, where: str) -> tuple[int, ...]:
    if value in ("", "none"):
        return ()
    parts = value.split(",")
    if not all(p.isdigit() for p in parts):
        raise HostsFileError(f"{where}: gpus={value!r} must be GPU ids separated by commas, e.g. gpus=0,1")
    return tuple(int(p) for p in parts)


def parse_line(line: str, where: str = "hosts file") -> Host | None:
    """The Host a line describes, or None for a blank or comment line. `where` prefixes error messages."""
    words = line.split("#", 1)[0].split()
    if not words:
        return None
    match = _TARGET.match(words[0])
    if not match:
        raise HostsFileError(f"{where}: {words[0]!r} is not [user@]host[:sshport] (e.g. ubuntu@10.0.0.1:22)")
    port = int(match.group("port") or DEFAULT_SSH_PORT)
    if not 0 < port < 65536:
        raise HostsFileError(f"{where}: SSH port {port} is not a TCP port (1-65535)")
    settings: dict[str, object] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep or key not in KEYS:
            raise HostsFileError(f"{where}: {word!r} is not a setting; use key=value with a key among "
                                 f"{', '.join(KEYS)}")
        if key in settings:
            raise HostsFileError(f"{where}: {key} is given twice")
        if key == "interface":
            if not _INTERFACE.match(value):
                raise HostsFileError(f"{where}: interface={value!r} is not an interface name (e.g. eth0)")
            settings[key] = value
        elif key == "address":
            try:
                settings[key] = str(ipaddress.IPv4Address(value))
            except ValueError:
                raise HostsFileError(f"{where}: address={value!r} is not an IPv4 address") from None
        elif key == "gpus":
            settings[key] = _gpus(value, where)
        else:
            settings[key] = _count(key, value, where)
    return Host(hostname=match.group("host"), user=match.group("user"), port=port, **settings)  # type: ignore[arg-type]


def parse_hosts(text: str, source: str = "hosts file") -> list[Host]:
    """Every host of a hosts file's text, in order; HostsFileError for a malformed line, a host given twice or
    no host at all."""
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        host = parse_line(line, f"{source}, line {number}")
        if host is None:
            continue
        if host.label in seen:
            raise HostsFileError(f"{source}, line {number}: {host.label} is already on line {seen[host.label]}")
        seen[host.label] = number
        hosts.append(host)
    if not hosts:
        raise HostsFileError(f"{source} lists no host: write one [user@]host[:sshport] per line "
                             "(see hosts.example)")
    return hosts


def read_hosts_file(path: str) -> list[Host]:
    """`parse_hosts` of the file at `path`; HostsFileError if it cannot be read."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise HostsFileError(f"cannot read the hosts file {path} ({e.strerror}): copy hosts.example to {path} "
                             "and list your machines there, or pass --hosts-file") from None
    return parse_hosts(text, path)
